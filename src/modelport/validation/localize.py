"""Localising a numeric divergence: which node first computes something the reference does not.

Both models are re-run with intermediate tensors exposed as extra graph outputs, a bounded batch
of tensors at a time, in the reference graph's topological order; the first tensor whose
candidate value breaks the threshold names the node. The same machinery gives per-tensor
magnitudes, which is how FP16 conversion finds the activations that would overflow
(|x| > 65504) before converting.

Batches are bounded in bytes, not just in count, so a large model never holds more than about
`max_bytes` of exposed activations at once. Each tensor's size is estimated before running: shape
inference on a skeleton of the model (large initializers declared as inputs, so it works over
the protobuf limit) whose graph inputs take the feeds' concrete shapes. A tensor whose shape
stays unknown (data-dependent, or inference failed) is counted at the largest size known, feeds
included. Tensors are packed in order into batches whose estimated total stays within
`max_bytes` (and at most `batch` tensors); a single tensor over the budget runs alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16
DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_BATCH = 32
_INLINE_INITIALIZER_BYTES = 1 << 16  # larger initializers become typed inputs of the skeleton


@dataclass
class Divergence:
    node: str
    op_type: str
    tensor: str
    error: float  # max |c - r| / max |r|; inf when the candidate has NaN/Inf the reference has not
    checked: int  # tensors compared before (and including) this one

    def to_dict(self) -> dict:
        return {"node": self.node, "op_type": self.op_type, "tensor": self.tensor,
                "error": None if not np.isfinite(self.error) else self.error, "checked": self.checked}


def float_tensors(model) -> list[tuple[str, str, str]]:
    """(tensor, producing node name, op type) for node outputs that are floats, in graph order.

    Types come from shape inference where it knows them; unknown types are kept (and checked).
    """
    import onnx

    from modelport.onnx_io import is_large

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


def _run_outputs(model, feeds, names: list[str]) -> dict[str, np.ndarray]:
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    return OnnxRuntimeRunner(_with_outputs(model, names), optimize=False).run(feeds)


def run_tensors(model, feeds, names: list[str], *, batch: int | None = DEFAULT_BATCH,
                max_bytes: int | None = DEFAULT_MAX_BYTES) -> Iterator[dict[str, np.ndarray]]:
    """Yield {tensor: value} for `names`, one onnxruntime session per batch: at most `batch`
    tensors and an estimated `max_bytes` of values (see `plan_batches`), in the order given."""
    sizes = tensor_sizes(model, feeds, names) if max_bytes is not None else {}
    for idx in plan_batches([sizes.get(n, 0) for n in names], max_bytes, batch=batch):
        yield _run_outputs(model, feeds, [names[i] for i in idx])


def magnitudes(model, feeds, *, batch: int | None = DEFAULT_BATCH,
               max_bytes: int | None = DEFAULT_MAX_BYTES) -> dict[str, float]:
    """Max |value| of every float node output on `feeds`."""
    tensors = float_tensors(model)
    out: dict[str, float] = {}
    for values in run_tensors(model, feeds, [t for t, _, _ in tensors], batch=batch, max_bytes=max_bytes):
        for name, v in values.items():
            v = np.asarray(v)
            if v.size and np.issubdtype(v.dtype, np.floating):
                finite = np.abs(v[np.isfinite(v)])
                out[name] = float(finite.max()) if finite.size else float("inf")
    return out


def tensor_error(ref: np.ndarray, cand: np.ndarray) -> float:
    r = np.asarray(ref, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    if r.shape != c.shape:
        if r.size != c.size:
            return float("inf")
        c = c.reshape(r.shape)
    bad = (~np.isfinite(c)) & np.isfinite(r)
    if bad.any():
        return float("inf")
    ok = np.isfinite(r) & np.isfinite(c)
    if not ok.any():
        return 0.0
    scale = float(np.abs(r[ok]).max())
    return float(np.abs(c[ok] - r[ok]).max()) / max(scale, 1e-6)


def first_divergence(reference, candidate, feeds, *, threshold: float = 0.05, batch: int | None = DEFAULT_BATCH,
                     max_bytes: int | None = DEFAULT_MAX_BYTES, skip: set[str] | None = None,
                     worst_if_none: bool = False) -> Divergence | None:
    """The first node (in the reference's order) whose output differs by more than `threshold`.

    Only tensors present in both graphs are compared; nodes in `skip` are passed over (already
    handled by the caller). With `worst_if_none`, when no tensor passes the threshold the node
    with the largest error is returned instead (so a fallback loop always makes progress).
    Both models' values of a batch are held together, so each tensor counts twice against
    `max_bytes` (sizes estimated on the reference).
    """
    cand_names = {t for n in candidate.graph.node for t in n.output} | {o.name for o in candidate.graph.output}
    skip = skip or set()
    tensors = [(t, node, op) for t, node, op in float_tensors(reference) if t in cand_names and node not in skip]
    names = [t for t, _, _ in tensors]
    meta = {t: (node, op) for t, node, op in tensors}
    checked = 0
    worst: Divergence | None = None
    sizes = tensor_sizes(reference, feeds, names) if max_bytes is not None else {}
    for idx in plan_batches([2 * sizes.get(n, 0) for n in names], max_bytes, batch=batch):
        chunk = [names[i] for i in idx]
        ref_vals = _run_outputs(reference, feeds, chunk)
        cand_vals = _run_outputs(candidate, feeds, chunk)
        for name in chunk:
            checked += 1
            err = tensor_error(ref_vals[name], cand_vals[name])
            node, op = meta[name]
            if err > threshold:
                return Divergence(node, op, name, err, checked)
            if worst_if_none and err > 0 and (worst is None or err > worst.error):
                worst = Divergence(node, op, name, err, checked)
        del ref_vals, cand_vals
    return worst
