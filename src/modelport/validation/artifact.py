"""Artifact validation: an artifact loaded as its users load it, run on the references, judged.

`validate_artifact` is what the pipeline calls for every artifact it writes. The artifact is run
by its runtime's runner (runtimes/base.py) in a fresh child process that imports only that
runtime and runs it with the runtime's defaults (`runtimes/isolated.py`), on every sample set
of the reference, and compared with the tolerance its precision is judged at. What the runner
declares decides the rest, nothing is probed:

- `cannot_run()` (Core ML off macOS), or an artifact the emitter could not make runnable here
  (`Artifact.not_validated`: a TensorRT plan without an engine): its inputs and outputs are
  checked against the contract as the runtime describes them, nothing is run; `validated: false`
  with the reason, a warning, exit 4 under --strict;
- `in_process` (TensorRT): run in this process, where the GPU is;
- `plain_load` (OpenVINO): the precision the runtime actually ran at is read back, and where a
  plain load of the file runs at another one (bf16 on CPUs that have it) that load is judged too,
  worded by the runner (`plain_load_warning`); exit 4 under --strict when it misses the tolerance.

The result is an `ArtifactCheck`: the parity, what the artifact's report entry gains, warnings,
and the failure to raise once all of it is recorded. The artifact itself is never written to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from modelport.dims import input_dims
from modelport.errors import ValidationError
from modelport.ir import IRModel, TensorSpec
from modelport.reference.sample_sets import NOT_FOR_INT8, SWEEP_KINDS
from modelport.runtimes import get_runner, runner_class
from modelport.runtimes.isolated import IsolatedRunner
from modelport.validation.compare import ParityResult, check
from modelport.validation.dim_sizes import check_sizes, kept_dims, other_layout
from modelport.validation.tolerance import Tolerance

FIXED_DIMS_FIX = "declare others with --dim NAME=N or --input NAME:SHAPE"


@dataclass(frozen=True)
class Judging:
    """How an artifact is judged: the tolerance of its precision, the hop's name, whether its I/O is
    checked against the contract too (targets reached by native routes), --strict, and the output
    folder (named in errors) with the folder its report entry's paths are relative to."""

    tolerance: Tolerance
    hop: str
    check_io: bool = False
    strict: bool = False
    out: Path | None = None
    root: Path | None = None


@dataclass
class ArtifactCheck:
    """One artifact's validation: parity (None when nothing ran), the fields its report entry gains,
    warnings for the user, and the failure to raise after recording (None: it passed)."""

    parity: ParityResult | None = None
    entry: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    failure: ValidationError | None = None
    generation: object | None = None  # a GenerationResult, for artifacts judged by generation

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self.failure


def artifact_runner(artifact, **options):
    """The runner that validates an artifact: in a fresh child process that imports only the
    artifact's runtime, with that runtime's defaults, as its users load it; a runner that declares
    `in_process` (TensorRT, where the GPU is) in this one. `options` replace the artifact's. The
    runtime failing on the artifact, hanging or crashing is the artifact failing its check (exit 4,
    the runtime's message in one line, all of it in the report: runtimes/isolated.py)."""

    options = {**artifact.runner_options, **options}
    if runner_class(artifact.runner).capabilities.in_process:
        return get_runner(artifact.runner, artifact.path, **options)
    return IsolatedRunner(artifact.runner, artifact.path, clean=True, ours=True, **options)


def validate_artifact(artifact, ir: IRModel, judging: Judging) -> ArtifactCheck:
    """Validate `artifact` against `ir`'s contract and references (the emitter's own reference where
    it judged the artifact on other data), as `judging` says."""

    reason = artifact.not_validated or (runner_class(artifact.runner).cannot_run() if artifact.runner else None)
    if reason:
        return _unvalidated(artifact, ir, reason, judging)
    result = ArtifactCheck()
    if not artifact.runner:  # judged by other means (an ort-genai folder, by generation)
        return result
    with ir.weights_parked() as parked:  # the child's runtime loads the artifact; this process needs only the references
        runner = artifact_runner(artifact)
        if judging.check_io:
            result.entry["contract_check"] = check_contract(runner, ir, artifact)
        reference = artifact.reference or ir.reference  # every set, at every precision (sample_sets.py)
        if artifact.precision == "int8":
            reference = reference.without(*_not_for_int8(ir))
        result.parity = check(runner, reference, judging.tolerance, judging.hop)
        if runner.ran_in() is not None:
            result.entry["validated_with"] = runner.ran_in()
        if runner.capabilities.plain_load:
            result.entry.update(_plain_load(artifact, runner, reference, judging))
        sized = _at_sizes(result, runner, artifact, ir, parked, judging) if result.parity.ok else None
    if not result.parity.ok:
        try:
            result.parity.raise_if_failed(path=judging.out)
        except ValidationError as e:
            result.failure = e
        return result
    if sized is not None:
        result.failure = sized
        return result
    if runner.capabilities.plain_load:
        warning = runner.plain_load_warning(artifact.target, {**artifact.to_dict(judging.root), **result.entry})
        if warning and judging.strict and result.entry["plain_compile"].get("ok") is False:
            result.failure = ValidationError(f"{warning} (--strict: a plain load must hold the tolerance)", path=judging.out)
            return result
        if warning:
            result.warnings.append(warning)
    _warn_fixed(result, artifact.target)
    return result


def _not_for_int8(ir: IRModel) -> tuple[str, ...]:
    """The sets an INT8 artifact is not judged on: 1/100 of the amplitude lies below a calibrated
    resolution by design; and where the target's converter quantised it, which calibrates (on
    --calibration or the sample inputs), the calibration says which values are real, not the sweep.
    An IR quantised by the optimisation stage carries the sets it was judged on already."""

    return NOT_FOR_INT8 if ir.provenance.get("precision") == "int8" else (*NOT_FOR_INT8, *SWEEP_KINDS)


def _at_sizes(result: ArtifactCheck, runner, artifact, ir: IRModel, parked, judging: Judging):
    """The artifact at the sizes of the declared dims it keeps dynamic (`dim_sizes.py`): rows in its
    entry (`sizes`, and `sizes_capped` where memory capped the largest); the failure, or None."""

    kept = kept_dims(artifact, ir)
    if not kept or ir.reference is None:
        return None
    moved = other_layout(artifact, ir)
    if moved:
        result.entry["sizes"] = f"not checked: {', '.join(moved)} in another layout than the contract's"
        result.warnings.append(f"{artifact.target}: the declared dims were checked at the sample size only: "
                               f"{', '.join(moved)} in another layout than the contract's")
        return None
    seed = getattr(getattr(ir.source, "spec", None), "seed", 0) or 0
    rows, note, failure = check_sizes(runner, ir, parked or ir.model, kept, judging.tolerance, judging.hop, seed=seed)
    if "dims" not in artifact.details:  # a target that keeps every dim as the IR has it

        result.entry["dims"] = input_dims(ir.inputs, kept, {})
    result.entry["sizes"] = rows
    if note:
        result.entry["sizes_capped"] = note
        result.warnings.append(f"{artifact.target}: checked at {note['capped_at']} at most, not at {note['largest']}: "
                               f"about {note['estimate_bytes'] >> 20} MiB of inputs and outputs there, over the "
                               f"{note['cap_bytes'] >> 20} MiB a check run may hold")
    if failure is not None:
        failure.path = str(judging.out) if judging.out else None
    return failure


def _plain_load(artifact, runner, reference, judging: Judging) -> dict:
    """The precision the runtime ran the artifact at, read back from it, and what a plain load of the
    file runs at on this machine. Where that is another precision (an OpenVINO IR validated at f32
    on a CPU whose default is bf16, which the IR cannot change), the plain load is run on the same
    inputs and judged by the same rule; the figures go in `plain_compile`."""
    info = runner.describe() or {}
    if "plain_compile" not in info:
        return {}
    plain: dict = {"inference_precision": info["plain_compile"]}
    if info.get("plain_options"):
        loaded = artifact_runner(artifact, **info["plain_options"])
        judged = check(loaded, reference, judging.tolerance, f"{judging.hop} (plain load)").to_dict()
        plain.update(ok=judged["ok"], outputs=[{k: o[k] for k in ("name", "max_abs", "cosine", "ok")} for o in judged["outputs"]])
    return {"inference_precision": info["inference_precision"], "plain_compile": plain}


def _unvalidated(artifact, ir: IRModel, reason: str, judging: Judging) -> ArtifactCheck:
    """An artifact no runtime here can run: its I/O checked against the contract where a runner can
    describe it (nothing is run), `validated: false` and the reason, a warning; exit 4 under --strict."""
    result = ArtifactCheck(entry={"validated": False, "not_validated": reason})
    if artifact.runner:
        runner = artifact_runner(artifact)
        result.entry["contract_check"] = check_contract(runner, ir, artifact)
        if runner.ran_in() is not None:
            result.entry["validated_with"] = runner.ran_in()
    text = f"{artifact.target}: the artifact is not validated here: {reason}" + (
        "; its inputs and outputs were checked against the contract" if artifact.runner else "")
    if judging.strict:
        result.failure = ValidationError(f"{text} (--strict: every artifact must be validated)", path=judging.out)
        return result
    result.warnings.append(text)
    _warn_fixed(result, artifact.target)
    return result


def _warn_fixed(result: ArtifactCheck, target: str) -> None:
    fixed = (result.entry.get("contract_check") or {}).get("fixed_dims")
    if fixed:
        result.warnings.append(f"{target}: the artifact fixes dynamic dims: {fixed}; it takes those sizes only ({FIXED_DIMS_FIX})")


def check_contract(runner, contract, artifact) -> dict:
    """The artifact's inputs and outputs against the contract (anything with `inputs` and `outputs`
    TensorSpec lists: an IR), as its runtime describes them: the same names, dtypes (unless integer
    I/O was asked for) and ranks, every fixed dim kept (a transposed layout permuted first). A
    dynamic dim the file fixes is allowed and returned (`fixed_dims`, per tensor) as long as it has
    one size across the file; anything else is exit 4.

    The parity check compares values against the artifact's own reference where an emitter made
    one (a route that fixes dims runs the source at the fixed sizes), so it is here that an output
    the contract does not describe is caught: another fixed size, rank or dtype."""
    pinned: list[tuple[str, str, int]] = []  # (tensor, dim, the size the file gives it)
    _check_tensors("input", runner.input_specs(), contract.inputs, artifact, pinned)
    outputs = runner.output_specs()
    if outputs is not None:
        _check_tensors("output", outputs, contract.outputs, artifact, pinned)
    sizes: dict[str, tuple[str, int]] = {}
    fixed: dict[str, dict[str, int]] = {}
    for tensor, dim, size in pinned:
        first = sizes.setdefault(dim, (tensor, size))
        if first[1] != size:
            raise ValidationError(f"the {artifact.target} artifact fixes dim '{dim}' at {first[1]} in '{first[0]}' and at "
                                  f"{size} in '{tensor}'; in the contract both are one dim", path=artifact.path)
        fixed.setdefault(tensor, {})[dim] = size
    return {"inputs": "names, dtypes and ranks as the contract's",
            "outputs": "names, dtypes and ranks as the contract's" if outputs is not None else "not described by the runtime",
            "fixed_dims": fixed}


def _known_rank(spec: TensorSpec) -> bool:
    """An empty shape is a scalar only when declared so; otherwise the rank is unknown (ONNX
    without shape information, a TensorFlow output of unknown rank) and not compared."""
    return bool(spec.shape) or spec.scalar


def _check_tensors(kind: str, described: list[TensorSpec], contract: list[TensorSpec], artifact, pinned: list) -> None:
    specs = {s.name: s for s in described}
    path, what = artifact.path, f"the {artifact.target} artifact"
    if set(specs) != {s.name for s in contract}:
        verb = "takes inputs" if kind == "input" else "gives outputs"
        raise ValidationError(f"{what} {verb} {sorted(specs)}; the contract's are {sorted(s.name for s in contract)}", path=path)
    changes = artifact.details.get("layout_changes") or {}
    integer_io = artifact.details.get("io_dtype") in ("int8", "uint8")
    narrowed = artifact.details.get("io_dtypes") or {}  # {tensor: dtype} the format keeps it at (Core ML: int64 as int32)
    for want in contract:
        got = specs[want.name]
        shape = [want.shape[k] for k in changes[want.name]] if want.name in changes else list(want.shape)
        if got.dtype != want.dtype and not integer_io and got.dtype != narrowed.get(want.name):
            raise ValidationError(f"{what}'s {kind} '{want.name}' is {got.dtype}; the contract's is {want.dtype}", path=path)
        if kind == "output" and not (_known_rank(got) and _known_rank(want)):
            continue
        # an output the file leaves dynamic where the contract has a size is the runtime's shape inference, not a contradiction
        clash = any(isinstance(w, int) and g != w and not (kind == "output" and isinstance(g, str))
                    for g, w in zip(got.shape, shape, strict=False))
        if len(got.shape) != len(shape) or clash:
            raise ValidationError(f"{what}'s {kind} '{want.name}' has the shape {got.shape}; the contract's is {shape}", path=path)
        pinned += [(want.name, w, g) for g, w in zip(got.shape, shape, strict=True) if isinstance(w, str) and isinstance(g, int)]
