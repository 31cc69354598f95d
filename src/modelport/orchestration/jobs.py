"""Jobs: one per artifact, and the chain that emits and validates each.

A `Job` holds what the chain reads (target, part, IR, precision, emitter options, tolerance,
routes); the run's `Context` holds what every job shares (the request, the report, the staging
folder). `plan_jobs` makes a part's jobs: each target's routes (emitters/routes.py), every
target's preflight before anything is emitted, the IR it takes at its precision. `run_jobs` runs
them: a target's routes in order (under `--route auto` a route that fails to convert or to
validate gives way to the next, and the report says why), the task's validation of each
artifact, a precision that cannot be delivered retried at FP32 when the user allowed it, and
every target's failure reported before the run fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from modelport.emitters import EmitOptions, get_emitter
from modelport.emitters.preflight import check_targets
from modelport.emitters.routes import plan
from modelport.errors import MissingDependencyError, ModelportError, StageError, UnsupportedError, ValidationError
from modelport.ir import IRModel
from modelport.resolve.precisions import Resolved
from modelport.run.stage_limits import bounded
from modelport.targets import TARGETS, TargetOptions
from modelport.validation import Tolerance
from modelport.validation.artifact import ArtifactCheck
from modelport.validation.report import Findings, Report, entry_of, run_stage

if TYPE_CHECKING:
    from modelport.emitters.routes import Plan
    from modelport.orchestration.request import Request

StageCallback = Callable[[str], None]


@dataclass
class Context:
    """What every stage of one run shares: the request, the report, the live display's callback, the
    staging folder once it is open, and the size of the model's weights as far as it is known (the
    source file's, then the IR's), from which each stage's memory bound follows."""

    request: Request
    report: Report
    on_stage: StageCallback | None = None
    stage: Path | None = None

    def limits(self):
        """The time and memory bounds of a stage of this run (stage_limits.py)."""
        return self.request.limits

    @contextlib.contextmanager
    def bounded(self, name: str):
        """A stage under this run's bounds, with no report row of its own (the optimisation passes write theirs)."""

        with bounded(name, self.limits()):
            yield

    @contextlib.contextmanager
    def step(self, name: str, **details):
        """A timed report stage of this run (`validation.report.run_stage`), under the run's bounds."""
        with self.bounded(name), run_stage(self.report, name, on_stage=self.on_stage, **details) as row:
            yield row


@dataclass
class Prepared:
    """A part's IRs after the optimisation stage: precision -> IR ("fp32": the one every target that applies its
    own precision takes), each target's precision (auto chooses among them), why a precision fell
    back to fp32, the budget that judges what the stage quantised, the options auto chose, and the
    fp32 IR with its quantised weights dequantised for the targets that take float weights
    (`Target.float_weights`; None when the fp32 IR has none)."""

    irs: dict[str, IRModel]
    resolved: dict[str, Resolved]
    fallback: dict[str, str] = field(default_factory=dict)
    budget: Tolerance | None = None  # judges what the stage quantised
    target_options: dict[str, TargetOptions] = field(default_factory=dict)  # the options --optimize auto chose
    float_weights: IRModel | None = None

    def fp32_for(self, target: str) -> IRModel:
        """The fp32 IR `target` is emitted from: with float weights where it takes them."""
        if self.float_weights is not None and TARGETS[target].float_weights:
            return self.float_weights
        return self.irs["fp32"]


@dataclass
class Job:
    """One artifact to write: everything the emit chain reads."""

    target: str
    part: str  # "" for a source converted as one model
    ir: IRModel  # what it is emitted from: at its precision where the optimisation stage applies it
    resolved: Resolved  # its precision as decided (modelport.resolve.precisions)
    options: EmitOptions  # what the emitter reads: the precision it is emitted at, its own options
    tolerance: Tolerance  # what judges its artifact
    plan: Plan | None = None  # its routes, set by plan_routes
    fallback_reason: str | None = None  # why the optimisation stage delivered fp32 instead of the precision asked
    extra: dict = field(default_factory=dict)  # what its report entry says beyond the artifact (a variant's name)

    @property
    def name(self) -> str:
        return f"{self.part}:{self.target}" if self.part else self.target

    @property
    def suffix(self) -> str:
        """The report stage names' suffix of a part."""
        return f":{self.part}" if self.part else ""


@dataclass
class StageResult:
    """What a stage of the pipeline returns: what it found for the report, and the error it ended with
    (`recorded` writes the findings into the report, then raises it)."""

    found: Findings = field(default_factory=Findings)
    error: ModelportError | None = None


@dataclass
class Parsed(StageResult):
    """The parse stage's result: {part: IR} ("" for a source converted as one model)."""

    parts: dict[str, IRModel] = field(default_factory=dict)


@dataclass
class Planned(StageResult):
    """A part's prepared jobs."""

    jobs: list[Job] = field(default_factory=list)


@contextlib.contextmanager
def gathering(result: StageResult):
    """A stage's body, given the findings it adds to (`result.found`): a ModelportError it raises
    becomes `result.error`, so that what it found before stays in the report."""
    try:
        yield result.found
    except ModelportError as e:
        result.error = e


def recorded(report: Report, result: StageResult):
    """`result`'s findings written into the report; its error raised after; `result` returned."""
    report.record(result.found)
    if result.error is not None:
        raise result.error
    return result


def plan_jobs(ctx: Context, part: str, prepared: Prepared, tolerance: Callable[[Resolved], Tolerance],
              drift: str | None = None) -> list[Job]:
    """The jobs of one part: each target of `prepared`, taking `prepared.irs[its precision]` where
    the optimisation stage applies it and the fp32 IR (`fp32_for`) where its converter does, judged by
    `tolerance(its precision as delivered)`; each target's routes, and every target's preflight
    run (one `preflight` stage) before anything is emitted. `drift`: why the IR may not be used
    (it fails parity with the source), so that only the routes reading the source alone remain."""
    request = ctx.request
    jobs = []
    for target, r in prepared.resolved.items():
        staged = r.stage == "optimize" and r.precision in prepared.irs
        ir = prepared.irs[r.precision] if staged else prepared.fp32_for(target)
        delivered = ir.provenance.get("precision", "fp32") if staged else r.precision
        options = request.emit_options(target, delivered, prepared.target_options.get(target))
        judged = replace(r, precision=delivered, judged_as=r.judged_as if delivered == r.precision else delivered)
        jobs.append(Job(target, part, ir, r, options, tolerance(judged),
                        fallback_reason=prepared.fallback.get(r.precision) if delivered != r.precision else None))
    with ctx.step(f"preflight{':' + part if part else ''}"):
        plan_routes(jobs, request.options.route, drift)
    return jobs


def plan_routes(jobs: list[Job], route: str, drift: str | None = None) -> None:
    """Each job's routes (`emitters/routes.py`), the one place they are pruned: without the ONNX route
    when the IR drifted from the source (`drift`), and the ONNX route's preflight for every target
    that starts with it: a refusal fails the run (all targets' refusals in one error) unless a native
    route can follow, which is then tried alone."""

    checked: dict[str, Job] = {}
    for job in jobs:
        job.plan = p = plan(job.ir, job.target, route, job.options, get_emitter(job.target))
        if drift:
            p.routes = [r for r in p.routes if r.name != "onnx"]
            p.notes.append(f"onnx route not taken: {drift}")
        if p.routes[0].name != "onnx":
            continue
        if len(p.routes) == 1:
            checked[job.target] = job
            continue
        pre = p.routes[0].emitter.preflight(job.ir, job.options)
        if not pre.ok:
            p.notes.append(f"onnx route not taken: {pre.runtime} cannot convert {pre.op_counts()}")
            p.routes.pop(0)
    for ir in {id(j.ir): j.ir for j in checked.values()}.values():
        names = [t for t, j in checked.items() if j.ir is ir]
        first = checked[names[0]].options
        check_targets(ir, names, replace(first, target=None))


@dataclass(frozen=True)
class Fallback:
    """A precision asked for and not delivered: the artifact is fp32 (the user allowed it)."""

    requested: str
    reason: str


@dataclass(frozen=True)
class JobResult:
    """What one job delivered: its artifact's report entry (None when none was written; its `precision`
    is the one the artifact has), the fallback that led to an fp32 artifact, what its validation found,
    the warnings for the user, and the error it ended with (None: it is good). A route or precision
    tried and given up leaves no result behind: only the one returned is recorded."""

    name: str
    entry: dict | None = None
    fallback: Fallback | None = None
    check: ArtifactCheck | None = None
    warnings: tuple[str, ...] = ()
    error: ModelportError | None = None

    def findings(self, *, listed: bool) -> Findings:
        """Its report sections; `listed`: its failure is named among the targets that failed (several jobs)."""
        found = Findings(warnings=list(self.warnings))
        if self.entry is not None:
            entry = dict(self.entry)
            if self.fallback is not None:
                entry["precision_fallback"] = {"requested": self.fallback.requested, "reason": self.fallback.reason}
            found.artifacts.append(entry)
        if self.check is not None and self.check.parity is not None:
            found.parity.append(entry_of(self.check.parity))
        if self.check is not None and self.check.generation is not None:
            found.generation.append(entry_of(self.check.generation))
        if self.error is not None and listed:
            found.target_failures.append({"target": self.name, **self.error.to_dict()})
        return found


def run_jobs(jobs: list[Job], task, ctx: Context) -> StageResult:
    """Every job, each target's failure kept while the others go on: what they found, and the error the
    run ends with (the one job's, or one naming every target that failed)."""
    results = [emit_by_routes(job, task, ctx) for job in jobs]
    found = Findings()
    for r in results:
        found.add(r.findings(listed=len(jobs) > 1))
    failures = [r for r in results if r.error is not None]
    if not failures:
        return StageResult(found)
    if len(jobs) == 1:
        return StageResult(found, failures[0].error)
    return StageResult(found, ValidationError(f"{len(failures)} of {len(jobs)} targets failed: "
                                  + "; ".join(f"{r.name}: {r.error.message}" for r in failures)))


RETRIED = (UnsupportedError, ValidationError, MissingDependencyError, StageError)  # another route may do better


def emit_by_routes(job: Job, task, ctx: Context) -> JobResult:
    """Emit `job` by its first route; under `--route auto` a route that fails to convert or to
    validate gives way to the next one, and the report says why (`route_notes`, a warning)."""

    notes = list(job.plan.notes)
    for i, route in enumerate(job.plan.routes):
        last = i == len(job.plan.routes) - 1
        said = {"route": route.name, "route_asked": job.plan.asked, "route_converter": route.converter, "route_notes": list(notes)}
        result = attempt(replace(job, extra={**job.extra, **said}), route, task, ctx)
        e = result.error
        if e is None:
            if i:
                return replace(result, warnings=(*result.warnings, f"{job.target}: {notes[-1]}; the artifact came by the {route.name} route"))
            return result
        if not isinstance(e, RETRIED):
            return result
        if last:
            return replace(result, error=e.with_reason(f"{e.reason} (after: {'; '.join(notes)})")) if notes else result
        notes.append(f"{route.name} route ({route.converter}) failed: {e.reason}" + (f" ({e.hint})" if e.hint else ""))
    raise AssertionError("a job has at least one route")


def attempt(job: Job, route, task, ctx: Context) -> JobResult:
    """Emit and validate one job by one route. When its precision cannot be delivered within
    tolerance and the user allowed a fallback, it is emitted again in FP32 and its result says so."""
    result = emit_once(job, route, task, ctx)
    e = result.error
    if not isinstance(e, ValidationError):
        return result
    precision = job.options.precision
    if precision in ("fp32", None) or not ctx.request.options.allow_precision_fallback:
        if precision not in ("fp32", None) and "--allow-precision-fallback" not in e.reason:
            return replace(result, error=e.with_reason(f"--precision {precision} cannot be delivered for {job.target}: {e.reason} "
                                                       "(--allow-precision-fallback accepts an FP32 artifact instead)"))
        return result
    fp32 = replace(job, options=replace(job.options, precision="fp32"),
                   tolerance=task.tolerance(replace(job.resolved, precision="fp32", judged_as="fp32")))
    retried = emit_once(fp32, route, task, ctx)
    if retried.error is not None:
        return retried
    warning = f"{job.target}: --precision {job.resolved.precision} could not be delivered ({e.reason}); the artifact is fp32"
    return replace(retried, fallback=Fallback(job.resolved.precision, e.reason), warnings=(*retried.warnings, warning))


def emit_once(job: Job, route, task, ctx: Context) -> JobResult:
    """Write the artifact into the staging folder (OUT/<part>/ for a part), have the task validate
    it, and return what that found; a conversion or a validation that fails is the result's error."""
    folder = ctx.stage / job.part if job.part else ctx.stage
    folder.mkdir(exist_ok=True)
    try:
        with ctx.step(f"emit:{job.target}{job.suffix}") as emitted:
            emitted.note(route=route.name)
            try:
                artifact = route.emitter.emit(job.ir, folder, job.options)
            except ModelportError as e:  # a converter's page of internals: one line here, all of it in report.json
                short = e.shortened()
                if short is e:
                    raise
                raise short from e
    except ModelportError as e:
        return JobResult(job.name, error=e)
    entry = artifact.to_dict(ctx.stage)
    if job.part:
        entry["part"] = job.part
    entry.update({k: v for k, v in job.extra.items() if v or k != "route_notes"})
    entry["requested_precision"] = job.resolved.precision
    # the optimisation stage delivered fp32 instead of the precision asked
    fallback = Fallback(job.resolved.precision, job.fallback_reason) \
        if job.fallback_reason and artifact.precision != job.resolved.precision else None
    try:
        check = task.validate(job, artifact, route)
    except ModelportError as e:
        return JobResult(job.name, entry, fallback, error=e)
    entry.update(check.entry)
    if check.failure is not None:
        return JobResult(job.name, entry, fallback, check=check, error=check.failure)
    return JobResult(job.name, entry, fallback, check=check, warnings=(*artifact.warnings, *check.warnings))
