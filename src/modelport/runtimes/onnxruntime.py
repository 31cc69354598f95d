"""onnxruntime runner (CPU by default), for ONNX models (objects or files) and ORT-format files, and
an ONNX model run with its intermediate tensors exposed.

The latter re-runs the model with intermediate tensors exposed as extra graph outputs, a bounded
batch of tensors at a time, in the graph's topological order. Batches are bounded in bytes, not
just in count, so a large model never holds more than about `max_bytes` of exposed activations
at once. Each tensor's size is estimated before running: shape inference on a skeleton of the
model (large initializers declared as inputs, so it works over the protobuf limit) whose graph
inputs take the feeds' concrete shapes. A tensor whose shape stays unknown (data-dependent, or
inference failed) is counted at the largest size known, feeds included. Tensors are packed in
order into batches whose estimated total stays within `max_bytes` (and at most `batch` tensors);
a single tensor over the budget runs alone. `validation.localize` (divergence, magnitudes) and
the runner's `localize` ability are built on these.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError, one_line
from modelport.ir import TensorSpec, contract_from_onnx
from modelport.onnxfile.ir_version_fit import fit_ir_version
from modelport.onnxfile.onnx_io import load_onnx, save_onnx
from modelport.onnxfile.tensor_sizes import protobuf_limit, tensor_bytes
from modelport.runtimes.base import Capabilities, Runner

# onnxruntime's type strings -> numpy dtype names (an ORT-format file's inputs)
ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64", "tensor(int32)": "int32",
             "tensor(bool)": "bool", "tensor(double)": "float64"}


FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16
DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_BATCH = 32
_INLINE_INITIALIZER_BYTES = 1 << 16  # larger initializers become typed inputs of the skeleton
SESSION_FROM_FILE_BYTES = 256 << 20  # models with this much tensor data reach onnxruntime through a file


class OnnxRuntimeRunner(Runner):
    """An ONNX model (or ORT-format file) in an onnxruntime session. It localizes (runtimes/base.py)
    where it has the ONNX graph: not for an ORT-format file."""

    name = "onnxruntime"
    imports = ("onnxruntime", "onnx")
    capabilities = Capabilities(localize=True)

    @classmethod
    def open(cls, path, *, threads: int | None = None) -> OnnxRuntimeRunner:
        return open_onnx_file(path, threads=threads) if Path(path).suffix.lower() == ".onnx" else cls(path, threads=threads)

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
            raise BadInputError(f"onnxruntime cannot load the model: {one_line(e)}") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._run_options = ort.RunOptions()
        self._run_options.log_severity_level = 4
        if self.path is not None and self.path.suffix.lower() != ".onnx":
            self.capabilities = Capabilities(localize=False)

    def input_specs(self) -> list[TensorSpec]:
        """The inputs, dynamic dims symbolic: from the ONNX graph and the contract a modelport-written
        file keeps (value ranges of token ids), or from the session for an ORT-format file."""
        model = self.model
        if model is None and self.path.suffix.lower() == ".onnx":

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

    def _graph(self):
        if self.model is None:

            self.model = load_onnx(self.path)
            fit_ir_version(self.model)
        return self.model

    def tensor_order(self) -> list[tuple[str, str, str]]:
        return float_tensors(self._graph())

    def tensor_values(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        values: dict[str, np.ndarray] = {}
        for chunk in run_tensors(self._graph(), feeds, names):
            values.update(chunk)
        return values


def open_onnx_file(path: str | Path, **options) -> OnnxRuntimeRunner:
    """A user's `.onnx` file: loaded with its external data checked, its IR version lowered to what
    this onnxruntime reads, then run like any ONNX model."""

    model = load_onnx(path)
    fit_ir_version(model)
    return OnnxRuntimeRunner(model, **options)


def float_tensors(model) -> list[tuple[str, str, str]]:
    """(tensor, producing node name, op type) for node outputs that are floats, in graph order.

    Types come from shape inference where it knows them; unknown types are kept (and checked).
    """
    import onnx

    from modelport.onnxfile.tensor_sizes import is_large

    types: dict[str, int] = {}
    if not is_large(model):
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
            for v in (*inferred.graph.value_info, *inferred.graph.output):
                types[v.name] = v.type.tensor_type.elem_type
        except Exception:
            pass
    out = []
    for n in model.graph.node:
        for t in n.output:
            if t and types.get(t, 1) in FLOAT_TYPES | {0}:
                out.append((t, n.name, n.op_type))
    return out


def _with_outputs(model, names: list[str]):
    """A shallow variant of `model` whose graph outputs are `names` (untyped value infos)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    for name in names:
        m.graph.output.add().name = name
    return m


def _skeleton(model, feeds):
    """A weightless copy of `model` for shape inference: big initializers become typed graph inputs
    and graph inputs take the concrete shapes of `feeds`."""
    import onnx
    from onnx import helper

    g = model.graph
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    sg = m.graph
    sg.name = g.name
    sg.node.extend(g.node)
    for v in g.output:  # declared output shapes may be symbolic: let inference fill them in
        sg.output.add().name = v.name
    declared = {v.name for v in g.input}
    for v in g.input:
        value = sg.input.add()
        value.CopyFrom(v)
        if v.name in feeds:
            shape = value.type.tensor_type.shape
            shape.ClearField("dim")
            for d in np.shape(feeds[v.name]):
                shape.dim.add().dim_value = int(d)
    for t in g.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL or _initializer_bytes(t) > _INLINE_INITIALIZER_BYTES:
            if t.name not in declared:
                sg.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            sg.initializer.append(t)
    sg.sparse_initializer.extend(g.sparse_initializer)
    return m


def _itemsize(elem_type: int) -> int:
    """Bytes per element of an ONNX tensor type (8, the widest, when numpy has no such type)."""
    from onnx import helper

    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 8


def _initializer_bytes(t) -> int:
    return int(np.prod(t.dims, dtype=np.int64)) * _itemsize(t.data_type)


def _nbytes(value) -> int | None:
    """Bytes of a tensor value info, or None when its type or a dim is unknown."""
    tt = value.type.tensor_type
    if not tt.elem_type or not tt.HasField("shape"):
        return None
    itemsize = _itemsize(tt.elem_type)
    n = 1
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return None
        n *= d.dim_value
    return n * itemsize


def tensor_sizes(model, feeds, names: list[str]) -> dict[str, int]:
    """Estimated bytes of each tensor in `names` when `model` runs on `feeds`.

    Shapes come from shape inference with the feeds' shapes; a tensor whose size stays unknown is
    counted at the largest size known (the feeds' included), so the estimate errs on the large side.
    """
    import onnx

    known: dict[str, int] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(_skeleton(model, feeds), strict_mode=False, data_prop=True)
        for v in (*inferred.graph.value_info, *inferred.graph.output):
            size = _nbytes(v)
            if size is not None:
                known[v.name] = size
    except Exception:
        pass  # shape inference is best effort; every size falls back below
    fallback = max([np.asarray(v).nbytes for v in feeds.values()] + [known[n] for n in names if n in known] + [1])
    return {n: known.get(n, fallback) for n in names}


def plan_batches(sizes: list[int], max_bytes: int | None = DEFAULT_MAX_BYTES, *,
                 batch: int | None = DEFAULT_BATCH) -> list[list[int]]:
    """Indices into `sizes`, packed in order into batches of at most `batch` items whose sizes sum
    to at most `max_bytes` (None: no bound); an item larger than `max_bytes` makes a batch alone."""
    if batch is not None and batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    out: list[list[int]] = []
    total = 0
    for i, size in enumerate(sizes):
        count_full = bool(out) and batch is not None and len(out[-1]) >= batch
        bytes_full = bool(out) and max_bytes is not None and total + size > max_bytes
        if not out or count_full or bytes_full:
            out.append([])
            total = 0
        out[-1].append(i)
        total += size
    return out


def run_outputs(model, feeds, names: list[str]) -> dict[str, np.ndarray]:
    return OnnxRuntimeRunner(_with_outputs(model, names), optimize=False).run(feeds)


def run_tensors(model, feeds, names: list[str], *, batch: int | None = DEFAULT_BATCH,
                max_bytes: int | None = DEFAULT_MAX_BYTES) -> Iterator[dict[str, np.ndarray]]:
    """Yield {tensor: value} for `names`, one onnxruntime session per batch: at most `batch`
    tensors and an estimated `max_bytes` of values (see `plan_batches`), in the order given."""
    sizes = tensor_sizes(model, feeds, names) if max_bytes is not None else {}
    for idx in plan_batches([sizes.get(n, 0) for n in names], max_bytes, batch=batch):
        yield run_outputs(model, feeds, [names[i] for i in idx])
