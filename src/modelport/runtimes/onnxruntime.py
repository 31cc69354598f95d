"""onnxruntime runner (CPU by default)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError


class OnnxRuntimeRunner:
    name = "onnxruntime"

    def __init__(self, model, *, providers: list[str] | None = None, optimize: bool = True, threads: int | None = None):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if not optimize:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        self.providers = providers or ["CPUExecutionProvider"]
        self._tmp = None
        if isinstance(model, (str, Path)):
            source = str(model)
        else:
            from modelport.onnx_io import protobuf_limit, save_onnx, tensor_bytes

            if tensor_bytes(model) + (1 << 20) > protobuf_limit():
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

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BadInputError(f"missing inputs {missing}; the model expects {self.input_names}")
        outs = self.session.run(self.output_names, {n: feeds[n] for n in self.input_names})
        return dict(zip(self.output_names, outs, strict=True))
