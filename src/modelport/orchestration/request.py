"""A conversion decided before any work: the task and the pipeline that runs it, the targets and
each one's precision (modelport.resolve.precisions), each target's options object, the serving systems,
and the output folder checked. Every refusal that needs no model (exit 2) happens here, so a
refused run writes nothing and loads nothing; no other module makes these decisions again.

The task decision: `--task text-generation`, or a Hugging Face folder whose config names a
`...ForCausalLM` architecture when no task is given, runs the text-generation pipeline (a task
with a pipeline of its own, whose precisions each target declares in `Target.tasks`); every
other source and task runs the forward pipeline (one run per input, judged by parity).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelport.orchestration.options import ConvertOptions
from modelport.resolve.precisions import Resolved, resolve
from modelport.registry import Registry

TEXT_GENERATION = "text-generation"
FORWARD = "forward"

# the pipelines a task runs in: "module:class", the class made per run with the run's Context
PIPELINES = Registry("task pipeline", {FORWARD: "modelport.orchestration.forward:ForwardRun",
                                       TEXT_GENERATION: "modelport.orchestration.text_generation:TextGenerationRun"})


@dataclass
class Request:
    """What the run does, decided once: read by every stage, changed by none."""

    source: Any  # a path, "zoo:NAME" or a Python object, as given
    out: Path
    options: ConvertOptions
    pipeline: str  # a PIPELINES name
    precisions: dict[str, Resolved]  # per target (canonical names, in --to order)
    packages: list[str]
    inputs: list[Path]  # the paths no output may overwrite
    budget: Any = None  # the forward pipeline's accuracy budget (a Tolerance) from --accuracy-budget, or None

    @property
    def targets(self) -> list[str]:
        return list(self.precisions)

    def target_options(self, target: str, **run: Any):
        """`target`'s options object: the one given (`ConvertOptions.target_options`), else its class's
        defaults with the fields its class fills from the run (`targets.option(run=...)`) taken from
        `run` or the request (the accuracy budget); None when the target has none."""
        from modelport.targets import get, load, run_filled

        given = self.options.target_options.get(target)
        if given is not None or get(target).options is None:
            return given
        cls = load(get(target).options)
        values = {"budget": self.budget, **run}
        return cls(**{f: values[key] for f, key in run_filled(cls).items() if values.get(key) is not None})


def pipeline_of(source, task: str | None) -> str:
    """The pipeline `source` converts in: the text-generation one when asked for with --task, or for
    a Hugging Face folder whose config names a `...ForCausalLM` architecture when no task is given."""
    if task is not None:
        return TEXT_GENERATION if task == TEXT_GENERATION else FORWARD
    if not isinstance(source, (str, Path)) or str(source).startswith("zoo:"):
        return FORWARD
    from modelport.parsers import hf_decoder

    return TEXT_GENERATION if hf_decoder.sniff(Path(source)) else FORWARD


def decide(source, output_dir, options: ConvertOptions) -> Request:
    """The Request for converting `source` into `output_dir`: exit 2 before any work for unknown
    targets or serving systems, a precision a target does not take, a task a target writes no
    model of, or an output folder that must not be written."""
    from modelport.orchestration.source import source_inputs
    from modelport.run.staging import check_output

    pipeline = pipeline_of(source, options.task)
    task = TEXT_GENERATION if pipeline == TEXT_GENERATION else options.task
    precisions = resolve(options.targets, options.precision, task)
    packages = []
    if options.packages:
        from modelport.packaging import parse_systems
        packages = parse_systems(options.packages)
    budget = None
    if pipeline == FORWARD:
        from modelport.optimize.pipeline import parse_budget

        budget = options.optimize.budget if options.optimize is not None else None
        if budget is None and options.accuracy_budget:
            budget = parse_budget(options.accuracy_budget)
    from modelport.run.stage_limits import Limits

    Limits.of(options.stage_timeout, options.stage_memory)  # a bad bound is exit 2 before any work
    out = Path(output_dir)
    inputs = source_inputs(source, options)
    check_output(out, inputs, force=options.force)
    return Request(source, out, options, pipeline, precisions, packages, inputs, budget)
