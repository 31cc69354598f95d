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

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelport.emitters import EmitOptions
from modelport.errors import BadInputError
from modelport.optimize.pipeline import parse_budget
from modelport.orchestration.options import ConvertOptions
from modelport.orchestration.source import source_inputs
from modelport.orchestration.text_generation_options import TextGenerationOptions, refusals
from modelport.parsers import hf_decoder
from modelport.registry import Registry
from modelport.resolve.precisions import Resolved, resolve
from modelport.run.stage_limits import Limits
from modelport.run.staging import check_output
from modelport.runtimes import CPU_RUNTIMES
from modelport.targets import TargetOptions
from modelport.validation import Tolerance
from modelport.validation.generation import GenerationBudget

if TYPE_CHECKING:
    from modelport.emitters import EmitOptions

TEXT_GENERATION = "text-generation"
FORWARD = "forward"

# the pipelines a task runs in: "module:class", the class made per run with the run's Context
PIPELINES = Registry("task pipeline", {FORWARD: "modelport.orchestration.forward:ForwardRun",
                                       TEXT_GENERATION: "modelport.orchestration.text_generation:TextGenerationRun"})


@dataclass
class Request:
    """What the run does, decided once: read by every stage, changed by none."""

    source: str | Path | Callable  # a path, "zoo:NAME" or a Python model (a torch module, a Keras model, a tf.function), as given
    out: Path
    options: ConvertOptions
    pipeline: str  # a PIPELINES name
    precisions: dict[str, Resolved]  # per target (canonical names, in --to order)
    packages: list[str]
    inputs: list[Path]  # the paths no output may overwrite
    budget: Tolerance | None = None  # the forward pipeline's accuracy budget from --accuracy-budget, or None
    generation_budget: GenerationBudget | None = None  # the text-generation pipeline's, from its --budget or --accuracy-budget
    limits: Limits = field(default_factory=Limits)  # each stage's time and memory bounds (stage_limits.py)

    @property
    def targets(self) -> list[str]:
        return list(self.precisions)

    def emit_options(self, target: str, precision: str, given: TargetOptions | None = None) -> EmitOptions:
        """What `target`'s emitter reads when its artifact is made at `precision`: the run's opset and
        calibration, and its own options (`given`, else `target_options`). The one place they are put together."""

        return EmitOptions(precision=precision, opset=self.options.opset, calibration=self.options.calibration,
                           target=given or self.target_options(target))

    def target_options(self, target: str, **run: Any) -> TargetOptions | None:
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

    return TEXT_GENERATION if hf_decoder.sniff(Path(source)) else FORWARD


def decide(source, output_dir, options: ConvertOptions) -> Request:
    """The Request for converting `source` into `output_dir`: exit 2 before any work for unknown
    targets (ConvertOptions names the serving systems itself), a precision a target does not take,
    a task a target writes no model of, options the task's pipeline cannot deliver, a bad bound, or
    an output folder that must not be written."""

    # the checks that read the options alone first, then those that look up the registries below
    pipeline = pipeline_of(source, options.task)
    _refuse_misplaced_options(source, options, pipeline)
    _refuse_samples_outside_bounds(options)
    inputs = source_inputs(source, options)
    budget = generation_budget = None
    if pipeline == TEXT_GENERATION:
        generation_budget = _refuse_text_generation(source, options)
    else:
        budget = options.optimize.budget if options.optimize is not None else None
        if budget is None and options.accuracy_budget:
            budget = parse_budget(options.accuracy_budget)
    precisions = resolve(options.targets, options.precision, TEXT_GENERATION if pipeline == TEXT_GENERATION else options.task)
    if pipeline == FORWARD and auto_optimize(options.optimize):
        others = [t for t in precisions if t not in AUTO_FEEDS]
        if others:
            raise BadInputError(f"--optimize auto picks an onnxruntime variant or an OpenVINO one; it cannot feed {', '.join(others)}",
                                hint="use a named level (e.g. --optimize all) with those targets, or convert to onnx/ort/openvino only")
    limits = Limits.of(options.stage_timeout, options.stage_memory)
    out = Path(output_dir)
    check_output(out, inputs, force=options.force)
    return Request(source, out, options, pipeline, precisions, list(options.packages), inputs, budget, generation_budget, limits)


def _refuse_misplaced_options(source, options: ConvertOptions, pipeline: str) -> None:
    """Options given where they do nothing: --arch-args/--state-dict-key without --arch, the run's
    fields on its OptimizeOptions, and (forward pipeline) --runtimes without --optimize auto."""
    zoo_source = isinstance(source, str) and source.startswith("zoo:")
    if options.arch_args and not (options.arch or zoo_source):
        raise BadInputError("--arch-args are keyword arguments for the --arch constructor; pass --arch too")
    if options.state_dict_key and not options.arch:
        raise BadInputError("--state-dict-key picks the weights of a checkpoint loaded into --arch; pass --arch too")
    o = options.optimize
    if o is not None and (o.precision != "fp32" or o.calibration or o.strict or o.allow_fallback):
        raise BadInputError("set precision, calibration, strict and allow_precision_fallback on ConvertOptions, "
                            "not on its OptimizeOptions: they apply to every stage of the run")
    if o is not None and o.runtimes and not auto_optimize(o) and pipeline == FORWARD:
        raise BadInputError("--runtimes names the runtimes --optimize auto compares", hint="add --optimize auto")


def _refuse_samples_outside_bounds(options: ConvertOptions) -> None:
    for name, spec in options.dim_bounds.items():
        size = options.sample_dims[name]
        if not spec.contains(size):
            raise BadInputError(f"the sample size {name}={size} is outside the sizes declared for it ({spec})",
                                hint="sample inside the declared sizes, or leave the sample size to the bounds")


AUTO_FEEDS = {t for names in CPU_RUNTIMES.values() for t in names}  # the targets an --optimize auto winner can feed


def auto_optimize(asked) -> bool:
    """Whether the optimisation options ask for `--optimize auto` (a level, no passes named)."""
    return asked is not None and asked.level == "auto" and not asked.passes


def _refuse_text_generation(source, options: ConvertOptions) -> GenerationBudget | None:
    """The text-generation pipeline takes a folder, and only the options it can deliver; returns its
    generation budget (parsed here, once)."""

    if not isinstance(source, (str, Path)) or str(source).startswith("zoo:"):
        raise BadInputError(f"--task text-generation converts a Hugging Face folder (config.json + safetensors), "
                            f"not {type(source).__name__ if not isinstance(source, str) else source}")
    runtimes = options.optimize.runtimes if options.optimize is not None else None
    return refusals(options.text_generation or TextGenerationOptions(), options.level, options.precision, runtimes,
                    options.accuracy_budget)
