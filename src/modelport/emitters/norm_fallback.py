"""Normalisation fallback: an artifact whose LayerNorm/GroupNorm/InstanceNorm kernels miss the
reference on constant frames is converted again with shifted normalisation (each norm fed x - x₀:
`norm_shift.py` in the ONNX IR, `norm_shift_torch.py` in a PyTorch module), and that one is
delivered when it holds. The file is then right as users load it, with the runtime's defaults: no
load-time setting of theirs is needed.

Why an artifact-level fallback: the miss is the runtime's kernel, not the conversion (measured in
`norm_shift.py`: LiteRT's MEAN with or without XNNPACK, OpenVINO's CPU plugin at f32, ExecuTorch's
portable norms), and a plain load of the file is what users run.

`screened` runs on the artifact an emitter just wrote, in this process (the emitter wrote it a
moment ago; the run's validation still loads the delivered file in a clean child, as users do):

1. nothing to screen: an int8 artifact (judged on its calibration, its activations quantised), one
   no runner here runs, a reference with no constant-frame set (`sample_sets.STRUCTURED_KINDS`,
   `SWEEP_KINDS`), or an IR with no normalisation the rewrite applies to;
2. the artifact is run on the constant-frame sets only and judged at the precision's default
   tolerance (`validation.tolerance_for`; the user's flags are the run's validation's to apply).
   It holds: delivered as it is, nothing is converted again;
3. it misses: the emitter converts the rewritten form into a scratch folder, which is judged on
   every set. It holds: its files replace the artifact's, its `kernel_fallback` entry names the
   rewrite, the norms shifted, the sets missed and the figures both ways, and a warning says so.
   It misses too, or does not convert: the artifact is delivered as it was, the entry saying
   `repaired: false` and why, for the run's validation to judge.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from modelport.artifact import Artifact
from modelport.emitters.norm_shift import normalisations, shift
from modelport.errors import ModelportError, one_line
from modelport.ir import IRModel, Reference
from modelport.reference.sample_sets import STRUCTURED_KINDS, SWEEP_KINDS
from modelport.runtimes import get_runner
from modelport.validation import tolerance_for

REWRITE = "shifted normalisation"
WHAT = "each LayerNorm/GroupNorm/InstanceNorm fed x - x₀ (its group's first element): exact zeros on a constant frame"
HOP = "kernel screen, in process"
SCREENED = ("fp32", "fp16", "bf16")  # the float artifacts; int8 is judged on its calibration

# rebuild(folder) -> (the artifact converted from the rewritten form into `folder`, the norms shifted);
# (None, []) when the rewrite finds nothing to shift
Rebuild = Callable[[Path], tuple[Artifact | None, list[str]]]


def constant_frames(reference: Reference | None) -> Reference | None:
    """The reference's constant-frame sets (structured and sweep kinds) as a reference of their own,
    or None when it has none."""

    if reference is None:
        return None
    sets = [s for s in reference.sets() if s.kind in STRUCTURED_KINDS + SWEEP_KINDS]
    if not sets:
        return None
    first, *rest = sets
    return Reference(first.inputs, first.outputs, reference.producer, extra=rest, first_kind=first.kind,
                     guessed=list(reference.guessed))


def judge(artifact: Artifact, reference: Reference, tolerance):
    """The artifact run by its runner in this process, with the options its validation uses: a
    ParityResult, or the runtime's error in one line (an artifact that does not run does not hold)."""
    from modelport.validation import check

    try:
        return check(get_runner(artifact.runner, artifact.path, **artifact.runner_options), reference, tolerance,
                     f"{artifact.target} ({HOP})")
    except Exception as e:
        return _error(e)


def _error(e: Exception) -> str:
    return e.reason if isinstance(e, ModelportError) else f"{type(e).__name__}: {one_line(str(e), 200)}"


def holds(result) -> bool:
    return not isinstance(result, str) and result.ok


def figures(result) -> str:
    """The failing outputs' figures in one line, the worst output's when all hold, or the error."""
    if isinstance(result, str):
        return result
    bad = [o for o in result.outputs if not o.ok] or sorted(result.outputs, key=lambda o: -o.max_abs)[:1]
    return "; ".join(f"{o.name}: " + (f"{o.nan} NaN, {o.inf} Inf" if o.nan or o.inf else f"max_abs={o.max_abs:.3g}")
                     + (f" on '{o.sample}'" if o.sample else "") for o in bad)


def missed_on(result, reference: Reference) -> list[str]:
    """The sample sets `result` failed on."""
    if isinstance(result, str):
        return reference.kinds()
    if result.samples:
        return [row["kind"] for row in result.samples if not row["ok"]]
    return [] if result.ok else [reference.first_kind]


def tolerance_of(ir: IRModel, precision: str):

    return tolerance_for(precision, source=ir.provenance.get("source_precision"))


def entry(shifted: list[str], seen, reference: Reference, tolerance, result, *, repaired: bool, what: str) -> dict:
    """The artifact's `kernel_fallback` entry: the rewrite, the norms shifted, the sets missed, why."""
    if repaired:
        held = f"with {REWRITE} it holds ({figures(result)})"
    else:
        held = f"with {REWRITE} it {'does not convert or run' if isinstance(result, str) else 'misses too'} ({figures(result)})"
    return {"rewrite": REWRITE, "shifted": shifted, "missed_on": missed_on(seen, reference), "repaired": repaired,
            "why": f"the {what} as converted: {figures(seen)}, its normalisation kernels losing a constant frame's mean "
                   f"or variance; {held}", "how": WHAT,
            "judged_with": {"atol": tolerance.atol, "rtol": tolerance.rtol, "min_cosine": tolerance.min_cosine,
                            "where": "the precision's default tolerance, the artifact run by its runtime in process"}}


def warning(fallback: dict, seen, what: str) -> str:
    return (f"the {what} as converted missed the reference on constant frames ({', '.join(fallback['missed_on'])}: "
            f"{figures(seen)}), its normalisation kernels losing a constant frame's mean or variance; it is delivered with "
            f"{REWRITE} ({len(fallback['shifted'])} norm(s) fed x - x₀, exact on a constant frame), which holds "
            "(kernel_fallback in the report)")


def screened(ir: IRModel, plain: Artifact, rebuild: Rebuild, *, what: str = "file") -> Artifact:
    """`plain`, or the artifact `rebuild` converts from the shifted form when `plain` misses the
    reference on constant frames and that one holds (the module docstring)."""

    reference = plain.reference or ir.reference
    frames = constant_frames(reference)
    if (plain.precision not in SCREENED or plain.runner is None or plain.not_validated or frames is None
            or (ir.model is not None and not normalisations(ir.model))):
        return plain
    tolerance = tolerance_of(ir, plain.precision)
    seen = judge(plain, frames, tolerance)
    if isinstance(seen, str) or seen.ok:  # it holds, or it does not run here: the run's validation says so
        return plain
    with tempfile.TemporaryDirectory(prefix="modelport-norm-shift-") as tmp:
        try:
            rebuilt, shifted = rebuild(Path(tmp))
        except Exception as e:  # the fallback never fails a run the plain artifact would have had judged
            plain.details["kernel_fallback"] = entry([], seen, frames, tolerance, _error(e), repaired=False, what=what)
            return plain
        if rebuilt is None or not shifted:
            return plain
        rebuilt.reference = plain.reference
        result = judge(rebuilt, reference, tolerance)
        if not holds(result):
            plain.details["kernel_fallback"] = entry(shifted, seen, frames, tolerance, result, repaired=False, what=what)
            return plain
        fallback = entry(shifted, seen, frames, tolerance, result, repaired=True, what=what)
        delivered = _move(rebuilt, Path(tmp), plain)
    delivered.details["kernel_fallback"] = fallback
    delivered.warnings.append(f"{plain.target}: {warning(fallback, seen, what)}")
    return delivered


def screened_ir(ir: IRModel, emit: Callable[[IRModel, Path], Artifact], out_dir: Path, *, what: str = "file") -> Artifact:
    """`screened` for an emitter that converts the ONNX IR (`emit(ir, folder)`): the fallback
    converts the IR with its norms shifted (`norm_shift.shift`)."""

    def rebuild(folder: Path):
        rewritten = shift(ir)
        return (emit(rewritten.ir, folder) if rewritten.nodes else None), rewritten.nodes

    return screened(ir, emit(ir, out_dir), rebuild, what=what)


def _move(rebuilt: Artifact, scratch: Path, plain: Artifact) -> Artifact:
    """`rebuilt`'s files moved from `scratch` into `plain`'s folder, in place of `plain`'s."""
    folder = plain.path.parent
    for f in plain.files:
        Path(f).unlink(missing_ok=True)
    files = []
    for f in rebuilt.files:
        dest = folder / Path(f).relative_to(scratch)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(f), dest)
        files.append(dest)
    rebuilt.path = folder / Path(rebuilt.path).relative_to(scratch)
    rebuilt.files = files
    return rebuilt
