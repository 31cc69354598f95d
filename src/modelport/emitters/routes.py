"""Routes: how a target is reached from a source. The ONNX route (source → ONNX IR → target) serves
every pair; a native route uses the source framework's own converter for the pairs it serves:

    keras      → tflite       TensorFlow's TFLiteConverter on the Keras model
    savedmodel → tflite       TensorFlow's TFLiteConverter on the SavedModel's signature
    keras      → savedmodel   Keras's export (ExportArchive), the contract's names on the signature
    savedmodel → savedmodel   the signature saved again behind the contract's names
    pytorch    → tflite       litert-torch (torch.export → LiteRT)
    onnx, graphdef, huggingface → tflite
                              the IR's generated PyTorch code → litert-torch (after onnx2tf)
    tflite     → tflite       the source's own flatbuffer emitted again (fp16/int8: ai-edge-quantizer)

`--route onnx` takes the ONNX route, `--route native` the native one (exit 2 naming the reason
when the pair has none or its converter cannot do what was asked), `--route auto` (the default)
tries the routes in the native module's order (`AUTO`: "first" or "fallback") and falls back to
the other one when the first fails to convert or to validate; the report names the route taken
and why. Targets that consume ONNX (onnx, ort, tensorrt, pytorch code) have the ONNX route only.
A target's native routes are its descriptor's `native` (source kind -> module, modelport.targets);
a target whose descriptor says `onnx_route=False` has its native routes only: a source without
one is exit 2 naming the source kinds that have one, whatever `--route` says.

A native route module declares `NAME` (the converter, as the report names it), `AUTO`,
`PRECISIONS` (what it converts: a precision outside them is refused by `plan`, naming the
converter) and `SOURCE_ONLY` (True: it reads the source alone, never the ONNX IR — the TFLite
re-emission —, so a run whose targets all have such a route goes on when the IR fails parity
with the source: `orchestration.forward.from_source_alone`), and has
`refusal(ir, options) -> str | None` (why else it cannot serve these options, checked before
anything runs) and `emit(ir, out_dir, options) -> Artifact`; it reads the source through
`ir.source` (`ir.SourceRef`), and works on a copy of a source file, never on the user's file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from modelport.errors import BadInputError
from modelport.registry import Registry
from modelport.targets import TARGETS, on_register

if TYPE_CHECKING:
    from modelport.ir import IRModel

ROUTES = ("auto", "native", "onnx")

# "source kind:target" -> module; the source kind is the parser's name. From the targets'
# descriptors (`native`), and kept up with targets registered later.
NATIVE_ROUTES = Registry("native route", {})


def _add_routes(target) -> None:
    for kind, module in target.native.items():
        NATIVE_ROUTES.register(f"{kind}:{target.name}", module)


def _remove_routes(target) -> None:
    for kind in target.native:
        NATIVE_ROUTES.unregister(f"{kind}:{target.name}")


for _target in TARGETS.values():
    _add_routes(_target)
on_register(_add_routes, _remove_routes)


@dataclass
class Route:
    name: str  # "native" or "onnx"
    emitter: ModuleType
    converter: str


@dataclass
class Plan:
    """The routes to try for one target, in order, and why any other was passed over."""

    target: str
    asked: str
    routes: list[Route]
    notes: list[str] = field(default_factory=list)


def source_kind(ir: IRModel) -> str | None:
    """The parser name of the IR's source (keras, savedmodel, graphdef, pytorch, onnx, tflite)."""
    if ir.source is not None:
        return ir.source.kind
    return None


def kind_of(provenance: dict) -> str | None:
    """The parser name from an IR's provenance (`framework`, `format`)."""
    fw, fmt = provenance.get("framework"), provenance.get("format")
    if fw == "tensorflow":
        return "graphdef" if fmt == "graphdef" else "savedmodel"
    return fw


def native_routes() -> list[str]:
    return [k.replace(":", "→") for k in NATIVE_ROUTES]


def native_for(kind: str | None, target: str) -> ModuleType | None:
    key = f"{kind}:{target}"
    return NATIVE_ROUTES.load(key) if kind and key in NATIVE_ROUTES else None


def plan(ir: IRModel, target: str, asked: str, options, onnx_emitter: ModuleType | None) -> Plan:
    """The routes `target` is tried by under `--route asked`; exit 2 when `native` cannot be had,
    or when the target has native routes only and none from this source."""
    asked = asked or "auto"
    if asked not in ROUTES:
        raise BadInputError(f"unknown route '{asked}'; known: {', '.join(ROUTES)}")
    descriptor = TARGETS.get(target)
    if descriptor is not None and not descriptor.onnx_route:
        return _native_only(ir, target, asked, options)
    onnx = Route("onnx", onnx_emitter, getattr(onnx_emitter, "CONVERTER", "ONNX IR"))
    if asked == "onnx":
        return Plan(target, asked, [onnx])
    kind = source_kind(ir)
    native = native_for(kind, target)
    onnx_only = not any(k.endswith(f":{target}") for k in NATIVE_ROUTES)
    if native is None:
        if asked == "native" and not onnx_only:
            raise BadInputError(f"--route native: no native route from a {kind or 'Python object'} source to {target} "
                                f"(native routes: {', '.join(native_routes())})", hint="use --route onnx or auto")
        note = [] if onnx_only else [f"no native route from {kind} to {target}"]
        return Plan(target, asked, [onnx], note)
    route = Route("native", native, native.NAME)
    reason = refusal(native, ir, options)
    if reason:
        if asked == "native":
            raise BadInputError(f"--route native: {native.NAME} cannot convert to {target}: {reason}",
                                hint="use --route onnx or auto")
        return Plan(target, asked, [onnx], [f"native route ({native.NAME}) not taken: {reason}"])
    if asked == "native":
        return Plan(target, asked, [route])
    return Plan(target, asked, [route, onnx] if native.AUTO == "first" else [onnx, route])


def _native_only(ir: IRModel, target: str, asked: str, options) -> Plan:
    """A target reached by its native routes only: the one from this source, or exit 2 naming the kinds that have one."""
    kinds = [k.partition(":")[0] for k in NATIVE_ROUTES if k.endswith(f":{target}")]
    kind = source_kind(ir)
    if asked == "onnx":
        raise BadInputError(f"--route onnx: {target} has no ONNX route (it is reached from {', '.join(kinds) or 'no source'})",
                            hint="use --route native or auto")
    native = native_for(kind, target)
    if native is None:
        raise BadInputError(f"no route from a {kind or 'Python object'} source to {target}: {target} is reached from "
                            f"{', '.join(kinds) or 'no'} sources only", hint=f"convert a {' or '.join(kinds) or 'supported'} model")
    reason = refusal(native, ir, options)
    if reason:
        raise BadInputError(f"{native.NAME} cannot convert to {target}: {reason}")
    return Plan(target, asked, [Route("native", native, native.NAME)])


def refusal(native: ModuleType, ir: IRModel, options) -> str | None:
    """Why the native route `native` cannot serve these options: a precision it does not convert, or its own reason."""
    precision = options.precision if options is not None else None
    if precision is not None and precision not in native.PRECISIONS:
        return f"precision {precision} ({native.NAME} converts {', '.join(native.PRECISIONS)} only)"
    return native.refusal(ir, options)


def staged_source(ir: IRModel, work):
    """(source, spec) for a native converter: a copy of the source file or folder (and of a Keras
    weights file named beside an architecture JSON) inside `work`, so no converter reads or writes
    the user's file; a Python object or 'zoo:NAME' as it is. Exit 2 when the IR carries no source."""
    import shutil
    from dataclasses import replace
    from pathlib import Path

    ref = ir.source
    if ref is None:
        raise BadInputError("a native route needs the source model; this IR does not carry it", hint="use --route onnx")
    if not isinstance(ref.source, (str, Path)) or str(ref.source).startswith("zoo:"):
        return ref.source, ref.spec
    folder = Path(work) / "source"
    folder.mkdir(parents=True, exist_ok=True)

    def copy(p) -> Path:
        p = Path(p)
        p = p.parent if p.name == "saved_model.pb" and p.is_file() else p  # a SavedModel named by its .pb
        dest = folder / p.name
        if p.is_dir():
            shutil.copytree(p, dest, symlinks=False)
        else:
            shutil.copyfile(p, dest)
        return dest

    path = copy(ref.source)
    options = dict(ref.spec.options)
    if options.get("weights"):
        options["weights"] = str(copy(options["weights"]))
    return path, replace(ref.spec, path=path, options=options)
