"""Kernel fallback for ExecuTorch programs: the ops whose XNNPACK kernels break the program's
numbers are kept out of the XNNPACK partition, and run on ExecuTorch's portable kernels instead.

XNNPACK's kernels are not ATen's. Measured here (executorch 1.5.1, x86-64 with AVX-512): XNNPACK's
`sqrt` of +inf is NaN and of 1e38 is 1.5e19, where ATen's and the portable kernel's are +inf and
1e19. So a frame scaled to unit energy (`x / sqrt(mean(x*x) + eps)`) whose energy overflows float32
(a constant frame of -1e18, 384 wide) comes out NaN with XNNPACK, and as the source computes it
without. Such a fault is the kernel's, not the model's: the same program with that op left to the
portable kernels holds. (LayerNorm itself is never XNNPACK's in this version: its partitioner has
no config for it, so a LayerNorm fault is the portable kernel's, and step 2 below names it.)

`screen` runs on the program the emitter just lowered, in this process (the emitter wrote it a
moment ago; the run's validation still loads the delivered file in a clean child, as users do):

1. the XNNPACK program is run on the reference's sample sets at the program's fixed sizes and
   judged at the precision's default tolerance (`validation.tolerance_for`; the user's flags are
   the run's validation's to apply). It holds: delivered as it is, nothing else is lowered.
2. it fails: the same program with nothing delegated (the portable kernels alone) is run. That
   fails too: no kernel fallback repairs it. NaN/Inf the reference lacks is exit 4 here, naming the
   ops the program runs on the portable kernels either way; a miss is left to the run's validation.
3. the portable program holds: the delegated op types (the XNNPACK partitioner's configs, keyed by
   op) are halved, keeping each half out in turn, down to the fewest that make the program hold,
   in at most `MAX_LOWERINGS` more lowerings (`capped` in the entry when that cap ended the search,
   with the smallest set found so far). When no half alone makes it hold, every delegated op type
   is kept out: the portable program is delivered. The artifact's `kernel_fallback` names the ops
   kept out and why, and a warning says so.

When the portable program fails too (step 2), or nothing was delegated to search among (the
`portable` backend, a program XNNPACK took nothing of), the fault may be the norms': ExecuTorch's
portable `native_layer_norm` computes E[x²]-E[x]², which cancels on a constant frame with a full
mantissa (NaN at width 192 and -138.47, at width 80 and -15.94), and `native_group_norm` likewise.
The module is then exported again with shifted normalisation (`norm_shift_torch`, `norm_fallback`:
each norm fed x - x₀, exact zeros on a constant frame) and lowered as asked; when that program
holds it is delivered, `kernel_fallback` naming the rewrite, the norms, the sets missed and why.
A program with no delegate is judged on the constant-frame sets only, and only when the IR has a
norm (`norm_fallback.constant_frames`, `norm_shift.normalisations`): that is where it can miss.

Only fp32 programs are screened: the int8 program is XNNPACK's by construction (its quantised
ops have no portable path worth delivering).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modelport.emitters import norm_fallback
from modelport.emitters.norm_fallback import constant_frames
from modelport.emitters.norm_shift import normalisations
from modelport.errors import ValidationError, one_line
from modelport.ir import IRModel, Reference
from modelport.runtimes.executorch import ExecuTorchRunner
from modelport.validation import tolerance_for

MAX_LOWERINGS = 8  # lowerings after the portable one, while narrowing the ops kept out
HOP = "ExecuTorch program (kernel screen, in process)"


@dataclass
class Program:
    """One lowering: the ExecuTorch program manager, what `_lower` says of it (delegates,
    operators, delegated_ops), the op types kept out of XNNPACK in it and the norms shifted in it;
    `program` None and `info["error"]` when it could not be lowered."""

    program: object
    info: dict
    kept_out: tuple[str, ...] = ()
    shifted: tuple[str, ...] = ()  # the norms fed x - x₀ in it (`norm_fallback`)


@dataclass
class Screen:
    """What `screen` delivers: the program, and the artifact's `kernel_fallback` entry and warning
    (None when the XNNPACK program held)."""

    chosen: Program
    entry: dict | None = None
    warning: str | None = None


def short_name(op: str) -> str:
    """'aten.sqrt.default' -> 'sqrt.default', the key XNNPACK's partitioner configs are listed by."""
    from executorch.exir.backend.canonical_partitioners.config_partitioner import format_target_name

    return format_target_name(op)


def xnnpack_configs(kept_out: tuple[str, ...]) -> list:
    """XNNPACK's partitioner configs less those of the ops in `kept_out` ('aten.sqrt.default', ...)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    names = {short_name(op) for op in kept_out}
    return [c for c in ALL_PARTITIONER_CONFIGS if c.target_name not in names]


def fallback_candidates(delegated_ops: list[str]) -> list[str]:
    """The delegated op types that XNNPACK's partitioner takes by a config of their own (those a
    fallback can keep out), sorted."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    keyed = {c.target_name for c in ALL_PARTITIONER_CONFIGS}
    return sorted(op for op in set(delegated_ops) if short_name(op) in keyed)


def judge(program: Program, reference: Reference, tolerance, work: Path, label: str):
    """The program run by ExecuTorch's runtime in this process on every sample set: a ParityResult,
    or the runtime's error in one line (a program that does not load or run does not hold)."""
    from modelport.validation import check

    if program.program is None:
        return program.info["error"]
    path = work / f"{label}.pte"  # a file per program: the runtime maps the file it loads
    path.write_bytes(program.program.buffer)
    try:
        return check(ExecuTorchRunner(path), reference, tolerance, HOP)
    except Exception as e:
        return one_line(e, 200, typed=True)


def _holds(result) -> bool:
    return not isinstance(result, str) and result.ok


def _figures(result) -> str:
    """The failing outputs' figures in one line ('output: 64 NaN, 0 Inf'), the worst output's when
    all hold, or the runtime's error."""
    if isinstance(result, str):
        return result
    bad = [o for o in result.outputs if not o.ok] or sorted(result.outputs, key=lambda o: -o.max_abs)[:1]
    return "; ".join(f"{o.name}: max_abs={o.max_abs:.3g}" + (f" ({o.reason})" if o.reason else "") for o in bad)


def _non_finite(result) -> bool:
    return not isinstance(result, str) and any(o.nan or o.inf for o in result.outputs)


def screen(first: Program, relower: Callable[[tuple[str, ...] | None], Program] | None, reference: Reference,
           ir: IRModel, precision: str, *, rewrite: Callable[[], Program | None] | None = None) -> Screen:
    """The program to deliver: `first` (the XNNPACK program) when it holds, else the same program
    with the fewest op types kept out of XNNPACK that make it hold (`relower(kept_out)`;
    `relower(None)` lowers with nothing delegated; None: nothing is delegated to search among),
    else the program `rewrite()` lowers with shifted normalisation when that one holds (None: no
    norm to shift). Exit 4 when it gives NaN/Inf the reference lacks and no fallback repairs it."""

    tolerance = tolerance_for(precision, source=ir.provenance.get("source_precision"))
    with tempfile.TemporaryDirectory(prefix="modelport-executorch-screen-") as tmp:
        work = Path(tmp)
        if relower is None:
            return _norms_only(first, rewrite, reference, ir, tolerance, work)
        seen = judge(first, reference, tolerance, work, "xnnpack")
        if isinstance(seen, str) or seen.ok:  # it held, or it does not run here: the run's validation says so
            return Screen(first)
        portable = relower(None)
        alone = judge(portable, reference, tolerance, work, "portable")
        tries = [{"no_delegate": True, "ok": _holds(alone)}]
        if not _holds(alone):
            return _shifted(first, seen, rewrite, reference, tolerance, work, tries) or _unrepaired(first, seen, alone, tries)
        candidates = fallback_candidates(first.info["delegated_ops"])
        chosen, kept, held = _narrow(candidates, relower, reference, tolerance, work, tries)
    if chosen is None:  # no op type kept out alone makes it hold: nothing is delegated
        chosen, kept, held = portable, candidates or first.info["delegated_ops"], alone
    entry = {"kept_out_of_xnnpack": list(kept),
             "reason": f"with XNNPACK: {_figures(seen)}; with {', '.join(kept)} on ExecuTorch's portable kernels it holds "
                       f"({_figures(held)})",
             "judged_with": {"atol": tolerance.atol, "rtol": tolerance.rtol, "min_cosine": tolerance.min_cosine,
                             "where": "the precision's default tolerance, the program run by ExecuTorch's runtime in process"},
             "tries": tries, "capped": len(tries) > MAX_LOWERINGS, "delegated_partitions": chosen.info["delegates"]}
    what = "NaN/Inf the reference lacks" if _non_finite(seen) else "a miss of the reference"
    warning = (f"XNNPACK's kernel(s) for {', '.join(kept)} gave {what} ({_figures(seen)}); the program runs "
               f"{'them' if len(kept) > 1 else 'it'} on ExecuTorch's portable kernels instead (kernel_fallback in the report)")
    return Screen(Program(chosen.program, chosen.info, tuple(kept)), entry, warning)


def _norms_only(first: Program, rewrite, reference: Reference, ir: IRModel, tolerance, work: Path) -> Screen:
    """A program with nothing delegated to search among: judged on the constant-frame sets where the
    IR has a norm, and lowered again with shifted normalisation when it misses there."""

    frames = constant_frames(reference)
    if rewrite is None or frames is None or (ir.model is not None and not normalisations(ir.model)):
        return Screen(first)
    seen = judge(first, frames, tolerance, work, "plain")
    if isinstance(seen, str) or seen.ok:
        return Screen(first)
    return _shifted(first, seen, rewrite, reference, tolerance, work, [], frames) or Screen(first)


def _shifted(first: Program, seen, rewrite, reference: Reference, tolerance, work: Path, tries: list[dict],
             missed: Reference | None = None) -> Screen | None:
    """The program lowered again with shifted normalisation, when it holds on every set; None when
    there is no norm to shift or it misses too (the try is recorded in `tries`)."""

    program = rewrite() if rewrite is not None else None
    if program is None:
        return None
    result = judge(program, reference, tolerance, work, "shifted")
    tries.append({"rewrite": norm_fallback.REWRITE, "ok": _holds(result)})
    if not _holds(result):
        return None
    entry = norm_fallback.entry(list(program.shifted), seen, missed or reference, tolerance, result, repaired=True,
                                what="program")
    entry.update({"kept_out_of_xnnpack": [], "tries": tries, "delegated_partitions": program.info["delegates"]})
    return Screen(program, entry, norm_fallback.warning(entry, seen, "program"))


def _narrow(candidates: list[str], relower, reference, tolerance, work: Path, tries: list[dict]):
    """(program, ops kept out, its parity): `candidates` halved while one half kept out of XNNPACK
    still makes the program hold, in at most `MAX_LOWERINGS` lowerings; (None, candidates, None)
    when no set of them does."""
    chosen, kept, held = None, list(candidates), None
    while kept and len(tries) <= MAX_LOWERINGS:
        found = None
        for part in [kept] if len(kept) == 1 else [kept[:len(kept) // 2], kept[len(kept) // 2:]]:
            if len(tries) > MAX_LOWERINGS:
                break
            program = relower(tuple(part))
            result = judge(program, reference, tolerance, work, f"try{len(tries)}")
            tries.append({"kept_out": list(part), "ok": _holds(result)})
            if _holds(result):
                found = program, part, result
                break
        if found is None:
            break
        chosen, kept, held = found
        if len(kept) == 1:
            break
    return (chosen, kept, held) if chosen is not None else (None, candidates, None)


def _unrepaired(first: Program, seen, alone, tries: list[dict]) -> Screen:
    """Nothing delegated, the program still fails: no kernel fallback repairs it. NaN/Inf the
    reference lacks is exit 4 (it fails whatever the tolerance), naming the ops the program runs on
    the portable kernels either way; a miss is left to the run's validation to judge at the user's
    tolerance, the entry saying what was tried."""
    reason = f"with XNNPACK: {_figures(seen)}; with nothing delegated: {_figures(alone)}"
    ops = ", ".join(first.info["operators"]) or "none"
    if _non_finite(seen):
        raise ValidationError(f"ExecuTorch's program gives NaN/Inf the reference lacks, and no kernel fallback repairs it "
                              f"({reason}); the op(s) it runs on ExecuTorch's portable kernels either way: {ops}",
                              parity=None if isinstance(seen, str) else seen.to_dict(),
                              hint="one of these kernels (or the model's own float32 range at these inputs) gives the "
                                   "NaN/Inf: check the inputs' range, or convert to another target")
    entry = {"kept_out_of_xnnpack": [], "repaired": False, "reason": f"{reason}; the portable op(s): {ops}", "tries": tries}
    return Screen(first, entry)
