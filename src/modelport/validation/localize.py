"""Localising a numeric divergence: which node first computes something the reference does not.

Both models are re-run with intermediate tensors exposed as extra graph outputs, a bounded batch
of tensors at a time, in the reference graph's topological order (`runtimes/onnxruntime.py`);
the first tensor whose candidate value breaks the threshold names the node. The same machinery
gives per-tensor magnitudes, which is how FP16 conversion finds the activations that would
overflow (|x| > 65504) before converting. `localize_runners` does the same for any two runners
that declare the `localize` ability (onnxruntime and OpenVINO, in any pairing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelport.runtimes.onnxruntime import (
    DEFAULT_BATCH,
    DEFAULT_MAX_BYTES,
    float_tensors,
    plan_batches,
    run_outputs,
    run_tensors,
    tensor_sizes,
)


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
        ref_vals = run_outputs(reference, feeds, chunk)
        cand_vals = run_outputs(candidate, feeds, chunk)
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


def localize_runners(a, b, feeds, *, threshold: float = 0.05, batch: int = DEFAULT_BATCH) -> dict:
    """The first tensor (in A's order) both runners compute that differs by more than `threshold`
    (relative to its scale), as a report entry; both declare the `localize` ability
    (runtimes/base.py). The tensors are asked for `batch` at a time, so at most that many of each
    side are held at once."""
    names_b = {t for t, _, _ in b.tensor_order()}
    order = [(t, node, op) for t, node, op in a.tensor_order() if t in names_b]
    checked = 0
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        names = [t for t, _, _ in chunk]
        va, vb = a.tensor_values(feeds, names), b.tensor_values(feeds, names)
        for tensor, node, op in chunk:
            if tensor not in va or tensor not in vb:
                continue
            checked += 1
            err = tensor_error(va[tensor], vb[tensor])
            if err > threshold:
                return Divergence(node, op, tensor, err, checked).to_dict()
    return {"node": None, "note": f"none of the {checked} intermediate tensors both sides compute diverges; "
                                  "the difference is in the outputs only"}
