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
accuracy budget such as `max_abs<=0.01`) is an absolute bound. Cosine similarity is not judged
where the whole reference output lies within that absolute band of zero (an all-zero output on
digital silence; at most 1e-3 whatever the atol): the direction of a vector of rounding noise
says nothing.

A hop is judged on every sample set of the reference (`Reference.sets()`: several seeds and
scales, all-zeros, a constant, the extremes of the input range, the user's `--data`): each output's
figures are the worst over the sets, and the set they came from is named (`sample`), with one row
per set in `samples`.

A set on which the source's own answer is unstable cannot judge anything: where its outputs one
ulp away (`Sample.nudged`) miss the hop's tolerance against its outputs on the set, the set is
`ill-conditioned` for the hop (its row in `samples` names the measure). A miss there does not fail
the hop; NaN or Inf the reference lacks still does (no rounding makes a finite answer NaN), and an
output with no well-conditioned set to pass on fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from modelport.errors import ValidationError
from modelport.reference.sample_sets import SWEEP_KINDS
from modelport.validation.tolerance import KEYS, Tolerance, finite_or_none

# sample_sets.STRUCTURED_KINDS + sample_sets.SWEEP_KINDS
STRUCTURED = ("zeros", "constant", "low", "high", "grey", "grey-raw", "floor-db", "floor-log", "full-mantissa", "full-mantissa-large")
NEGLIGIBLE = 1e-3  # the largest |reference| whose direction is never judged (cosine), whatever the atol


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
    sample: str | None = None  # the sample set these figures come from (the worst one), when several were run

    def to_dict(self) -> dict:
        out = {k: finite_or_none(getattr(self, k)) for k in ("name", "shape_ok", "max_abs", "max_rel", "cosine", "nan", "inf", "ok", "reason")}
        if self.tolerance is not None:
            out["tolerance"] = {k: finite_or_none(v) for k, v in self.tolerance.items()}
        if self.sample is not None:
            out["sample"] = self.sample
        return out

    def brief(self) -> dict:
        return {k: finite_or_none(getattr(self, k)) for k in ("name", "max_abs", "cosine", "nan", "inf", "ok")}


@dataclass
class ParityResult:
    hop: str
    tolerance: Tolerance
    outputs: list[OutputParity] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)  # per sample set: kind, ok, each output's figures
    guessed: list[str] = field(default_factory=list)  # inputs whose sample values are a guess (Reference.guessed)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def worst(self) -> OutputParity | None:
        bad = [o for o in self.outputs if not o.ok]
        return bad[0] if bad else None

    def summary(self) -> str:
        parts = [f"{o.name}: max_abs={o.max_abs:.3g} max_rel={o.max_rel:.3g} cos={o.cosine:.6f}"
                 + (f" [{o.sample}]" if o.sample and len(self.samples) > 1 else "")
                 + ("" if o.ok else f" FAIL ({o.reason})") for o in self.outputs]
        return "; ".join(parts)

    def to_dict(self) -> dict:
        out = {
            "hop": self.hop,
            "ok": self.ok,
            "tolerance": {k: (finite_or_none(float(v)) if k in KEYS else v) for k, v in self.tolerance.to_dict().items()},
            "outputs": [o.to_dict() for o in self.outputs],
        }
        if self.samples:
            out["samples"] = self.samples
        return out

    def hint(self) -> str | None:
        """What to try when the hop failed: the structured sets it failed on, and the inputs whose
        sample values were a guess where it failed on a set that gave them random values."""
        failed = {o.sample for o in self.outputs if not o.ok}
        structured = sorted(k for k in failed if k in STRUCTURED)
        hints = [f"the {'/'.join(structured)} sample(s) are structured inputs (sample_sets.py): calibration data that covers "
                 "them, a wider tolerance, --range NAME=LOW,HIGH where an input never takes those values, or "
                 "--no-structured-samples to judge random samples only"] if structured else []
        if self.guessed and failed - set(STRUCTURED):
            hints.append(f"input(s) {', '.join(self.guessed)} got random integers (no declared range, and the graph does "
                         "not show their role): where those are not values they take, pin them with --value NAME=V or "
                         "--data inputs.npz (arrays keyed by input name)")
        return "; ".join(hints) or None

    def raise_if_failed(self, path=None) -> None:
        if not self.ok:
            raise ValidationError(f"parity failed for {self.hop}: {self.summary()}", path=path, parity=self.to_dict(),
                                  hint=self.hint())


def _failed(name: str, reason: str) -> OutputParity:
    return OutputParity(name, False, float("inf"), float("inf"), 0.0, 0, 0, False, reason)


COHERENT = 4  # how much larger a constant frame's sums run than random data's at the same magnitude (see amplitude)


def amplitude(sample) -> float:
    """The scale a sweep set's outputs' atol is multiplied by at least (`sample_sets.SWEEP_KINDS`):
    COHERENT x the magnitude its inputs were set to, else 1. Float rounding follows the magnitude of
    the values inside the network, which the outputs (normalised, saturated) need not show, and on a
    constant frame every term of a convolution's or a matmul's sum has one sign, where random
    data's terms cancel: measured on mediapipe's selfie segmenter fed constant frames from 15.9 to
    114, TFLite and onnxruntime differ by 1.5-2.4e-4 x the magnitude on a few sigmoid outputs
    (cosine 1.000000), twice what atol x the magnitude allowed."""

    if getattr(sample, "kind", None) not in SWEEP_KINDS:
        return 1.0
    values = [float(np.abs(v).max()) for v in sample.inputs.values() if np.issubdtype(np.asarray(v).dtype, np.floating) and np.size(v)]
    return COHERENT * max([1.0, *values])


def compare_arrays(name: str, ref: np.ndarray, act: np.ndarray, tol: Tolerance, floor: float = 1.0) -> OutputParity:
    """One output against its reference; `floor`: the least scale atol is multiplied by (`amplitude`)."""
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
    scale = max(floor, float(finite_ref.max())) if tol.scaled and finite_ref.size else 1.0
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    rel = diff[finite] / np.maximum(np.abs(r[finite]), 1e-12)
    max_rel = float(rel.max()) if rel.size else 0.0
    ra, aa = np.where(finite, r, 0).ravel(), np.where(finite, a, 0).ravel()
    norm_r = float(np.linalg.norm(ra))
    denom = norm_r * float(np.linalg.norm(aa))
    atol = tol.atol * scale
    # a reference within the absolute band of zero (silence in, silence out) has no direction to compare
    negligible = bool(np.isfinite(atol)) and float(np.abs(ra).max(initial=0.0)) <= min(atol, NEGLIGIBLE)
    if not np.any(ra != aa):
        cosine = 1.0  # identical values: the quotient below can round to just under 1
    elif denom == 0.0:
        cosine = 1.0 if negligible and max_abs <= atol else 0.0
    else:
        cosine = min(1.0, float(np.dot(ra, aa) / denom))
    reasons = []
    if nan or inf:
        reasons.append(f"{nan} NaN, {inf} Inf")
    # An infinite rtol means "no element-wise bound" (inf * 0 would be NaN and fail everything).
    bound = atol + (tol.rtol * np.abs(r[finite]) if np.isfinite(tol.rtol) else np.inf)
    within = diff[finite] <= bound
    if not np.all(within):
        at = f"atol={tol.atol:g}" + (f"x{scale:.4g}" if scale != 1.0 else "")
        reasons.append(f"{int((~within).sum())} elements outside {at} rtol={tol.rtol:g}")
    if cosine < tol.min_cosine and not negligible:
        reasons.append(f"cosine {cosine:.6f} < {tol.min_cosine}")
    return OutputParity(name, True, max_abs, max_rel, cosine, nan, inf, not reasons, "; ".join(reasons),
                        tolerance=_applied(tol, scale))


def _applied(tol: Tolerance, scale: float) -> dict:
    return {"atol": tol.atol, "rtol": tol.rtol, "min_cosine": tol.min_cosine, "scale": scale, "atol_effective": tol.atol * scale}


def compare(reference: dict[str, np.ndarray], actual: dict[str, np.ndarray], tol: Tolerance, *, hop: str,
            by_position: bool = False, floor: float = 1.0) -> ParityResult:
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
        result.outputs.append(compare_arrays(name, r, a, tol, floor))
    return result


def merge_samples(results: list[ParityResult], kinds: list[str], ill: dict[str, str] | None = None) -> ParityResult:
    """One hop's results on several sample sets as one: each output's worst set (the first that
    fails, else the one with the largest max_abs), named in `sample`; one row per set in `samples`.
    `ill`: the ill-conditioned sets, with their measure: a miss there does not count, NaN/Inf does."""
    ill = ill or {}
    if len(results) == 1 and not ill:
        return results[0]
    merged = ParityResult(hop=results[0].hop, tolerance=results[0].tolerance)
    for i in range(len(results[0].outputs)):
        rows = [(kind, r.outputs[i]) for kind, r in zip(kinds, results, strict=True) if i < len(r.outputs)]
        judged = [(k, o) for k, o in rows if k not in ill or o.nan or o.inf or not o.shape_ok]
        failing = [(k, o) for k, o in judged if not o.ok]
        if failing:
            kind, worst = failing[0]
        elif judged:
            kind, worst = max(judged, key=lambda ko: (ko[1].max_abs, -ko[1].cosine))
        else:
            kind, worst = rows[0]
            worst = replace(worst, ok=False, reason="no well-conditioned sample set to judge it on")
        worst = replace(worst, sample=kind,
                        reason=f"on the '{kind}' sample: {worst.reason}" if worst.reason else "")
        merged.outputs.append(worst)
    merged.samples = [{"kind": k, "ok": r.ok, "outputs": [o.brief() for o in r.outputs],
                       **({"ill_conditioned": ill[k]} if k in ill else {})}
                      for k, r in zip(kinds, results, strict=True)]
    return merged


def conditioning(sample, tolerance: Tolerance, hop: str) -> str | None:
    """The measure that makes `sample` ill-conditioned for a hop judged at `tolerance`, or None:
    the source's outputs one ulp away (`Sample.nudged`) against its outputs on the set."""
    nudged = getattr(sample, "nudged", None)
    if not nudged or any(np.shape(nudged.get(k)) != np.shape(v) for k, v in sample.outputs.items()):
        return None  # not measured, or measured on other tensors than these (a caller that reshaped one and not the other)
    moved = compare(sample.outputs, nudged, tolerance, hop=hop, floor=amplitude(sample))
    if moved.ok:
        return None
    o = moved.worst()
    return (f"the source's own output '{o.name}' moved by max_abs {o.max_abs:.3g} (cosine {o.cosine:.4f}) when its float "
            f"inputs moved one ulp: past this hop's tolerance")


def run_sets(runner, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """`runner` on each feed set, in one `run_many` call (a runner in a child process starts it once)."""
    return runner.run_many(feeds)


def check(runner, reference, tolerance: Tolerance, hop: str) -> ParityResult:
    """Run `runner` (a runtimes.base.Runner) on every sample set of the reference and
    compare its outputs with the reference's: the one way every stage proves a hop."""
    sets = reference.sets() if hasattr(reference, "sets") else None
    if not sets or len(sets) == 1:
        result = compare(reference.outputs, runner.run(reference.inputs), tolerance, hop=hop)
    else:
        actual = run_sets(runner, [s.inputs for s in sets])
        ill = {s.kind: why for s in sets if (why := conditioning(s, tolerance, hop))}
        result = merge_samples([compare(s.outputs, a, tolerance, hop=hop, floor=amplitude(s))
                                for s, a in zip(sets, actual, strict=True)],
                               [s.kind for s in sets], ill)
    result.guessed = list(getattr(reference, "guessed", None) or [])
    return result
