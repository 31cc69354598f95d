"""Targets: one descriptor per `--to` name (and per artifact format modelport reads), the one table
every consumer reads.

A target's code lives in its own modules (an emitter, a runner, an inspector, native-route
modules, an options class); this table says which they are and what the rest of the program needs
to know about its artifacts, as plain data and "package.module:attr" strings, so the base layer
imports nothing heavy and `modelport --help` stays instant. The consumers:

    registry.EMITTERS        `--to` names and aliases (emitter)
    runtimes.RUNNERS         runtime -> runner class (runtime, runner)
    validate / bench         a user's file by its ending (suffixes; opener for validate, runner for bench)
    inspect                  a file's description (inspector, suffixes)
    doctor                   what a target needs (needs, gpu), where its artifacts run (runs_on)
    deps                     the extra behind a missing module (extras)
    serving.bundle           a convert folder's artifacts (file, artifact, aliases)
    modelport.resolve.precisions     the precision of each requested target's artifact, the stage that applies it and the
                             tolerance it is judged with (precisions, tasks, precision_stage, judged_as)
    CLI and convert          per-target options and their flags (options), routes (native, onnx_route), the IR its
                             ONNX route takes (float_weights)

Adding a target is its own modules plus one `Target(...)` entry in TARGETS (or `register(...)`
from a plug-in); docs/adding_a_target.md walks through the fields with OpenVINO as the example.
A target's CLI flags are declared by its options class, in its own module (`options`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from modelport.errors import BadInputError


@dataclass(frozen=True)
class Target:
    """One target or artifact format. Strings name modules ("package.module") or attributes
    ("package.module:attr"), imported only when used."""

    name: str  # what `--to` takes and what a report's artifact `target` says
    title: str = ""  # how messages and docs name it ("OpenVINO")
    emitter: str | None = None  # "package.module" with NAME, RUNTIME, emit, preflight; None: a format, not a --to target
    aliases: tuple[str, ...] = ()  # other spellings `--to` and report readers accept
    runtime: str | None = None  # the runtimes/ name its artifacts run in
    runner: str | None = None  # "module:Class" registered in runtimes.RUNNERS under `runtime`
    opener: str | None = None  # "module:function" opening a user's file for `validate` (a runner)
    inspector: str | None = None  # "module:function" returning `inspect`'s dict for one of its files
    suffixes: tuple[str, ...] = ()  # file endings (lower case) of its artifacts; "/FILE": a folder holding FILE
    file: str | None = None  # its conventional path in a convert output folder
    artifact: str | None = None  # what its artifact is, in words ("OpenVINO IR (model.xml + model.bin)")
    precisions: tuple[str, ...] = ("fp32",)  # the --precision values it takes for models run once per input, the first its
    # default; () when it writes only the models of `tasks`
    tasks: dict[str, tuple[str, ...]] = field(default_factory=dict)  # task -> the precisions it takes for that task's models
    # (a task with a pipeline of its own: text-generation), the first its default
    precision_stage: str = "emit"  # what applies a precision other than fp32: "optimize" (the IR's precision passes, once
    # per precision, the IR shared by every target that takes it) or "emit" (the target's own converter)
    judged_as: dict[str, str] = field(default_factory=dict)  # precision -> the precision whose tolerance judges its artifacts
    refused: dict[str, str] = field(default_factory=dict)  # precision it does not take -> why (the refusal's hint)
    needs: tuple[str, ...] | None = None  # top-level modules it needs (doctor), or "module:function" probes returning
    # what is missing outside Python (None when ready); None: not checked
    extras: dict[str, str] = field(default_factory=dict)  # module -> the pip extra that installs it (exit-5 hints)
    gpu: bool = False  # it needs an NVIDIA GPU to build or run
    options: str | None = None  # "module:Class": its frozen options class (ConvertOptions.target_options[name])
    native: dict[str, str] = field(default_factory=dict)  # source kind (parser name) -> native-route module
    onnx_route: bool = True  # False: reached by its native routes only
    float_weights: bool = False  # its ONNX route takes float weights: a quantised IR's integer weights (DequantizeLinear
    # of initializers) are dequantised for it by the optimisation stage (optimize/dequantize.py)
    bench: bool = True  # `bench` opens its files (by suffixes, with `runner`)
    runs_on: tuple[str, ...] | None = None  # the systems (sys.platform) its artifacts run on; None: any
    dims: str = ""  # how its artifacts keep dims declared with --dim bounds, in words (docs/dynamic_shapes.md, coverage)

    @property
    def is_target(self) -> bool:
        return self.emitter is not None


_ORT = "modelport.runtimes.onnxruntime"
_TF_NATIVE = "modelport.emitters.tflite_tf"
_SM_NATIVE = "modelport.emitters.savedmodel_tf"
_TFL_CODE = "modelport.emitters.tflite_code"
# decoder LMs (--task text-generation): weight-only int4/int8, or `auto` (--optimize auto picks among its variants)
_GENERATION = ("fp32", "fp16", "int8", "int4", "auto")

# In `--to` help order. A new target is one entry here.
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("onnx", "ONNX", "modelport.emitters.onnx", runtime="onnxruntime", runner=f"{_ORT}:OnnxRuntimeRunner",
           opener=f"{_ORT}:open_onnx_file", inspector="modelport.orchestration.inspect:inspect_onnx", suffixes=(".onnx",),
           file="model.onnx", artifact="an ONNX model (.onnx)", precisions=("fp32", "fp16", "int8"),
           tasks={"text-generation": _GENERATION}, precision_stage="optimize", needs=("onnx", "onnxruntime"),
           dims="symbolic in the graph"),
    Target("pytorch", "PyTorch code", "modelport.emitters.pytorch_code", runtime="torch_source",
           runner="modelport.runtimes.torch_source:TorchSourceRunner", file="pytorch/model.py", artifact="PyTorch code",
           needs=("torch", "safetensors"), float_weights=True,
           dims="symbolic (the module takes any size)"),
    Target("tflite", "TFLite", "modelport.emitters.tflite", runtime="tflite", runner="modelport.runtimes.tflite:TFLiteRunner",
           opener="modelport.runtimes.tflite:open_untrusted", inspector="modelport.parsers.tflite:inspect",
           suffixes=(".tflite",), file="model.tflite", artifact="a TFLite flatbuffer (.tflite)",
           precisions=("fp32", "fp16", "int8"), needs=("tensorflow", "tf_keras", "onnx2tf", "onnx_graphsurgeon", "ai_edge_litert"),
           extras={"ai_edge_litert": "tf", "tflite_runtime": "tf", "onnx2tf": "tf", "onnx_graphsurgeon": "tf"},
           options="modelport.emitters.tflite_options:TFLiteOptions",
           native={"keras": _TF_NATIVE, "savedmodel": _TF_NATIVE, "pytorch": "modelport.emitters.tflite_torch",
                   "onnx": _TFL_CODE, "graphdef": _TFL_CODE, "huggingface": _TFL_CODE,
                   "tflite": "modelport.emitters.tflite_copy"},
           dims="-1 in the signature (onnx2tf, or modelport's ONNX lowering); one signature per listed size (litert-torch)"),
    Target("tensorrt", "TensorRT", "modelport.emitters.tensorrt", aliases=("trt",), runtime="tensorrt",
           runner="modelport.runtimes.tensorrt:TensorRTRunner", opener="modelport.runtimes.tensorrt:open_engine",
           inspector="modelport.runtimes.tensorrt:engine_info", suffixes=(".plan", ".engine"), file="model.plan",
           artifact="a TensorRT engine", precisions=("fp32", "fp16", "best"), judged_as={"best": "fp16"},
           refused={"int8": "TensorRT INT8 needs an explicitly quantized (Q/DQ) model"}, needs=("tensorrt", "torch"),
           extras={"tensorrt": "tensorrt"}, gpu=True, options="modelport.emitters.tensorrt_options:TensorRTOptions",
           dims="an optimisation profile (min, opt, max)"),
    Target("ort", "ORT format", "modelport.emitters.ort", runtime="onnxruntime", runner=f"{_ORT}:OnnxRuntimeRunner",
           opener=f"{_ORT}:OnnxRuntimeRunner", suffixes=(".ort",), file="model.ort", artifact="an ORT-format model (.ort)",
           precisions=("fp32", "fp16", "int8"), precision_stage="optimize", needs=("onnx", "onnxruntime"),
           dims="symbolic in the graph"),
    Target("ort-genai", "onnxruntime-genai", "modelport.emitters.ort_genai", runtime="onnxruntime-genai",
           runner="modelport.runtimes.ort_genai:OrtGenAIRunner", precisions=(), tasks={"text-generation": _GENERATION}, precision_stage="optimize", bench=False),
    Target("savedmodel", "SavedModel", "modelport.emitters.savedmodel", aliases=("tensorflow", "tf", "saved_model", "keras"),
           runtime="savedmodel", runner="modelport.runtimes.savedmodel:SavedModelRunner", file="saved_model",
           artifact="a SavedModel", bench=False, native={"keras": _SM_NATIVE, "savedmodel": _SM_NATIVE}),
    Target("openvino", "OpenVINO", "modelport.emitters.openvino", runtime="openvino",
           runner="modelport.runtimes.openvino:OpenVINORunner", opener="modelport.runtimes.openvino:open_ir",
           inspector="modelport.runtimes.openvino:inspect_ir", suffixes=(".xml",), file="model.xml",
           artifact="OpenVINO IR (model.xml + model.bin)", precisions=("fp32", "fp16", "bf16", "int8"), needs=("openvino",),
           extras={"openvino": "openvino", "nncf": "openvino"}, options="modelport.emitters.openvino_options:OpenVINOOptions",
           dims="symbolic in the IR"),
    Target("tfjs", "TF.js", "modelport.emitters.tfjs", aliases=("tensorflowjs", "tensorflow.js"), runtime="tfjs",
           runner="modelport.runtimes.tfjs:TFJSRunner", opener="modelport.runtimes.tfjs:open_model_json",
           inspector="modelport.runtimes.tfjs:inspect_model_json", suffixes=("model.json", "/model.json"), file="tfjs/model.json",
           artifact="a TF.js graph model (model.json + weight shards)", precisions=("fp32", "fp16", "uint8"),
           needs=("tensorflow", "onnx2tf", "modelport.runtimes.tfjs:missing"),
           extras={"onnx2tf": "tf", "onnx_graphsurgeon": "tf"},
           native={"keras": "modelport.emitters.tfjs_tf", "savedmodel": "modelport.emitters.tfjs_tf"},
           bench=False,
           dims="-1 in the graph model (onnx2tf, or modelport's ONNX lowering)"),  # each run is a fresh Node.js process: no steady-state latency to time
    Target("executorch", "ExecuTorch", "modelport.emitters.executorch", aliases=("pte",), runtime="executorch",
           runner="modelport.runtimes.executorch:ExecuTorchRunner", opener="modelport.runtimes.executorch:open_pte",
           inspector="modelport.runtimes.executorch:inspect_pte", suffixes=(".pte",), file="model.pte",
           artifact="an ExecuTorch program (.pte)", precisions=("fp32", "int8"), needs=("executorch", "torch"),
           extras={"executorch": "executorch"}, options="modelport.emitters.executorch_options:ExecuTorchOptions",
           native={"pytorch": "modelport.emitters.executorch_torch"}, float_weights=True,
           dims="bounded: torch.export Dim(min, max)"),
    Target("coreml", "Core ML", "modelport.emitters.coreml", runtime="coreml", runner="modelport.runtimes.coreml:CoreMLRunner",
           opener="modelport.runtimes.coreml:open_mlpackage", inspector="modelport.runtimes.coreml:inspect_mlpackage",
           suffixes=(".mlpackage", "/Manifest.json"), file="model.mlpackage", artifact="a Core ML package (.mlpackage)",
           precisions=("fp16", "fp32"), needs=("coremltools", "torch"), extras={"coremltools": "coreml"},
           options="modelport.emitters.coreml_options:CoreMLOptions", native={"pytorch": "modelport.emitters.coreml_torch"},
           float_weights=True,
           bench=False, runs_on=("darwin",),
           dims="flexible: RangeDim, or EnumeratedShapes for listed sizes"),
    # artifact formats that are no --to target: packagers read them from a convert folder
    Target("torchscript", "TorchScript", file="model.pt", artifact="a TorchScript model.pt", bench=False),
)}


def register(target: Target) -> Target:
    """Add a target (a plug-in's, or a test's); a different entry under a taken name is an error.
    The registries derived from this table see it from then on."""
    known = TARGETS.get(target.name)
    if known is not None and known != target:
        raise ValueError(f"target '{target.name}' is already registered")
    TARGETS[target.name] = target
    for add, _ in _LISTENERS:
        add(target)
    return target


def unregister(name: str) -> None:
    """Take a registered target out again, from this table and the registries derived from it."""
    target = TARGETS.pop(name)
    for _, remove in _LISTENERS:
        if remove is not None:
            remove(target)


@contextmanager
def registered(target: Target):
    """`target` registered for the duration of a `with` block (tests, a plug-in tried once)."""
    register(target)
    try:
        yield target
    finally:
        unregister(target.name)


_LISTENERS: list = []


def on_register(add, remove=None) -> None:
    """Call `add(target)` for every target registered later, `remove(target)` for every one taken
    out: the registries derived from this table keep up."""
    _LISTENERS.append((add, remove))


def emitting() -> Iterator[Target]:
    """The `--to` targets, in table order."""
    return (t for t in TARGETS.values() if t.is_target)


def get(name: str) -> Target:
    """The target `name` (or an alias) names; exit 2 listing the known ones."""
    key = name.strip().lower()
    for t in TARGETS.values():
        if key == t.name or key in t.aliases:
            return t
    raise BadInputError(f"unknown target '{name}'; known: {', '.join(sorted(t.name for t in emitting()))}")


class TargetOptions:
    """The base of every target's options class (a descriptor's `options`): frozen dataclasses whose
    fields are declared with `option(...)`, validated in their own module."""


def option(default, *, flag: str | None = None, help: str = "", metavar: str | None = None, run: str | None = None):
    """A field of a target's options class (its own module, the descriptor's `options`): its default,
    the CLI flag that sets it, the flag's help and the value name help shows (None: the Python API
    only), or `run`, the run option that fills it when the user did not (OpenVINO's INT8 accuracy
    control takes the run's accuracy budget). The CLI builds every target's flags from these."""
    return field(default=default, metadata={"flag": flag, "help": help, "metavar": metavar, "run": run})


@dataclass(frozen=True)
class Flag:
    """One CLI flag of a target's options: its parameter name, spelling, type, default and help."""

    target: str
    field: str
    param: str  # the CLI parameter: the flag without dashes, `-` as `_`
    flag: str
    kind: object  # the field's type, as typing reads it
    default: object
    help: str
    metavar: str | None = None


def flags() -> list[Flag]:
    """Every target's options flags, in table order (imports each target's options module: small by rule)."""
    import dataclasses
    import typing

    out = []
    for t in TARGETS.values():
        if not t.options:
            continue
        cls = load(t.options)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            flag = f.metadata.get("flag")
            if flag:
                out.append(Flag(t.name, f.name, flag.lstrip("-").replace("-", "_"), flag, hints[f.name], f.default,
                                f.metadata.get("help", ""), f.metadata.get("metavar")))
    return out


def run_filled(cls) -> dict[str, str]:
    """{field: the run option that fills it} of an options class (`option(run=...)`)."""
    import dataclasses

    return {f.name: f.metadata["run"] for f in dataclasses.fields(cls) if f.metadata.get("run")}


def load(ref: str):
    """The module or attribute a descriptor string names."""
    import importlib

    module, _, attr = ref.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded


def options_for(name: str, value=None):
    """Target `name`'s options object: `value` when given, else its class's defaults; None when it has none."""
    t = get(name)
    if value is not None or t.options is None:
        return value
    return load(t.options)()
