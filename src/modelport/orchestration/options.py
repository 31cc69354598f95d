"""`ConvertOptions`: what a conversion is asked to do, as the user said it (`convert`, `emit` and the
Python API). Nothing here is decided: the task, each target's precision and its options object
are resolved once, in `orchestration/request.py`, before any work."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelport.dims import as_dim_spec
from modelport.emitters.routes import ROUTES
from modelport.ir import TensorSpec
from modelport.optimize.pipeline import OptimizeOptions
from modelport.packaging import PackageOptions, parse_systems
from modelport.parsers.huggingface import task_name
from modelport.parsers.tf_common import TFSourceOptions
from modelport.registry import choice
from modelport.resolve.specs import parse_arch_args, parse_input_spec
from modelport.validation import Tolerance, tolerance_for

if TYPE_CHECKING:
    from modelport.orchestration.text_generation_options import TextGenerationOptions


@dataclass
class ConvertOptions:
    """A conversion's options: the run's own fields, and the options classes of the stages it runs.

    Each stage's options are declared (and validated) once, in the module that owns them:
    `tensorflow` (parsers.tf_common.TFSourceOptions), `optimize` (optimize.pipeline.OptimizeOptions),
    `target_options` (target name -> an instance of its descriptor's `options` class, e.g.
    {"tflite": TFLiteOptions(layout="nhwc")}; modelport.targets), `text_generation`
    (orchestration.text_generation_options.TextGenerationOptions) and `package` (packaging.PackageOptions).
    The run's `precision` (None: each target's own default, modelport.resolve.precisions), `calibration`,
    `accuracy_budget`, `strict` and `allow_precision_fallback` apply to every stage.
    """

    targets: list[str] = field(default_factory=lambda: ["onnx"])
    route: str = "auto"  # auto | native | onnx: how each target is reached (emitters/routes.py)
    framework: str | None = None
    inputs: list[TensorSpec] = field(default_factory=list)
    output_names: list[str] | None = None
    arch: str | None = None
    arch_args: dict[str, Any] | str | list[str] = field(default_factory=dict)  # --arch-args: a dict, or the CLI's NAME=VALUE texts
    state_dict_key: str | None = None  # --state-dict-key: the checkpoint entry holding the weights
    trust: bool = False
    opset: int | None = None
    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    output_tolerances: dict[str, dict[str, float]] = field(default_factory=dict)  # {"probs": {"atol": 0.1}}
    scaled_atol: bool = True  # atol times each output's scale (False: an absolute accuracy budget)
    precision: str | None = None  # None: each target's own default (modelport.resolve.precisions)
    calibration: str | None = None  # .npz of named inputs or a folder of images (optimisation stage and emitters)
    accuracy_budget: str | None = None  # --accuracy-budget as written; the task reads it (precision passes, generation)
    sample_dims: dict[str, int] = field(default_factory=dict)
    # dims declared a range or a list of sizes ({"batch": "1..8"}, or dims.DimSpec values): kept dynamic
    # within them by the targets that can (modelport.dims)
    dim_bounds: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    data: str | Path | None = None  # --data: .npz of named sample inputs used instead of random ones
    values: list[str] | dict[str, float] = field(default_factory=list)  # --value NAME=V (or {NAME: V}): broadcast to that input
    # the sample sets every hop is judged on (sample_sets.sample_sets): random ones with the first, structured ones or not
    sampling: dict[str, Any] = field(default_factory=lambda: {"randoms": 3, "structured": True})
    force: bool = False
    keep_failed: bool = False  # a failed run's files go to OUT.failed/ (with FAILED.json) instead of being removed
    strict: bool = False  # a pass that breaks parity, or a reference that ignores its input, fails the run
    stage_timeout: float | None = None  # seconds a stage may run (stage_limits.py; None: MODELPORT_STAGE_TIMEOUT, else the default)
    stage_memory: int | str | None = None  # bytes (or "8G") a stage may hold (None: MODELPORT_STAGE_MEMORY, else by the model)
    allow_precision_fallback: bool = False  # deliver FP32 when the requested precision cannot hold parity
    tensorflow: TFSourceOptions = field(default_factory=TFSourceOptions)
    optimize: OptimizeOptions | str | None = None  # or a level name ("all", "auto"); None: no stage unless precision asks
    target_options: dict[str, Any] = field(default_factory=dict)  # target -> its options object; absent: the defaults
    # Hugging Face folders: what to export (parsers.huggingface.TASKS), else inferred from config.json;
    # "text-generation": a decoder LM folder, exported with a KV cache (orchestration/text_generation.py)
    task: str | None = None
    text_generation: TextGenerationOptions | None = None  # the text-generation task's options (None: the defaults)
    packages: list[str] = field(default_factory=list)  # serving systems to package for (OUT/packages/<system>/)
    package: PackageOptions = field(default_factory=lambda: PackageOptions(trust=True))  # may trace the code it emitted

    def __post_init__(self):
        # The Python API accepts the CLI's spec strings: inputs=["input:batch,3,224,224"].

        self.inputs = [parse_input_spec(s) if isinstance(s, str) else s for s in self.inputs]
        if not isinstance(self.arch_args, dict):

            self.arch_args = parse_arch_args(self.arch_args)
        if isinstance(self.targets, str):
            self.targets = [t.strip() for t in self.targets.split(",") if t.strip()]
        self._declare_dims()
        if isinstance(self.optimize, str):
            self.optimize = OptimizeOptions(level=self.optimize)
        if self.task is not None:

            self.task = task_name(self.task)

        self.route = choice(self.route or "auto", ROUTES, "route")
        self.packages = parse_systems(self.packages) if self.packages else []

    def _declare_dims(self) -> None:
        """`sample_dims` may hold the CLI's texts ("1..8", "128,256"): those move to `dim_bounds`, and
        every range or list gets its sample size (`dims.DimSpec.sample`) unless one is given."""

        bounds = {name: as_dim_spec(v) for name, v in self.dim_bounds.items()}
        for name, value in list(self.sample_dims.items()):
            if not isinstance(value, int):
                spec = bounds.setdefault(name, as_dim_spec(value))
                self.sample_dims[name] = spec.sample if spec.kind != "fixed" else spec.low
        self.dim_bounds = {name: spec for name, spec in bounds.items() if spec.kind != "fixed"}
        for name, spec in self.dim_bounds.items():
            self.sample_dims.setdefault(name, spec.sample)

    @property
    def level(self) -> str | None:
        """The optimisation level asked for (`--optimize`), or None."""
        return self.optimize.level if self.optimize is not None else None

    def tolerance(self, precision: str | None = None, zoo_tol: dict | None = None, *, source: str | None = None) -> Tolerance:
        """The tolerance an artifact of `precision` is judged with: its defaults (widened to those of the
        precision the source computes at, `source`), a zoo entry's, the user's flags."""
        return tolerance_for(precision or "fp32", zoo=zoo_tol,
                             user={"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine},
                             overrides=self.output_tolerances, scaled=self.scaled_atol, source=source)
