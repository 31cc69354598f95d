"""Numerical parity between reference outputs and a candidate's outputs.

One comparator serves the CLI, the optimisation pipeline's pass gate and the tests. An output
passes when it has the reference's name and shape, holds no NaN/Inf the reference does not, every
element satisfies |a - r| <= atol * s + rtol * |r|, and the cosine similarity is at least
`min_cosine`. There is no "passed with a warning", and no fix-up a user of the artifact does not
get: a candidate output under another name or in another shape fails.

`s = max(1, max|r|)` over the output's finite reference values (the scale of the output). Float
reordering (a fused kernel, another summation order) moves every element by about machine
epsilon times the magnitude of what was summed, so an element near zero inside an output whose
values reach the thousands carries an error of that output's scale, not of its own: a fixed atol
(numpy's and torch's `allclose` rule) then fails correct conversions of large-magnitude outputs.
For outputs within [-1, 1] the rule is the plain one. A `Tolerance` with `scaled=False` (an
accuracy budget such as `max_abs<=0.01`) is an absolute bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from modelport.errors import ValidationError
from modelport.validation.tolerance import KEYS, Tolerance, finite_or_none


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
    tolerance: dict | None = None  # what this output was judged with: atol, rtol, min_cosine, scale, atol_effective

    def to_dict(self) -> dict:
        out = {k: finite_or_none(getattr(self, k)) for k in ("name", "shape_ok", "max_abs", "max_rel", "cosine", "nan", "inf", "ok", "reason")}
        if self.tolerance is not None:
            out["tolerance"] = {k: finite_or_none(v) for k, v in self.tolerance.items()}
        return out


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
            "tolerance": {k: (finite_or_none(float(v)) if k in KEYS else v) for k, v in self.tolerance.to_dict().items()},
            "outputs": [o.to_dict() for o in self.outputs],
        }

    def raise_if_failed(self, path=None) -> None:
        if not self.ok:
            raise ValidationError(f"parity failed for {self.hop}: {self.summary()}", path=path, parity=self.to_dict())


def _failed(name: str, reason: str) -> OutputParity:
    return OutputParity(name, False, float("inf"), float("inf"), 0.0, 0, 0, False, reason)


def compare_arrays(name: str, ref: np.ndarray, act: np.ndarray, tol: Tolerance) -> OutputParity:
    ref = np.asarray(ref)
    act = np.asarray(act)
    tol = tol.for_output(name)
    if ref.shape != act.shape:
        return _failed(name, f"shape {list(act.shape)} != reference {list(ref.shape)}")
    if ref.dtype == np.bool_ or act.dtype == np.bool_:
        ref, act = ref.astype(np.float64), act.astype(np.float64)
    r = ref.astype(np.float64)
    a = act.astype(np.float64)
    nan = int(np.sum(np.isnan(a) & ~np.isnan(r)))
    inf = int(np.sum(np.isinf(a) & ~np.isinf(r)))
    finite = np.isfinite(a) & np.isfinite(r)
    diff = np.abs(a - r)
    if r.size == 0:
        return OutputParity(name, True, 0.0, 0.0, 1.0, 0, 0, True, tolerance=_applied(tol, 1.0))
    finite_ref = np.abs(r[np.isfinite(r)])
    scale = max(1.0, float(finite_ref.max())) if tol.scaled and finite_ref.size else 1.0
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    rel = diff[finite] / np.maximum(np.abs(r[finite]), 1e-12)
    max_rel = float(rel.max()) if rel.size else 0.0
    ra, aa = np.where(finite, r, 0).ravel(), np.where(finite, a, 0).ravel()
    denom = float(np.linalg.norm(ra) * np.linalg.norm(aa))
    if not np.any(ra != aa):
        cosine = 1.0  # identical values: the quotient below can round to just under 1
    elif denom == 0.0:
        cosine = 0.0
    else:
        cosine = min(1.0, float(np.dot(ra, aa) / denom))
    reasons = []
    if nan or inf:
        reasons.append(f"{nan} NaN, {inf} Inf")
    # An infinite rtol means "no element-wise bound" (inf * 0 would be NaN and fail everything).
    atol = tol.atol * scale
    bound = atol + (tol.rtol * np.abs(r[finite]) if np.isfinite(tol.rtol) else np.inf)
    within = diff[finite] <= bound
    if not np.all(within):
        at = f"atol={tol.atol:g}" + (f"x{scale:.4g}" if scale != 1.0 else "")
        reasons.append(f"{int((~within).sum())} elements outside {at} rtol={tol.rtol:g}")
    if cosine < tol.min_cosine:
        reasons.append(f"cosine {cosine:.6f} < {tol.min_cosine}")
    return OutputParity(name, True, max_abs, max_rel, cosine, nan, inf, not reasons, "; ".join(reasons),
                        tolerance=_applied(tol, scale))


def _applied(tol: Tolerance, scale: float) -> dict:
    return {"atol": tol.atol, "rtol": tol.rtol, "min_cosine": tol.min_cosine, "scale": scale, "atol_effective": tol.atol * scale}


def compare(reference: dict[str, np.ndarray], actual: dict[str, np.ndarray], tol: Tolerance, *, hop: str,
            by_position: bool = False) -> ParityResult:
    """Compare outputs by name: a candidate must give every reference output under its name.

    `by_position` pairs outputs in order instead (same count required): for `validate A B` on two
    different models whose outputs are named differently, and only when the user asks for it.
    """
    result = ParityResult(hop=hop, tolerance=tol)
    if by_position:
        if len(reference) != len(actual):
            result.outputs.append(_failed("*", f"{len(actual)} outputs, reference has {len(reference)}"))
            return result
        pairs = [(n, r, a) for (n, r), a in zip(reference.items(), actual.values(), strict=True)]
    else:
        missing = [n for n in reference if n not in actual]
        if missing:
            extra = [n for n in actual if n not in reference]
            result.outputs.append(_failed("*", f"outputs {missing} missing; the candidate gives {extra or list(actual)} instead"))
            return result
        pairs = [(n, reference[n], actual[n]) for n in reference]
    for name, r, a in pairs:
        result.outputs.append(compare_arrays(name, r, a, tol))
    return result


def check(runner, reference, tolerance: Tolerance, hop: str) -> ParityResult:
    """Run `runner` (anything with `run(feeds) -> outputs`) on the reference's inputs and compare its
    outputs with the reference's: the one way every stage proves a hop."""
    return compare(reference.outputs, runner.run(reference.inputs), tolerance, hop=hop)
