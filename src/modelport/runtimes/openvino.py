"""OpenVINO runner (CPU): OpenVINO IR (`model.xml` + `model.bin`), ONNX files, and in-memory models.

OpenVINO's CPU plugin runs f32 models in bf16 by default on CPUs with BF16 (AVX512-BF16 or AMX),
so a plain `core.compile_model("model.xml", "CPU")` of an IR validated at f32 computes in bf16
there. The IR cannot prevent that: OpenVINO 2026.4 reads only KV-cache and dynamic-quantisation
options from a model's `rt_info["runtime_options"]` (the CPU plugin's `Config::applyRtInfo`), not
`INFERENCE_PRECISION_HINT`. So a modelport-written IR records the precision it was validated at
(in `runtime_options`, where OpenVINO keeps runtime options, and under `modelport` with its I/O
contract), and this runner:

- opens a file the way a user does, with a plain `compile_model` (no configuration), and reads
  back the precision the plugin chose (`plain_precision`);
- runs it at the recorded precision (the one asked, else the IR's, else f32): the plain compile
  itself where it chose that precision, else a second compile with `INFERENCE_PRECISION_HINT`
  set explicitly;
- reports both (`describe()`), and `plain_options()` says how to open the file as a plain
  compile runs it when that differs, so a validation can judge the artifact that way too.

In-memory models and timed runs (`threads`) are compiled at the pinned precision only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError, MissingDependencyError, UnsafeInputError, one_line
from modelport.ir import TensorSpec
from modelport.onnxfile.onnx_io import load_onnx, save_onnx
from modelport.runtimes.base import Capabilities, Runner

# modelport precision -> OpenVINO element type name of INFERENCE_PRECISION_HINT
HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
PRECISION_OF = {hint: precision for precision, hint in HINTS.items()}
PLAIN = "default"  # runner precision: compile as a plain compile_model(xml, "CPU") does, with no configuration
# where OpenVINO keeps runtime options in a model's rt_info (`<rt_info><runtime_options>` in the IR)
RUNTIME_OPTION = ["runtime_options", "INFERENCE_PRECISION_HINT"]
# OPTIMIZATION_CAPABILITIES entry that says the CPU executes the precision natively
CAPABILITY = {"fp32": "FP32", "bf16": "BF16", "fp16": "FP16", "int8": "INT8"}
RT_KEY = "modelport"  # rt_info section of a modelport-written IR


def no_telemetry() -> None:
    """Keep OpenVINO and NNCF from phoning home.

    `import openvino` sends a usage event to Google Analytics (through `openvino_telemetry`, unless
    the user opted out or `CI` is set), and NNCF sends events per call; both fall back to a stub
    when `openvino_telemetry` cannot be imported. modelport makes no network calls a user did not
    ask for, so in its processes the package is made unimportable, unless something imported it
    already (then the user's own setup decides).
    """
    import sys

    sys.modules.setdefault("openvino_telemetry", None)


def require_openvino(purpose: str = "OpenVINO"):

    no_telemetry()
    return require("openvino", purpose=purpose)


_CORE = None


def core():
    """One openvino.Core per process (creating one loads the plugins)."""
    global _CORE
    if _CORE is None:
        _CORE = require_openvino().Core()
    return _CORE


def cpu_capabilities() -> list[str]:
    """The CPU plugin's OPTIMIZATION_CAPABILITIES, e.g. ['BF16', 'FP32', 'INT8', ...]."""
    return [str(c) for c in core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]


def supports(precision: str) -> bool:
    """Whether this CPU executes `precision` natively (bf16 needs AVX512-BF16 or AMX, f16 AMX-FP16 or AVX512-FP16)."""
    cap = CAPABILITY.get(precision)
    return cap is not None and cap in cpu_capabilities()


def require_precision(precision: str, capabilities: list[str] | None = None) -> None:
    """Exit 5 when this CPU (whose OPTIMIZATION_CAPABILITIES are `capabilities`, else read from the
    plugin) cannot run `precision` natively: a hardware requirement, like a missing GPU."""
    caps = cpu_capabilities() if capabilities is None else list(capabilities)
    if precision in ("bf16", "fp16") and CAPABILITY[precision] not in caps:
        raise MissingDependencyError(
            f"this CPU cannot run {precision} natively in OpenVINO (OPTIMIZATION_CAPABILITIES: {', '.join(caps)})",
            hint=f"{precision} inference needs a CPU with "
                 + ("AVX512-BF16 or AMX" if precision == "bf16" else "AMX-FP16 or AVX512-FP16") + "; use fp32 or int8 here")


def _element_type_name(value) -> str:
    text = str(value)
    for name, hint in (("bfloat16", "bf16"), ("float16", "f16"), ("float32", "f32")):
        if name in text:
            return hint
    return text.replace("<Type: '", "").replace("'>", "")


def read_rt(model, key: str):
    """A value modelport stored in the model's rt_info (a JSON string), or None."""
    try:
        if not model.has_rt_info([RT_KEY, key]):
            return None
        return json.loads(model.get_rt_info([RT_KEY, key]).astype(str))
    except Exception:  # rt_info of another producer: not ours
        return None


def write_rt(model, key: str, value) -> None:
    model.set_rt_info(json.dumps(value, sort_keys=True), [RT_KEY, key])


def record_precision(model, precision: str) -> None:
    """Record the inference precision the IR is validated at (a key of HINTS) in its rt_info: as
    OpenVINO's `runtime_options` INFERENCE_PRECISION_HINT, and under modelport's own section."""
    model.set_rt_info(HINTS[precision], RUNTIME_OPTION)
    write_rt(model, "inference_precision", precision)


def recorded_precision(model) -> str | None:
    """The inference precision an IR records (a key of HINTS): its `runtime_options`
    INFERENCE_PRECISION_HINT, else modelport's own entry (IRs written before the other), else None."""
    try:
        if model.has_rt_info(RUNTIME_OPTION):
            hint = str(model.get_rt_info(RUNTIME_OPTION).astype(str)).strip().lower()
            if hint in PRECISION_OF:
                return PRECISION_OF[hint]
    except Exception:  # an entry of another type: not a precision
        pass
    stored = read_rt(model, "inference_precision")
    return stored if stored in HINTS else None


def read_ir(path: str | Path):
    """An OpenVINO model from an IR `.xml` (its `.bin` beside it) or an ONNX file, with file errors as exit 2."""
    path = Path(path)
    if path.suffix.lower() == ".xml":
        weights = path.with_suffix(".bin")
        if not weights.is_file():
            raise BadInputError(f"the IR's weights file {weights.name} is missing beside it", path=path)
        if weights.is_symlink():

            raise UnsafeInputError(f"the IR's weights file {weights.name} is a symbolic link", path=path)
    elif path.suffix.lower() == ".onnx":

        load_onnx(path, weights=False)  # external data checked to stay inside the folder
    try:
        return core().read_model(str(path))
    except MissingDependencyError:
        raise
    except Exception as e:
        raise BadInputError(f"OpenVINO cannot read the model: {one_line(e)}",
                            path=path) from None


def from_onnx(model):
    """An OpenVINO model from an in-memory ONNX ModelProto (written to a temporary file: OpenVINO
    reads external data by path).

    The model goes through OpenVINO's ONNX front end as the runtime reads it (`Core.read_model`),
    the front end `openvino.convert_model` uses too: `convert_model` also sends usage telemetry to
    Google Analytics unless the user opted out, and a conversion here makes no network calls.
    """
    import tempfile


    with tempfile.TemporaryDirectory(prefix="modelport-ov-") as tmp:
        path = Path(tmp) / "model.onnx"
        save_onnx(model, path)
        try:
            return core().read_model(str(path))
        except Exception as e:
            first = one_line(e)
            raise BadInputError(f"OpenVINO cannot convert the ONNX model: {first}") from None


def port_name(port, wanted: set[str] | None = None) -> str:
    """A port's tensor name: the one the contract knows when it has several."""
    names = port.get_names()
    if wanted:
        for n in sorted(names):
            if n in wanted:
                return n
    return port.get_any_name()


def specs_of(model) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(inputs, outputs) of an OpenVINO model: the contract modelport stored, else the ports
    (a dynamic dim becomes `<name>_dim<axis>`)."""
    contract = read_rt(model, "contract") or {}

    def from_ports(ports, key):
        saved = {d["name"]: TensorSpec.from_dict(d) for d in contract.get(key) or [] if isinstance(d, dict) and d.get("name")}
        specs = []
        for p in ports:
            name = port_name(p, set(saved))
            if name in saved:
                specs.append(saved[name])
                continue
            shape = [d.get_length() if d.is_static else f"{name}_dim{k}" for k, d in enumerate(p.get_partial_shape())]
            specs.append(TensorSpec(name, np.dtype(p.get_element_type().to_dtype()).name, shape))
        return specs

    return from_ports(model.inputs, "inputs"), from_ports(model.outputs, "outputs")


class OpenVINORunner(Runner):
    """Compile a model on CPU at a known inference precision and run it by tensor name.

    `precision`: a key of HINTS (default: the one the IR records, else fp32), or PLAIN ("default")
    to run it exactly as a plain `compile_model` does. `inference_precision` is what the compiled
    model says it runs at; `plain_precision`, what a plain compile of the file runs at on this CPU
    (OpenVINO's names, "f32"/"bf16"/"f16"; None for in-memory models and timed runs). It declares
    `plain_load` (a plain compile may run at bf16) and `localize` (its tensors keep the ONNX names).
    """

    name = "openvino"
    imports = ("openvino", "onnx")
    capabilities = Capabilities(localize=True, plain_load=True)

    @classmethod
    def open(cls, path, *, threads: int | None = None) -> OpenVINORunner:
        return cls(path, threads=threads)

    def __init__(self, model, *, precision: str | None = None, threads: int | None = None):
        require_openvino("running OpenVINO models")
        self.path = Path(model) if isinstance(model, (str, Path)) else None
        if self.path is not None:
            self.model = read_ir(self.path)
        elif hasattr(model, "graph") and hasattr(model, "opset_import"):  # an ONNX ModelProto
            self.model = from_onnx(model)
        else:
            self.model = model
        precision = precision or recorded_precision(self.model) or "fp32"
        if precision not in HINTS and precision != PLAIN:
            raise BadInputError(f"unknown OpenVINO inference precision '{precision}'; known: {', '.join((*HINTS, PLAIN))}")
        self.precision = precision
        self._inputs, self._outputs = specs_of(self.model)
        self.plain_precision = None
        compiled = None
        if self.path is not None and not threads:
            compiled = self._compile({})  # as users compile a file: core.compile_model("model.xml", "CPU")
            self.plain_precision = self._precision_of(compiled)
            if precision not in (PLAIN, PRECISION_OF.get(self.plain_precision)):
                compiled = None  # the plugin's default is another precision: pin the one asked
        if compiled is None:
            config = {"PERFORMANCE_HINT": "LATENCY"}
            if precision != PLAIN:
                config["INFERENCE_PRECISION_HINT"] = HINTS[precision]
            if threads:
                config["INFERENCE_NUM_THREADS"] = int(threads)
            compiled = self._compile(config)
        self.compiled = compiled
        # what the plugin settled on: f16 asked on a CPU without FP16 runs in f32, for one
        self.inference_precision = self._precision_of(compiled)
        self.request = self.compiled.create_infer_request()
        wanted_in, wanted_out = {s.name for s in self._inputs}, {s.name for s in self._outputs}
        self.input_names = [port_name(p, wanted_in) for p in self.compiled.inputs]
        self.output_names = [port_name(p, wanted_out) for p in self.compiled.outputs]
        self._tensors = None  # (feeds, {tensor: value}) of the last `tensor_values` run

    def _compile(self, config: dict):
        try:
            return core().compile_model(self.model, "CPU", config)
        except Exception as e:
            first = one_line(e)
            raise BadInputError(f"OpenVINO cannot compile the model for CPU: {first}", path=self.path) from None

    @staticmethod
    def _precision_of(compiled) -> str:
        return _element_type_name(compiled.get_property("INFERENCE_PRECISION_HINT"))

    def input_specs(self) -> list[TensorSpec]:
        return list(self._inputs)

    def output_specs(self) -> list[TensorSpec]:
        return list(self._outputs)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BadInputError(f"missing inputs {missing}; the model expects {self.input_names}")
        result = self.request.infer({i: np.ascontiguousarray(feeds[n]) for i, n in enumerate(self.input_names)})
        return {n: np.array(result[self.compiled.outputs[i]]) for i, n in enumerate(self.output_names)}

    def plain_options(self) -> dict | None:
        """Options that open this file as a plain `compile_model` runs it, when that is not what `run` computes (None otherwise)."""
        if self.plain_precision is None or self.plain_precision == self.inference_precision:
            return None
        return {"precision": PLAIN}

    def describe(self) -> dict:
        """The precisions, in modelport's names: what `run` computes at (read back from the compiled
        model), what was asked, and what a plain `compile_model` of the file runs at on this CPU."""
        def name(hint):
            return PRECISION_OF.get(hint, hint)

        return {"inference_precision": name(self.inference_precision), "asked": self.precision,
                "plain_compile": name(self.plain_precision) if self.plain_precision else None,
                "plain_options": self.plain_options()}

    def io_note(self) -> str:
        asked = "none, as a plain compile_model" if self.precision == PLAIN else HINTS[self.precision]
        note = f"OpenVINO CPU, inference precision {self.inference_precision} (asked {asked})"
        if self.plain_precision is not None and self.plain_precision != self.inference_precision:
            note += f"; a plain compile_model runs it at {self.plain_precision} on this CPU"
        return note

    def tensor_order(self) -> list[tuple[str, str, str]]:
        _, names, producers = _named_outputs(self.model)
        return [(n, *producers[n]) for n in names]

    def tensor_values(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """Every tensor is computed in one run (the plugin must materialise them all at once): kept for
        the calls that ask for the next ones on the same feeds."""
        cached = self._tensors
        if cached is None or cached[0] is not feeds:
            self._tensors = cached = (feeds, intermediate_tensors(self.model, feeds, precision=self.precision)[1])
        return {n: cached[1][n] for n in names if n in cached[1]}

    @classmethod
    def plain_load_warning(cls, target: str, entry: dict) -> str | None:
        return plain_compile_warning(target, entry)


def plain_compile_warning(target: str, entry: dict) -> str | None:
    """The warning for an artifact (its report entry) that a plain `compile_model` runs at another
    precision than it was validated at, with the figures of that load and the fix."""
    plain = entry.get("plain_compile") or {}
    validated = entry.get("inference_precision")
    if not plain.get("inference_precision") or plain["inference_precision"] == validated or validated not in HINTS:
        return None
    outputs = plain.get("outputs") or []
    figures = ""
    if outputs:
        worst = max(outputs, key=lambda o: o["max_abs"] if o["max_abs"] is not None else float("inf"))
        size = f"{worst['max_abs']:.3g}" if worst["max_abs"] is not None else "not finite"
        judged = "within" if plain.get("ok") else "outside"
        figures = f": max abs {size} on {worst['name']}, {judged} the {entry['precision']} tolerance"
    return (f"{target}: validated at {validated}, but a plain compile_model of {entry['path']} runs it at "
            f"{plain['inference_precision']} on this CPU (OpenVINO's default, which the IR cannot change){figures}; "
            f"compile it with INFERENCE_PRECISION_HINT={HINTS[validated]} (the OVMS bundle, package --for ovms, sets it)")


def open_ir(path: str | Path, **options) -> OpenVINORunner:
    """A user's `.xml` (or `.onnx`) file, as `validate` opens it."""
    return OpenVINORunner(path, **options)


def inspect_ir(path: str | Path) -> dict:
    """What `inspect` shows for an OpenVINO IR: I/O, op histogram, parameters, size, stored precision."""
    from collections import Counter

    path = Path(path)
    model = read_ir(path)
    inputs, outputs = specs_of(model)
    ops = Counter(op.get_type_name() for op in model.get_ordered_ops())
    params = sum(int(np.prod(op.get_output_shape(0))) for op in model.get_ordered_ops()
                 if op.get_type_name() == "Constant" and op.get_output_partial_shape(0).is_static)
    files = [path, path.with_suffix(".bin")]
    ov = require_openvino()
    return {
        "format": "openvino-ir",
        "openvino": ov.__version__ if hasattr(ov, "__version__") else None,
        "inputs": [s.to_dict() for s in inputs],
        "outputs": [s.to_dict() for s in outputs],
        "nodes": sum(ops.values()),
        "ops": dict(ops.most_common()),
        "parameters": int(params),
        "inference_precision": recorded_precision(model),
        "weights": sorted({str(op.get_element_type()) for op in model.get_ordered_ops() if op.get_type_name() == "Constant"}),
        "files": [str(f) for f in files],
        "size": sum(f.stat().st_size for f in files if f.exists()),
    }


def _named_outputs(model):
    """(ports, names, {name: (producing op, its type)}) of the op outputs that carry a float tensor
    name (the first of its names), in execution order; the model's inputs left out."""
    ports, names, producers = [], [], {}
    params = {p.get_any_name() for p in model.inputs}
    for op in model.get_ordered_ops():
        if op.get_type_name() in ("Parameter", "Constant", "Result"):
            continue
        for out in op.outputs():
            if not out.get_names() or not out.get_element_type().is_real():
                continue
            name = sorted(out.get_names())[0]
            if name in params or name in names:
                continue
            ports.append(out)
            names.append(name)
            producers[name] = (op.get_friendly_name(), op.get_type_name())
    return ports, names, producers


def intermediate_tensors(model, feeds: dict[str, np.ndarray], *, precision: str = "fp32") -> tuple[list[str], dict[str, np.ndarray]]:
    """Every named float tensor an OpenVINO model computes on `feeds`, in execution order.

    Each op output that carries a tensor name (OpenVINO keeps the ONNX names of the tensors it
    converted) is made a model output, so the plugin must materialise it; fusions that would
    hide it are then not applied, which is what a divergence search wants.
    """
    model = model.clone()
    ports, names, _ = _named_outputs(model)
    if ports:
        model.add_outputs(ports)
    compiled = core().compile_model(model, "CPU", {} if precision == PLAIN else {"INFERENCE_PRECISION_HINT": HINTS[precision]})
    request = compiled.create_infer_request()
    inputs = [port_name(p) for p in compiled.inputs]
    result = request.infer({i: np.ascontiguousarray(feeds[n]) for i, n in enumerate(inputs)})
    values: dict[str, np.ndarray] = {}
    for port in compiled.outputs:
        for n in port.get_names():
            values.setdefault(n, np.array(result[port]))
    return [n for n in names if n in values], values
