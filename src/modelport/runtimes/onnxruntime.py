"""onnxruntime runner (CPU by default), for ONNX models (objects or files) and ORT-format files."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError
from modelport.ir import TensorSpec, contract_from_onnx

# onnxruntime's type strings -> numpy dtype names (an ORT-format file's inputs)
ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64", "tensor(int32)": "int32",
             "tensor(bool)": "bool", "tensor(double)": "float64"}


SESSION_FROM_FILE_BYTES = 256 << 20  # models with this much tensor data reach onnxruntime through a file


class OnnxRuntimeRunner:
    name = "onnxruntime"

    def __init__(self, model, *, providers: list[str] | None = None, optimize: bool = True, threads: int | None = None,
                 spinning: bool = True):
        """`spinning=False`: the intra-op threads sleep as soon as a run ends. For timing several
        sessions interleaved: with spinning, the threads of the session timed just before keep the
        cores busy while the next one runs (see `optimize/auto.py`)."""
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # errors reach the caller as exceptions (one line each); onnxruntime's own logger would
        # print them again, in colour, on stderr
        opts.log_severity_level = 4
        if not optimize:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        if not spinning:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.providers = providers or ["CPUExecutionProvider"]
        self._tmp = None
        self.path = Path(model) if isinstance(model, (str, Path)) else None
        self.model = None if self.path else model  # the ONNX model, when given as one
        if self.path:
            source = str(model)
        else:
            from modelport.onnx_io import protobuf_limit, save_onnx, tensor_bytes

            # a large model is handed over as a file with external data: serialised, it would be held
            # once more as bytes and once more by onnxruntime's parse of them (a 0.9 GB encoder's
            # session: 5.6 GB at its peak from bytes)
            if tensor_bytes(model) + (1 << 20) > min(protobuf_limit(), SESSION_FROM_FILE_BYTES):
                self._tmp = tempfile.TemporaryDirectory(prefix="modelport-ort-")
                path = Path(self._tmp.name) / "model.onnx"
                save_onnx(model, path, external=True)
                source = str(path)
            else:
                source = model.SerializeToString()
        try:
            self.session = ort.InferenceSession(source, opts, providers=self.providers)
        except Exception as e:  # onnxruntime raises its own exception types
            raise BadInputError(f"onnxruntime cannot load the model: {str(e).splitlines()[0]}") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._run_options = ort.RunOptions()
        self._run_options.log_severity_level = 4

    def input_specs(self) -> list[TensorSpec]:
        """The inputs, dynamic dims symbolic: from the ONNX graph and the contract a modelport-written
        file keeps (value ranges of token ids), or from the session for an ORT-format file."""
        model = self.model
        if model is None and self.path.suffix.lower() == ".onnx":
            from modelport.onnx_io import load_onnx

            model = load_onnx(self.path, weights=False)
        if model is not None:
            return contract_from_onnx(model)[0]
        return [TensorSpec(i.name, ORT_TYPES.get(i.type, "float32"),
                           [d if isinstance(d, int) else f"{i.name}_dim{k}" for k, d in enumerate(i.shape)])
                for i in self.session.get_inputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BadInputError(f"missing inputs {missing}; the model expects {self.input_names}")
        outs = self.session.run(self.output_names, {n: feeds[n] for n in self.input_names}, self._run_options)
        return dict(zip(self.output_names, outs, strict=True))


def open_onnx_file(path: str | Path, **options) -> OnnxRuntimeRunner:
    """A user's `.onnx` file: loaded with its external data checked, its IR version lowered to what
    this onnxruntime reads, then run like any ONNX model."""
    from modelport.onnx_io import fit_ir_version, load_onnx

    model = load_onnx(path)
    fit_ir_version(model)
    return OnnxRuntimeRunner(model, **options)
