"""The convert pipeline: parse → (optimise) → emit each target → validate each artifact → report.

Everything is written into a staging folder beside OUT_DIR and renamed into place at the end, so
a failed run (bad input, parity failure, crash) leaves no output. Parity is checked per hop and
end to end against the source framework's reference outputs; a breach is exit 4, never a warning.

A requested precision is delivered within tolerance or the run fails (exit 4), unless the user
allowed a fallback (`allow_precision_fallback`): then the artifact is FP32 and the report and
the terminal say so (`requested_precision`, `precision_fallback`, `warnings`). A source output
that does not change between two sample sets is recorded (`reference_varies: false` in the
contract), warned about, and fails the run under `strict`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field, replace
from pathlib import Path
from typing import Any

from modelport.emitters import EmitOptions
from modelport.emitters.routes import kind_of
from modelport.errors import BadInputError, ModelportError, ValidationError
from modelport.ir import IRModel, SourceRef, TensorSpec
from modelport.optimize.pipeline import OptimizeOptions
from modelport.parsers.tf_common import TFSourceOptions
from modelport.serving import PackageOptions
from modelport.validation import Tolerance, check, check_override_names, tolerance_for
from modelport.validation.report import Report, Run, run_stage


@dataclass
class ConvertOptions:
    """A conversion's options: the run's own fields, and the options classes of the stages it runs.

    Each stage's options are declared (and validated) once, in the module that owns them:
    `tensorflow` (parsers.tf_common.TFSourceOptions), `optimize` (optimize.pipeline.OptimizeOptions),
    `target_options` (target name -> an instance of its descriptor's `options` class, e.g.
    {"tflite": TFLiteOptions(layout="nhwc")}; modelport.targets) and `package`
    (serving.PackageOptions). `tflite=`, `tensorrt=` and `openvino=` are accepted as keywords and
    land in `target_options`. The run's `precision`, `calibration`, `strict` and
    `allow_precision_fallback` apply to every stage.
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
    precision: str | None = None  # None: the targets' default (their descriptors' first precision) when they share one, else fp32
    calibration: str | None = None  # .npz of named inputs or a folder of images (optimisation stage and emitters)
    sample_dims: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    data: str | Path | None = None  # --data: .npz of named sample inputs used instead of random ones
    values: list[str] | dict[str, float] = field(default_factory=list)  # --value NAME=V (or {NAME: V}): broadcast to that input
    # the sample sets every hop is judged on (samples.sample_sets): random ones with the first, structured ones or not
    sampling: dict[str, Any] = field(default_factory=lambda: {"randoms": 3, "structured": True})
    force: bool = False
    keep_failed: bool = False  # a failed run's files go to OUT.failed/ (with FAILED.json) instead of being removed
    strict: bool = False  # a pass that breaks parity, or a reference that ignores its input, fails the run
    allow_precision_fallback: bool = False  # deliver FP32 when the requested precision cannot hold parity
    tensorflow: TFSourceOptions = field(default_factory=TFSourceOptions)
    optimize: OptimizeOptions | str | None = None  # or a level name ("all", "auto"); None: no stage unless precision asks
    target_options: dict[str, Any] = field(default_factory=dict)  # target -> its options object; absent: the defaults
    task: str | None = None  # Hugging Face folders: what to export (parsers.huggingface.TASKS); else inferred from config.json
    packages: list[str] = field(default_factory=list)  # serving systems to package for (OUT/packages/<system>/)
    package: PackageOptions = field(default_factory=lambda: PackageOptions(trust=True))  # may trace the code it emitted
    fallback_reason: str | None = None  # set by the optimisation stage when it delivered FP32 instead
    command: str = "convert"  # the report's command name
    task: str | None = None  # "text-generation": a decoder LM folder, exported with a KV cache (orchestration/text_generation.py)
    text_generation: Any = None  # its TextGenerationOptions (None: the defaults)
    tflite: InitVar[Any] = None  # keywords for target_options["tflite"], ["tensorrt"], ["openvino"]
    tensorrt: InitVar[Any] = None
    openvino: InitVar[Any] = None

    def __post_init__(self, tflite=None, tensorrt=None, openvino=None):
        given = {"tflite": tflite, "tensorrt": tensorrt, "openvino": openvino}
        self.target_options = {**{k: v for k, v in given.items() if v is not None}, **self.target_options}
        # The Python API accepts the CLI's spec strings: inputs=["input:batch,3,224,224"].
        from modelport.specs import parse_input_spec

        self.inputs = [parse_input_spec(s) if isinstance(s, str) else s for s in self.inputs]
        if not isinstance(self.arch_args, dict):
            from modelport.specs import parse_arch_args

            self.arch_args = parse_arch_args(self.arch_args)
        if isinstance(self.targets, str):
            self.targets = [t.strip() for t in self.targets.split(",") if t.strip()]
        if self.precision is None:
            self.precision = default_precision(self.targets)
        if isinstance(self.optimize, str):
            self.optimize = OptimizeOptions(level=self.optimize)
        if self.task is not None:
            from modelport.parsers.huggingface import task_name

            self.task = task_name(self.task)
        from modelport.orchestration.text_generation import TASK, TextGenerationOptions

        if self.task == TASK:
            self.text_generation = self.text_generation or TextGenerationOptions()
        elif self.precision == "int4":
            raise BadInputError("--precision int4 (weight-only) is for --task text-generation")
        elif self.precision == "auto":
            raise BadInputError("--precision auto is for --task text-generation --optimize auto "
                                "(for other models --optimize auto compares precisions itself)")
        from modelport.emitters.routes import ROUTES
        from modelport.registry import choice

        self.route = choice(self.route or "auto", ROUTES, "route")
        o = self.optimize
        if o is not None and (o.precision != "fp32" or o.calibration or o.strict or o.allow_fallback):
            raise BadInputError("set precision, calibration, strict and allow_precision_fallback on ConvertOptions, "
                                "not on its OptimizeOptions: they apply to every stage of the run")

    def emitter_options(self, target: str):
        """The options object of `target`'s emitter: `target_options[target]`, else its descriptor's
        options class's defaults (None: it has none). A class with a `budget` field takes the
        optimisation stage's accuracy budget by default (OpenVINO's INT8 accuracy control)."""
        from modelport.targets import get, load

        given = self.target_options.get(target)
        if given is not None or get(target).options is None:
            return given
        cls = load(get(target).options)
        budget = self.optimize.budget if isinstance(self.optimize, OptimizeOptions) else None
        if budget is not None and "budget" in getattr(cls, "__dataclass_fields__", {}):
            return cls(budget=budget)
        return cls()

    def tolerance(self, precision: str | None = None, zoo_tol: dict | None = None) -> Tolerance:
        return tolerance_for(precision or self.precision, zoo=zoo_tol,
                             user={"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine},
                             overrides=self.output_tolerances, scaled=self.scaled_atol)


StageCallback = Callable[[str], None]


def default_precision(targets: list[str]) -> str:
    """The precision a run that names none converts at: the default its targets share (a descriptor's
    first precision: fp16 for Core ML), else fp32."""
    from modelport import targets as table

    defaults = set()
    for name in targets:
        try:
            defaults.add(table.get(str(name)).precisions[0])
        except BadInputError:  # an unknown name is refused where the targets are resolved
            defaults.add("fp32")
    return defaults.pop() if len(defaults) == 1 else "fp32"


def source_inputs(source, options: ConvertOptions | None = None) -> list[Path]:
    """The input paths an output must not overwrite (model file, its folder's data files, calibration data)."""
    paths = [Path(options.calibration)] if options and options.calibration else []
    paths += [Path(options.data)] if options and options.data else []
    paths += [Path(options.tensorflow.weights)] if options and options.tensorflow.weights else []
    if not isinstance(source, (str, Path)) or str(source).startswith("zoo:"):
        return paths
    p = Path(source)
    paths.append(p)
    if p.suffix.lower() == ".onnx" and p.is_file():
        from modelport.onnx_io import external_files

        try:
            paths += external_files(p)
        except ModelportError:
            pass  # reported properly when the parser loads the file
    return paths


def resolve_source(source, options: ConvertOptions):
    """(source object or path, SourceSpec, zoo tolerance) for a path, 'zoo:NAME' or a Python object."""
    from modelport.file_checks import check_model_file
    from modelport.parsers import SourceSpec

    zoo_tol = None
    if isinstance(source, str) and source.startswith("zoo:"):
        from modelport import zoo

        spec = zoo.source_spec(source[4:])
        zoo_tol = zoo.get(source[4:]).tolerance
        if options.inputs:
            from modelport.parsers.contract import merge_specs

            spec.inputs = merge_specs(spec.inputs, options.inputs)
        spec.sample_dims.update(options.sample_dims)
    elif isinstance(source, (str, Path)):
        path = check_model_file(source)
        spec = SourceSpec(path=path, framework=options.framework, inputs=list(options.inputs),
                          sample_dims=dict(options.sample_dims))
        if options.arch and options.arch.startswith("zoo:"):
            from modelport import zoo

            zspec = zoo.source_spec(options.arch[4:])
            spec.sample_dims = {**zspec.sample_dims, **spec.sample_dims}
            zoo_tol = zoo.get(options.arch[4:]).tolerance
        source = path
    else:
        spec = SourceSpec(framework=options.framework, inputs=list(options.inputs), sample_dims=dict(options.sample_dims))
    spec.output_names = options.output_names or spec.output_names
    zoo_source = isinstance(source, str) and source.startswith("zoo:")
    if options.arch_args and not (options.arch or zoo_source):
        raise BadInputError("--arch-args are keyword arguments for the --arch constructor; pass --arch too")
    if options.state_dict_key and not options.arch:
        raise BadInputError("--state-dict-key picks the weights of a checkpoint loaded into --arch; pass --arch too")
    spec.arch = options.arch
    spec.arch_args = dict(options.arch_args)
    spec.state_dict_key = options.state_dict_key
    spec.trust = options.trust
    spec.opset = options.opset
    spec.seed = options.seed
    spec.sampling = dict(options.sampling)
    spec.given = pinned_inputs(options.data, options.values)
    spec.options.update(options.tensorflow.spec_options())
    if options.task:
        from modelport.parsers import huggingface

        if not (isinstance(source, Path) and huggingface.sniff(source)):
            raise BadInputError("--task applies to Hugging Face model folders (config.json + *.safetensors)",
                                path=source if isinstance(source, Path) else None)
        spec.options["task"] = options.task
    return source, spec, zoo_tol


def pinned_inputs(data, values: list[str]) -> dict:
    """The user's sample inputs: the arrays of the `data` .npz, then each `--value NAME=V` (which wins)."""
    from modelport.samples import load_data, parse_values

    texts = [f"{k}={v}" for k, v in values.items()] if isinstance(values, dict) else list(values)
    return {**(load_data(data) if data else {}), **parse_values(texts)}


# what the parser recorded about how it read the source that the report's `source` repeats
SOURCE_DETAILS = ("arch", "arch_args", "state_dict_key", "state_dict_prefix_removed")


def describe_source(source, ir: IRModel) -> dict:
    from modelport.file_checks import sha256_of

    info = {"path": ir.provenance.get("path"), "framework": ir.provenance.get("framework"),
            "format": ir.provenance.get("format")}
    info.update({k: ir.provenance[k] for k in SOURCE_DETAILS if ir.provenance.get(k) is not None})
    if isinstance(source, Path) and source.is_file():
        info.update(size=source.stat().st_size, sha256=sha256_of(source))
    return info


# The general route's peak resident memory (process tree) for a Hugging Face folder, estimated before any
# work from the fp32 size W of its safetensors' parameters: LIBRARIES + copies x W. Measured on
# random-init BERT-shaped folders, `--task feature-extraction --to onnx`: W = 1.0 GB peaked at 3.69 GB
# (validation's child reads, parses and copies the one-file artifact: about 3 W), W = 2.9 GB at 3.78 GB
# (external data from 1 GiB: 1.1 W); `--optimize all` on the 1.0 GB one at 5.64 GB (onnxruntime's
# transformer optimizer, about 4.9 W). Rounded up.
MEMORY_LIBRARIES = 1.0e9
MEMORY_COPIES = {"one file": 3.3, "external data": 1.4, "optimize": 5.2}


def check_memory(src, options: ConvertOptions, report: Report, *, on_stage: StageCallback | None = None) -> None:
    """Refuse (exit 2, before any work) a Hugging Face folder whose conversion is estimated to need more
    memory than is available, rather than be killed part way; the `preflight:memory` row records the
    figures. MODELPORT_AVAILABLE_MEMORY overrides the memory counted as available. Other sources:
    nothing to read the size from before loading them; no row."""
    from modelport import memory
    from modelport.onnx_io import EXTERNAL_DATA_THRESHOLD
    from modelport.orchestration.optimize_stage import wanted
    from modelport.parsers import huggingface

    if not isinstance(src, (str, Path)) or not Path(src).is_dir() or not huggingface.sniff(Path(src)):
        return
    files = huggingface.weight_files(Path(src))[0]
    if not files:
        return
    with run_stage(report, "preflight:memory", on_stage=on_stage) as row:
        parameters = huggingface.parameter_count(files)
        weights = 4 * parameters
        level = options.optimize.level if options.optimize is not None else None
        case = "optimize" if wanted(options) and level != "none" else \
            "external data" if weights >= EXTERNAL_DATA_THRESHOLD else "one file"
        need, free = int(MEMORY_LIBRARIES + MEMORY_COPIES[case] * weights), memory.available()
        row.note(parameters=parameters, estimated_peak_rss=need, available_memory=free, estimate=case)
    memory.refuse_if_short(need, free, why=f"{parameters / 1e6:,.0f} M parameters, {memory.fmt_bytes(weights)} in fp32, {case}",
                           path=src)


def validate_ir(ir: IRModel, tol: Tolerance, hop: str):
    """Run the IR's ONNX model in onnxruntime on the reference inputs and compare (the parity gate's
    own check: a large model is loaded from a file its weights wait in)."""
    from modelport.optimize.pipeline import check_parity

    return check_parity(ir, tol, hop)


def check_reference_varies(ir: IRModel, report: Report, *, strict: bool, path=None) -> None:
    """Warn about the source outputs that did not change between two sample sets (the contract
    records `reference_varies` per output), and fail under `strict`: parity against them proves nothing."""
    varies = ir.provenance.get("reference_varies") or {}
    fixed = [n for n, v in varies.items() if v is False]
    if not fixed:
        return
    text = (f"reference output(s) {fixed} do not change between two distinct sample inputs (or are all NaN/Inf): "
            "parity against them proves nothing about the conversion")
    if strict:
        raise ValidationError(text + " (--strict)", path=path)
    report.warn(text)


def emit_and_validate(emitter, target: str, ir: IRModel, stage: Path, eopts, options: ConvertOptions, report: Report,
                      zoo_tol, hop: str, *, on_stage: StageCallback | None = None, out: Path | None = None,
                      requested: str | None = None, part: str | None = None, route: dict | None = None,
                      retry: bool = False) -> None:
    """Emit one target and validate it. When its precision cannot be delivered within tolerance
    and the user allowed a fallback, the target is emitted again in FP32 and the report says so.
    A `part` of a source exported as several models is emitted into `stage/<part>/`. `route` goes
    into the artifact's entry; with `retry` (another route follows) a failed attempt's entries are
    dropped."""
    try:
        _emit_with_fallback(emitter, target, ir, stage, eopts, options, report, zoo_tol, hop, on_stage=on_stage, out=out,
                            requested=requested, part=part, route=route)
    except ModelportError:
        if retry:
            report.discard_attempt(target)
        raise
    finally:
        report.settle_attempt(target)


def emit_by_routes(plan, ir: IRModel, stage: Path, eopts, options: ConvertOptions, report: Report, zoo_tol, fw: str, *,
                   on_stage=None, out=None, requested=None, part: str | None = None) -> None:
    """Emit `plan.target` by its first route; under `--route auto` a route that fails to convert or
    to validate gives way to the next one, and the report says why (`route_notes`, a warning)."""
    from modelport.errors import MissingDependencyError, StageError, UnsupportedError

    notes = list(plan.notes)
    label = f"{part}: " if part else ""
    for i, r in enumerate(plan.routes):
        last = i == len(plan.routes) - 1
        route = {"route": r.name, "route_asked": plan.asked, "route_converter": r.converter, "route_notes": list(notes)}
        hop = f"{label}{fw}→{plan.target} ({'native, ' if r.name == 'native' else ''}end to end)"
        try:
            emit_and_validate(r.emitter, plan.target, ir, stage, eopts, options, report, zoo_tol, hop, on_stage=on_stage,
                              out=out, requested=requested, part=part, route=route, retry=not last)
            if i:
                report.warn(f"{plan.target}: {notes[-1]}; the artifact came by the {r.name} route")
            return
        except (UnsupportedError, ValidationError, MissingDependencyError, StageError) as e:
            if last:
                if notes:
                    raise e.with_reason(f"{e.reason} (after: {'; '.join(notes)})") from e
                raise
            notes.append(f"{r.name} route ({r.converter}) failed: {e.reason}")


def _emit_with_fallback(emitter, target, ir, stage, eopts, options, report, zoo_tol, hop, *, on_stage, out, requested, part,
                        route=None):
    try:
        _emit_once(emitter, target, ir, stage, eopts, options, report, zoo_tol, hop, on_stage=on_stage, out=out,
                   requested=requested, part=part, route=route)
    except ValidationError as e:
        if eopts.precision in ("fp32", None) or not options.allow_precision_fallback:
            if eopts.precision not in ("fp32", None) and "--allow-precision-fallback" not in e.reason:
                raise e.with_reason(f"--precision {eopts.precision} cannot be delivered for {target}: {e.reason} "
                                    "(--allow-precision-fallback accepts an FP32 artifact instead)") from e
            raise
        report.discard_attempt(target)  # the failed attempt's entries, replaced below
        requested = requested or eopts.precision
        fp32 = replace(eopts, precision="fp32")
        _emit_once(emitter, target, ir, stage, fp32, options, report, zoo_tol, hop, on_stage=on_stage, out=out,
                   requested=requested, part=part, route=route)
        report.set_precision_fallback(requested, e.reason)
        report.warn(f"{target}: --precision {requested} could not be delivered ({e.reason}); the artifact is fp32")


def _emit_once(emitter, target, ir, stage, eopts, options, report, zoo_tol, hop, *, on_stage, out, requested=None, part=None,
               route=None):
    folder = stage / part if part else stage
    folder.mkdir(exist_ok=True)
    with run_stage(report, f"emit:{target}" + (f":{part}" if part else ""), on_stage=on_stage) as emitted:
        if route:
            emitted.note(route=route["route"])
        artifact = emitter.emit(ir, folder, eopts)
    entry = artifact.to_dict(stage)
    if part:
        entry["part"] = part
    if route:
        entry.update({k: v for k, v in route.items() if v or k != "route_notes"})
    entry["requested_precision"] = requested or eopts.precision
    if entry["requested_precision"] != artifact.precision and options.fallback_reason:
        entry["precision_fallback"] = {"requested": entry["requested_precision"], "reason": options.fallback_reason}
    report.add_artifact(entry, attempt=target)
    if artifact.not_validated:
        note_not_validated(artifact, entry, ir, target, options, report, on_stage=on_stage, part=part, out=out)
    elif artifact.runner:
        ttol = options.tolerance(artifact.precision, zoo_tol)
        with run_stage(report, f"validate:{target}" + (f":{part}" if part else ""), on_stage=on_stage), \
                ir.weights_parked():  # the child's runtime loads the artifact; this process needs only the references
            parity = validate_artifact(artifact, ir, ttol, hop)
        for key in ("inference_precision", "plain_compile"):  # read back from the runtime by the validation
            if key in artifact.details:
                entry[key] = artifact.details[key]
        report.add_parity(parity, attempt=target)
        if artifact.details.get("validated_with"):
            entry["validated_with"] = artifact.details["validated_with"]
        parity.raise_if_failed(path=out)
        if "plain_compile" in entry:
            from modelport.runtimes.openvino import plain_compile_warning

            warning = plain_compile_warning(target, entry)
            if warning and options.strict and entry["plain_compile"].get("ok") is False:
                raise ValidationError(f"{warning} (--strict: a plain load must hold the tolerance)", path=out)
            if warning:
                report.warn(warning)
        checked = artifact.details.get("contract_check")
        if checked:
            entry["contract_check"] = checked
            if checked["fixed_dims"]:
                report.warn(f"{target}: the artifact fixes dynamic dims: {checked['fixed_dims']}; it takes those sizes only "
                            "(declare others with --dim NAME=N or --input NAME:SHAPE)")


def note_not_validated(artifact, entry: dict, ir: IRModel, target: str, options: ConvertOptions, report: Report, *,
                       on_stage=None, part: str | None = None, out: Path | None = None) -> None:
    """An artifact no runtime here can run (`Artifact.not_validated`: Core ML off macOS, a TensorRT
    plan without an engine): its I/O checked against the contract where a runner can describe it
    (nothing is run), `validated: false` and the reason in its entry, a warning; exit 4 under --strict."""
    if artifact.runner:
        with run_stage(report, f"validate:{target}" + (f":{part}" if part else ""), on_stage=on_stage) as checked:
            runner = artifact_runner(artifact)
            entry["contract_check"] = check_contract(runner, ir, artifact)
            if getattr(runner, "modules", None) is not None:
                entry["validated_with"] = {"process": "child", "frameworks": runner.modules}
            checked.note(ran=False)
    entry["validated"] = False
    entry["not_validated"] = artifact.not_validated
    text = f"{target}: the artifact is not validated here: {artifact.not_validated}" + (
        "; its inputs and outputs were checked against the contract" if artifact.runner else "")
    if options.strict:
        raise ValidationError(f"{text} (--strict: every artifact must be validated)", path=out)
    report.warn(text)
    fixed = (entry.get("contract_check") or {}).get("fixed_dims")
    if fixed:
        report.warn(f"{target}: the artifact fixes dynamic dims: {fixed}; it takes those sizes only "
                    "(declare others with --dim NAME=N or --input NAME:SHAPE)")
def from_source_alone(ir: IRModel, options: ConvertOptions) -> bool:
    """Whether every target can be had from the source itself, the ONNX IR unused: each has a
    native route from this source that reads only the source file (`SOURCE_ONLY`, the TFLite
    re-emission) and takes the run's options, and `--route onnx` was not asked."""
    from modelport.emitters.routes import native_for, source_kind

    if options.route == "onnx" or not options.targets:
        return False
    for t in options.targets:
        native = native_for(source_kind(ir), t)
        eopts = EmitOptions(precision=options.precision, opset=options.opset, calibration=options.calibration,
                            target=options.emitter_options(t))
        if native is None or not getattr(native, "SOURCE_ONLY", False) or native.refusal(ir, eopts):
            return False
    return True


def plan_routes(ir: IRModel, options: ConvertOptions, emit_options) -> dict:
    """Each target's routes (`emitters/routes.py`), and the ONNX route's preflight for every target
    that starts with it: a refusal fails the run (all targets' refusals in one error) unless a
    native route can follow, which is then tried alone."""
    from modelport.emitters import get_emitter
    from modelport.emitters.preflight import check_targets
    from modelport.emitters.routes import plan

    plans = {t: plan(ir, t, options.route, emit_options(t), get_emitter(t)) for t in options.targets}
    checked = []
    for t, p in plans.items():
        if p.routes[0].name != "onnx":
            continue
        if len(p.routes) == 1:
            checked.append(t)
            continue
        pre = p.routes[0].emitter.preflight(ir, emit_options(t))
        if not pre.ok:
            p.notes.append(f"onnx route not taken: {pre.runtime} cannot convert {pre.op_counts()}")
            p.routes.pop(0)
    check_targets(ir, checked, EmitOptions(precision=options.precision, opset=options.opset, calibration=options.calibration))
    return plans


def copy_companion_files(ir: IRModel, stage: Path, report: Report) -> None:
    """The source's tokenizer/preprocessor files (`companion_files` in its provenance) next to the artifacts."""
    import shutil

    names = []
    for f in ir.provenance.get("companion_files") or []:
        shutil.copyfile(f, stage / Path(f).name)
        names.append(Path(f).name)
    if names:
        report.set_files(names)


def parse_noting_attempts(parse, src, spec, parsed, report):
    """Parse; the export routes a PyTorch parse tried go in the parse stage row (`attempts`), and
    those that failed before one worked become warnings."""
    from modelport.parsers.pytorch_export import ExportFailedError

    try:
        ir = parse(src, spec)
    except ExportFailedError as e:
        parsed.note(attempts=[a.to_dict() for a in e.attempts])
        raise
    if ir.provenance.get("saved_on"):
        report.warn(f"the file was saved on {', '.join(ir.provenance['saved_on'])}: read and converted on the CPU")
    for text in ir.provenance.get("warnings") or []:  # what the parser chose for the user (a checkpoint entry, sample sizes)
        report.warn(text)
    attempts = ir.provenance.get("export_attempts")
    if attempts:
        parsed.note(attempts=attempts)
        for a in attempts:
            if not a["ok"]:
                report.warn(f"export route {a['route']} failed: {a['reason']}")
        if ir.provenance.get("fixed_dims"):
            report.warn(f"export route {attempts[-1]['route']} fixed dynamic dims to their sample sizes: {ir.provenance['fixed_dims']}")
    return ir


def artifact_runner(artifact, **options):
    """The runner that validates an artifact: loaded as its users load it, in a fresh child process
    that imports only the artifact's runtime and runs it with that runtime's defaults
    (`runtimes/isolated.py`); `options` replace the artifact's runner options. TensorRT engines are
    built and run where the GPU is, in this process."""
    from modelport.runtimes import get_runner
    from modelport.runtimes.isolated import IsolatedRunner

    options = {**artifact.runner_options, **options}
    if artifact.runner == "tensorrt":
        return get_runner(artifact.runner, artifact.path, **options)
    return IsolatedRunner(artifact.runner, artifact.path, clean=True, **options)


def validate_artifact(artifact, ir: IRModel, tol: Tolerance, hop: str):
    runner = artifact_runner(artifact)
    if artifact.target in routed_targets():
        artifact.details["contract_check"] = check_contract(runner, ir, artifact)
    reference = artifact.reference or ir.reference
    if artifact.precision == "int8":  # 1/100 of the amplitude lies below a calibrated resolution by design
        reference = reference.without("random-small")
    parity = check(runner, reference, tol, hop)
    if getattr(runner, "modules", None) is not None:
        artifact.details["validated_with"] = {"process": "child", "frameworks": runner.modules}
    note_runtime_precision(artifact, runner, reference, tol, hop)
    return parity


def note_runtime_precision(artifact, runner, reference, tol: Tolerance, hop: str) -> None:
    """The precision the runtime actually ran the artifact at, read back from it (runners whose
    `describe()` has `plain_compile`: OpenVINO), and what a plain load of the file runs at on this
    machine. Where that is another precision (an IR validated at f32 on a CPU whose OpenVINO default
    is bf16, which the IR cannot change), the plain load is run on the same inputs and judged by
    the same rule; the figures go in the artifact's `plain_compile`."""
    describe = getattr(runner, "describe", None)
    info = describe() if describe else None
    if not isinstance(info, dict) or "plain_compile" not in info:
        return
    artifact.details["inference_precision"] = info["inference_precision"]
    plain: dict = {"inference_precision": info["plain_compile"]}
    if info.get("plain_options"):
        loaded = artifact_runner(artifact, **info["plain_options"])
        result = check(loaded, reference, tol, f"{hop} (plain load)").to_dict()
        plain.update(ok=result["ok"], outputs=[{k: o[k] for k in ("name", "max_abs", "cosine", "ok")} for o in result["outputs"]])
    artifact.details["plain_compile"] = plain


def routed_targets() -> set[str]:
    """The targets with a native route (their descriptors' `native`): their inputs and outputs are checked too."""
    from modelport.targets import TARGETS

    return {t.name for t in TARGETS.values() if t.native}


def check_contract(runner, ir: IRModel, artifact) -> dict:
    """The artifact's inputs and outputs against the contract, as its runtime describes them: the
    same names, dtypes (unless integer I/O was asked for) and ranks, every fixed dim kept (a
    transposed layout permuted first). A dynamic dim the file fixes is allowed and returned
    (`fixed_dims`, per tensor) as long as it has one size across the file; anything else is exit 4.

    The parity check compares values against the artifact's own reference where an emitter made
    one (a route that fixes dims runs the source at the fixed sizes), so it is here that an output
    the contract does not describe is caught: another fixed size, rank or dtype."""
    pinned: list[tuple[str, str, int]] = []  # (tensor, dim, the size the file gives it)
    _check_tensors("input", runner.input_specs(), ir.inputs, artifact, pinned)
    describe_outputs = getattr(runner, "output_specs", None)
    outputs = describe_outputs() if describe_outputs else None
    if outputs is not None:
        _check_tensors("output", outputs, ir.outputs, artifact, pinned)
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


def convert(source, output_dir: str | Path, options: ConvertOptions | None = None, *,
            on_stage: StageCallback | None = None, **kwargs) -> dict:
    """Convert `source` (a path, 'zoo:NAME' or an nn.Module) into OUT_DIR; returns the report.

    Raises a ModelportError (with `.report` holding the failed run's report) on failure
    (`Run` ends the command).
    """
    from modelport.emitters import EmitOptions, get_emitter
    from modelport.parsers import parse
    from modelport.staging import staged_dir

    options = options or ConvertOptions(**kwargs)
    from modelport.orchestration.text_generation import TASK, TextGenerationOptions, convert_text_generation, is_text_generation

    if is_text_generation(source, options.task):
        options.task, options.text_generation = TASK, options.text_generation or TextGenerationOptions()
        return convert_text_generation(source, output_dir, options, on_stage=on_stage)
    with Run(options.command) as report:
        from modelport.targets import check_precision

        for t in options.targets:
            get_emitter(t)  # unknown targets, and precisions a target does not take, fail before any work
            check_precision(t, options.precision)
        if options.packages:
            from modelport.serving import parse_systems

            options.packages = parse_systems(options.packages)  # unknown systems fail before any work
        out = Path(output_dir)
        from modelport.staging import check_output

        check_output(out, source_inputs(source, options), force=options.force)
        src, spec, zoo_tol = resolve_source(source, options)
        tol = options.tolerance("fp32", zoo_tol)
        check_memory(src, options, report, on_stage=on_stage)

        import tempfile

        from modelport.memory import give_back
        from modelport.optimize.weight_store import forget_onnxscript_matches

        with run_stage(report, "parse", on_stage=on_stage) as parsed, \
                tempfile.TemporaryDirectory(prefix="modelport-export-") as exported:
            # an exporter writes the weights to files here and the IR comes back as its graph: the
            # weights are read in below, once the source model is gone, not held beside it
            spec.weights_dir = Path(exported)
            ir = parse_noting_attempts(parse, src, spec, parsed, report)
            spec.weights_dir = None
            forget_onnxscript_matches()  # the export's graph, whose tensors are the torch model's parameters
            give_back()  # what the source framework and its exporter freed: not kept beside the IR
            ir.attach_stored()
            parts = ir.parts or {"": ir}  # a model exported as several (an encoder and a decoder) goes to OUT/<part>/
            parsed.note(nodes=sum(len(p.model.graph.node) for p in parts.values()), exporter=ir.provenance.get("exporter"))
        source_ref = SourceRef(kind_of(ir.provenance), src, spec)  # for the native routes
        for pir in parts.values():
            pir.source = source_ref
        report.set_source(describe_source(src, ir))
        for part, pir in parts.items():
            record = functools.partial(report.add_part, part) if part else report.set_contract
            record(pir.contract(), reference_varies=pir.provenance.get("reference_varies"), given=list(spec.given))
        if ir.parts and options.packages:
            raise BadInputError(f"--package takes one model; this source gives {len(parts)} ({', '.join(parts)})", path=spec.path)
        check_override_names(tol, [o.name for p in parts.values() for o in p.outputs], path=spec.path)

        from modelport.orchestration.optimize_stage import optimize_stage, wanted

        fw = ir.provenance.get("framework", "source")
        requested_precision = options.precision if wanted(options) else None
        prepared = []  # (part, its IR, the run's options after its optimisation stage, each target's routes)
        for part, pir in parts.items():
            label, suffix = (f"{part}: ", f":{part}") if part else ("", "")
            check_reference_varies(pir, report, strict=options.strict, path=spec.path)
            with run_stage(report, f"validate:ir{suffix}", on_stage=on_stage):
                export_parity = validate_ir(pir, tol, f"{label}{fw}→onnx (IR)")
            report.add_parity(export_parity)
            drift = None  # the IR is not the source: only routes that read the source alone may go on
            if not export_parity.ok and from_source_alone(pir, options):
                drift = f"the ONNX IR fails parity with the source ({export_parity.summary()})"
                report.warn(f"{label}{drift}; every target is emitted from the source itself")
            else:
                export_parity.raise_if_failed(path=spec.path)
            popts = options
            if requested_precision:
                optimized, popts = optimize_stage(pir, options, report, zoo_tol, on_stage=on_stage, release_input=True)
                if optimized is not pir and optimized.model is not pir.model:
                    pir.model = None  # the IR before the passes: every target is emitted from the optimised one
                    give_back()
                pir = optimized
                pir.source = source_ref

            def emit_options(target, popts=popts):
                return EmitOptions(precision=popts.precision, opset=popts.opset, calibration=popts.calibration,
                                   target=popts.emitter_options(target))

            with run_stage(report, f"preflight{suffix}", on_stage=on_stage):  # every target's, before anything is emitted
                plans = plan_routes(pir, popts, emit_options)
            for p in plans.values() if drift else ():
                p.routes = [r for r in p.routes if r.name != "onnx"]
                p.notes.append(f"onnx route not taken: {drift}")
            prepared.append((part, pir, popts, emit_options, plans))
        runs = [(part, pir, popts, emit_options, plans[target]) for part, pir, popts, emit_options, plans in prepared
                for target in popts.targets]
        with staged_dir(out, source_inputs(source, options), force=options.force, keep_failed=options.keep_failed) as stage:
            try:
                failures = {}
                for part, pir, popts, emit_options, plan in runs:
                    try:
                        emit_by_routes(plan, pir, stage, emit_options(plan.target), popts, report, zoo_tol, fw,
                                       on_stage=on_stage, out=out, requested=requested_precision, part=part or None)
                    except ModelportError as e:
                        if len(runs) == 1:
                            raise
                        name = f"{part}:{plan.target}" if part else plan.target
                        failures[name] = e  # the other targets still run; every result is reported
                        report.add_target_failure(name, e.to_dict())
                if failures:
                    raise ValidationError(f"{len(failures)} of {len(runs)} targets failed: "
                                          + "; ".join(f"{t}: {e.message}" for t, e in failures.items()))
                copy_companion_files(ir, stage, report)
                if options.packages:
                    from modelport.orchestration.package import package_converted

                    package_converted(stage, report, options.packages, options.package, on_stage=on_stage)
                report.write(stage)
            except ModelportError as e:
                if options.keep_failed:  # OUT.failed/report.json: the run as far as it got, and why it failed
                    report.write_failed(stage, e.exit_code, e.to_dict())
                raise
    return report.to_dict()
