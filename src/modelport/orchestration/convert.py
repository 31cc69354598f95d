"""The convert pipeline, one for every task and target: parse → optimise → emit → validate → report.

    decide     orchestration/request.py: the task and its pipeline, each target's precision
               (modelport.resolve.precisions), the options, the output folder: exit 2 before any work
    preflight  the task's checks that need the source but no work (memory, safety)
    parse      the task's parser: the IR and the references every later stage is judged against
    prepare    per part: the IR checked against the source, the optimisation stage, one job per
               target (orchestration/jobs.py)
    emit, validate  each job, by its routes, validated as the task judges (parity on the sample
               sets; generation for decoder LMs)
    report     report.json (and report.html), packages for serving systems

The task is an object made per run from `request.PIPELINES` (orchestration/forward.py,
orchestration/text_generation.py) with `preflight()`, `parse() -> Parsed` ({part: IR}),
`prepare(part, ir) -> Planned` (its jobs), `validate(job, artifact, route) -> ArtifactCheck`,
`tolerance(resolved)` and `finish(stage) -> StageResult`; it is a context manager that owns the run's
scratch space. Each stage returns what it found (orchestration/jobs.py: `StageResult`, each job's
`JobResult`) and the report is written from those results alone (`recorded`), so an attempt given
up (another route, an fp32 retry) leaves nothing in it. Everything is written into a staging
folder beside OUT_DIR and renamed into place at the end, so a failed run (bad input, parity failure, crash) leaves no output. A requested precision
is delivered within tolerance or the run fails (exit 4), unless the user allowed a fallback:
then the artifact is FP32 and the report and the terminal say so (`requested_precision`,
`precision_fallback`, `warnings`).
"""

from __future__ import annotations

from pathlib import Path

from modelport.errors import ModelportError
from modelport.orchestration.jobs import Context, StageCallback, recorded, run_jobs
from modelport.orchestration.options import ConvertOptions
from modelport.orchestration.request import PIPELINES, decide
from modelport.run.staging import staged_dir
from modelport.validation.report import Run

__all__ = ["ConvertOptions", "convert"]


def convert(source, output_dir: str | Path, options: ConvertOptions | None = None, *, command: str = "convert",
            on_stage: StageCallback | None = None, **kwargs) -> dict:
    """Convert `source` (a path, 'zoo:NAME' or an nn.Module) into OUT_DIR; returns the report.

    `command`: the report's command name (`optimize` and `emit` run this pipeline too). Raises a
    ModelportError (with `.report` holding the failed run's report) on failure (`Run` ends the command).
    """

    options = options or ConvertOptions(**kwargs)
    with Run(command) as report:
        request = decide(source, output_dir, options)
        ctx = Context(request, report, on_stage)
        with PIPELINES.load(request.pipeline)(ctx) as task:
            task.preflight()
            parts = recorded(report, task.parse()).parts
            jobs = [job for part, ir in parts.items() for job in recorded(report, task.prepare(part, ir)).jobs]
            with staged_dir(request.out, request.inputs, force=options.force, keep_failed=options.keep_failed) as stage:
                ctx.stage = stage
                try:
                    recorded(report, run_jobs(jobs, task, ctx))
                    recorded(report, task.finish(stage))
                    if request.packages:
                        from modelport.orchestration.package import package_converted

                        bundles = package_converted(stage, report, request.packages, request.options.package, on_stage=on_stage)
                        report.record(bundles)
                    report.write(stage)
                except ModelportError as e:
                    if options.keep_failed:  # OUT.failed/report.json: the run as far as it got, and why it failed
                        report.write_failed(stage, e.exit_code, e.to_dict())
                    raise
    return report.to_dict()
