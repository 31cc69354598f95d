"""Localising a numeric divergence: which node first computes something the reference does not.

Both models are re-run with intermediate tensors exposed as extra graph outputs, a bounded batch
of tensors at a time (so a large model never holds all its activations at once), in the
reference graph's topological order; the first tensor whose candidate value breaks the
threshold names the node. The same machinery gives per-tensor magnitudes, which is how FP16
conversion finds the activations that would overflow (|x| > 65504) before converting.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16


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

    from modelport.optimize.model_tools import is_large

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


def run_tensors(model, feeds, names: list[str], *, batch: int = 32) -> Iterator[dict[str, np.ndarray]]:
    """Yield {tensor: value} for `names`, `batch` tensors per onnxruntime session."""
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    for i in range(0, len(names), batch):
        chunk = names[i:i + batch]
        runner = OnnxRuntimeRunner(_with_outputs(model, chunk), optimize=False)
        yield runner.run(feeds)
        del runner


def magnitudes(model, feeds, *, batch: int = 32) -> dict[str, float]:
    """Max |value| of every float node output on `feeds`."""
    tensors = float_tensors(model)
    out: dict[str, float] = {}
    for values in run_tensors(model, feeds, [t for t, _, _ in tensors], batch=batch):
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


def first_divergence(reference, candidate, feeds, *, threshold: float = 0.05, batch: int = 32,
                     skip: set[str] | None = None, worst_if_none: bool = False) -> Divergence | None:
    """The first node (in the reference's order) whose output differs by more than `threshold`.

    Only tensors present in both graphs are compared; nodes in `skip` are passed over (already
    handled by the caller). With `worst_if_none`, when no tensor passes the threshold the node
    with the largest error is returned instead (so a fallback loop always makes progress).
    """
    cand_names = {t for n in candidate.graph.node for t in n.output} | {o.name for o in candidate.graph.output}
    skip = skip or set()
    tensors = [(t, node, op) for t, node, op in float_tensors(reference) if t in cand_names and node not in skip]
    names = [t for t, _, _ in tensors]
    meta = {t: (node, op) for t, node, op in tensors}
    checked = 0
    worst: Divergence | None = None
    for i in range(0, len(names), batch):
        chunk = names[i:i + batch]
        ref_vals = next(run_tensors(reference, feeds, chunk, batch=len(chunk)))
        cand_vals = next(run_tensors(candidate, feeds, chunk, batch=len(chunk)))
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
