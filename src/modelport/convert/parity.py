"""Numerical parity between reference outputs and a candidate's outputs.

One comparator serves the CLI, the optimisation pipeline's pass gate and the tests. An output
passes when it has the reference's shape, holds no NaN/Inf the reference does not, every element
satisfies |a - r| <= atol + rtol * |r|, and the cosine similarity is at least `min_cosine`.
There is no "passed with a warning".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from modelport.errors import ValidationError


@dataclass(frozen=True)
class Tolerance:
    atol: float = 1e-4
    rtol: float = 1e-3
    min_cosine: float = 0.999

    def to_dict(self) -> dict:
        return asdict(self)


# Defaults per precision of the candidate: quantised models are judged mostly on cosine.
DEFAULT_TOLERANCES = {
    "fp32": Tolerance(1e-4, 1e-3, 0.999),
    "fp16": Tolerance(1e-2, 1e-2, 0.999),
    "int8": Tolerance(float("inf"), float("inf"), 0.98),
}


@dataclass
class OutputParity:
    name: str
    shape_ok: bool
    max_abs: float
    max_rel: float
    cosine: float
    nan: int
    inf: int
    ok: bool
    reason: str = ""

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in asdict(self).items()}


@dataclass
class ParityResult:
    hop: str
    tolerance: Tolerance
    outputs: list[OutputParity] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def worst(self) -> OutputParity | None:
        bad = [o for o in self.outputs if not o.ok]
        return bad[0] if bad else None

    def summary(self) -> str:
        parts = [f"{o.name}: max_abs={o.max_abs:.3g} max_rel={o.max_rel:.3g} cos={o.cosine:.6f}" + ("" if o.ok else f" FAIL ({o.reason})") for o in self.outputs]
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {
            "hop": self.hop,
            "ok": self.ok,
            "tolerance": {k: (None if not np.isfinite(v) else v) for k, v in self.tolerance.to_dict().items()},
            "outputs": [o.to_dict() for o in self.outputs],
        }

    def raise_if_failed(self, path=None) -> None:
        if not self.ok:
            raise ValidationError(f"parity failed for {self.hop}: {self.summary()}", path=path, parity=self.to_dict())


def compare_arrays(name: str, ref: np.ndarray, act: np.ndarray, tol: Tolerance) -> OutputParity:
    ref = np.asarray(ref)
    act = np.asarray(act)
    if ref.shape != act.shape:
        if ref.size == act.size:
            act = act.reshape(ref.shape)
        else:
            return OutputParity(name, False, float("inf"), float("inf"), 0.0, 0, 0, False, f"shape {act.shape} != reference {ref.shape}")
    if ref.dtype == np.bool_ or act.dtype == np.bool_:
        ref, act = ref.astype(np.float64), act.astype(np.float64)
    r = ref.astype(np.float64)
    a = act.astype(np.float64)
    nan = int(np.sum(np.isnan(a) & ~np.isnan(r)))
    inf = int(np.sum(np.isinf(a) & ~np.isinf(r)))
    finite = np.isfinite(a) & np.isfinite(r)
    diff = np.abs(a - r)
    if r.size == 0:
        return OutputParity(name, True, 0.0, 0.0, 1.0, 0, 0, True)
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    rel = diff[finite] / np.maximum(np.abs(r[finite]), 1e-12)
    max_rel = float(rel.max()) if rel.size else 0.0
    ra, aa = np.where(finite, r, 0).ravel(), np.where(finite, a, 0).ravel()
    denom = float(np.linalg.norm(ra) * np.linalg.norm(aa))
    if denom == 0.0:
        cosine = 1.0 if float(np.linalg.norm(ra - aa)) == 0.0 else 0.0
    else:
        cosine = float(np.dot(ra, aa) / denom)
    reasons = []
    if nan or inf:
        reasons.append(f"{nan} NaN, {inf} Inf")
    # An infinite rtol means "no element-wise bound" (inf * 0 would be NaN and fail everything).
    bound = tol.atol + (tol.rtol * np.abs(r[finite]) if np.isfinite(tol.rtol) else np.inf)
    within = diff[finite] <= bound
    if not np.all(within):
        reasons.append(f"{int((~within).sum())} elements outside atol={tol.atol:g} rtol={tol.rtol:g}")
    if cosine < tol.min_cosine:
        reasons.append(f"cosine {cosine:.6f} < {tol.min_cosine}")
    return OutputParity(name, True, max_abs, max_rel, cosine, nan, inf, not reasons, "; ".join(reasons))


def compare(reference: dict[str, np.ndarray], actual: dict[str, np.ndarray], tol: Tolerance, *, hop: str) -> ParityResult:
    """Compare outputs by name; when names differ, fall back to position (same count required)."""
    result = ParityResult(hop=hop, tolerance=tol)
    if set(reference) <= set(actual):
        pairs = [(n, reference[n], actual[n]) for n in reference]
    else:
        if len(reference) != len(actual):
            result.outputs.append(OutputParity("*", False, float("inf"), float("inf"), 0.0, 0, 0, False, f"{len(actual)} outputs, reference has {len(reference)}"))
            return result
        pairs = [(n, r, a) for (n, r), a in zip(reference.items(), actual.values(), strict=True)]
    for name, r, a in pairs:
        result.outputs.append(compare_arrays(name, r, a, tol))
    return result
