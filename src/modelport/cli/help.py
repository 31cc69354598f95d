"""Help that teaches: every command's options grouped into panels, one worked example per command,
and value names (metavars) that say what to type instead of `<str>`/`<bool>`.

Applied once to the whole app after the commands are registered (`polish(app)`), from the tables
below, so a command module declares its options and nothing else. A flag's panel and value name
are looked up by its first spelling; the shared flags of `cli/options.py` are listed here too.
Nothing heavy is imported here.
"""

from __future__ import annotations

import inspect
import typing

import typer
from typer.core import TyperCommand, TyperGroup
from typer.models import ArgumentInfo, OptionInfo

SOURCE, TARGETS, VALIDATION, OPTIMISATION, OUTPUT = "Source", "Targets", "Validation", "Optimisation", "Output"

PANELS = {
    SOURCE: ("--from", "-in", "-iw", "--input", "--inputShape", "--output", "--arch", "--opset", "--trust", "--signature",
             "--input-names", "--layout", "--mean", "--std", "--scale", "--channel-order"),
    TARGETS: ("--to", "--plan-only", "--tflite-layout", "--tflite-io-dtype", "--trt-shapes", "--workspace", "--package", "--for",
              "--name", "--version", "--add-version", "--runtime", "--backend", "--device", "--postprocess", "--server",
              "--max-batch-size", "--instances", "--image", "--cpu", "--memory", "--gpus", "--replicas"),
    VALIDATION: ("--seed", "--dim", "--data", "--inputs", "--value", "--atol", "--rtol", "--min-cosine", "--strict", "--localize",
                 "--match-by-position"),
    OPTIMISATION: ("--optimize", "--level", "--passes", "--precision", "--int8-mode", "--calibration", "--calibration-method",
                   "--per-channel", "--keep-io-types", "--accuracy-budget", "--allow-precision-fallback"),
    OUTPUT: ("-o", "--force", "--json", "--quiet", "--cache-dir"),
}
PANEL_OF = {flag: panel for panel, flags in PANELS.items() for flag in flags}

METAVARS = {
    "--to": "T1,T2", "-o": "DIR", "--from": "FRAMEWORK", "-in": "FILE", "-iw": "FILE", "--input": "NAME:SHAPE[:DTYPE]",
    "--inputShape": "SHAPE", "--output": "NAMES", "--arch": "ARCH", "--opset": "N", "--signature": "NAME", "--input-names": "NAMES",
    "--optimize": "LEVEL", "--level": "LEVEL", "--passes": "P1,P2", "--precision": "PRECISION", "--accuracy-budget": "EXPR",
    "--package": "S1,S2", "--for": "S1,S2", "--dim": "NAME=N", "--seed": "N", "--data": "FILE.npz", "--value": "NAME=V",
    "--atol": "[OUTPUT=]X", "--rtol": "[OUTPUT=]X", "--min-cosine": "[OUTPUT=]X", "--layout": "[NAME=]LAYOUT",
    "--mean": "[NAME=]V,V,V", "--std": "[NAME=]V,V,V", "--scale": "[NAME=]V", "--channel-order": "RGB|BGR",
    "--calibration": "DATA", "--tflite-layout": "LAYOUT", "--tflite-io-dtype": "DTYPE", "--trt-shapes": "NAME:MIN:OPT:MAX",
    "--workspace": "MiB", "--int8-mode": "MODE", "--calibration-method": "METHOD", "--cache-dir": "DIR", "--runs": "N",
    "--duration": "SECONDS", "--warmup": "N", "--batch": "B1,B2", "--threads": "N", "--concurrency": "N", "--runtime": "RUNTIME",
    "--rate": "PER_SECOND", "--requests": "N", "--header": "'NAME: VALUE'", "--inputs": "FILE.npz",
}

EXAMPLES = {
    "convert": "modelport convert model.pt2 --to onnx,tflite -o out/",
    "inspect": "modelport inspect out/model.onnx | grep -i conv",
    "optimize": "modelport optimize out/model.onnx --level auto --accuracy-budget cosine>=0.999 -o opt/",
    "emit": "modelport emit out/model.onnx --to tflite,ort --precision fp16 -o edge/",
    "validate": "modelport validate model.pt2 out/model.tflite --data inputs.npz --atol logits=1e-3",
    "package": "modelport package out/ --for triton,k8s -o serve/",
    "bench": "modelport bench out/model.onnx out/model.tflite --batch 1,8 --runs 200   |   "
             "modelport bench http://127.0.0.1:8080/v2/models/cnn/infer --concurrency 8 --duration 30",
    "doctor": "modelport doctor --json",
    "zoo list": "modelport zoo list | grep keras",
    "zoo build": "modelport zoo build cnn_small -o src/",
    "zoo fetch": "modelport zoo fetch NAME --cache-dir ~/.cache/modelport",
}


def _quiet_flags(command, ctx) -> None:
    """No value name after an on/off flag (typer's own --help and completion flags included)."""
    for p in command.get_params(ctx):
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""


PANEL_ORDER = {None: 0, SOURCE: 1, TARGETS: 2, VALIDATION: 3, OPTIMISATION: 4, OUTPUT: 5}


def _no_type(ctx) -> None:
    return None


class Command(TyperCommand):
    """A command whose help lists its panels in PANEL_ORDER, names no `<type>` after arguments or flags."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.params.sort(key=lambda p: -1 if p.param_type_name == "argument" else PANEL_ORDER.get(getattr(p, "rich_help_panel", None), 9))
        for p in self.params:
            if p.param_type_name == "argument":
                p.display_type_rich = _no_type  # the argument's name (its metavar) says it

    def format_help(self, ctx, formatter) -> None:
        _quiet_flags(self, ctx)
        return super().format_help(ctx, formatter)


class Group(TyperGroup):
    def format_help(self, ctx, formatter) -> None:
        _quiet_flags(self, ctx)
        return super().format_help(ctx, formatter)


def _info(param: inspect.Parameter):
    if isinstance(param.default, (OptionInfo, ArgumentInfo)):
        return param.default
    if typing.get_origin(param.annotation) is typing.Annotated:
        return next((m for m in typing.get_args(param.annotation)[1:] if isinstance(m, (OptionInfo, ArgumentInfo))), None)
    return None


def _base_type(annotation):
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (list, typing.Union) or type(annotation).__name__ == "UnionType":
        return _base_type(args[0]) if args else str
    return annotation


def _fallback_metavar(annotation) -> str:
    kind = _base_type(annotation)
    return {bool: "", int: "N", float: "X"}.get(kind, "TEXT")


def _polish_command(name: str, info: typer.models.CommandInfo) -> None:
    if info.cls in (None, TyperCommand):
        info.cls = Command
    if info.epilog is None and name in EXAMPLES:
        info.epilog = "Example:  " + EXAMPLES[name]
    for param in inspect.signature(info.callback, eval_str=True).parameters.values():
        pinfo = _info(param)
        if pinfo is None:
            continue
        if isinstance(pinfo, ArgumentInfo):
            if pinfo.metavar is None:
                pinfo.metavar = param.name.upper() + ("..." if _is_list(param.annotation) else "")
            continue
        first = [pinfo.default] if isinstance(pinfo.default, str) and pinfo.default.startswith("-") else []
        decls = [d for d in [*first, *pinfo.param_decls] if d.startswith("-")]
        flag = next((d for d in decls if d in PANEL_OF or d in METAVARS), decls[0] if decls else None)
        if pinfo.rich_help_panel is None and flag in PANEL_OF:
            pinfo.rich_help_panel = PANEL_OF[flag]
        if pinfo.metavar is None:
            pinfo.metavar = METAVARS.get(flag) or _fallback_metavar(param.annotation)
        if _base_type(param.annotation) is bool:
            pinfo.metavar = ""


def _is_list(annotation) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return typing.get_origin(annotation) is list


def polish(app: typer.Typer, prefix: str = "") -> None:
    """Panels, value names and examples for every command of `app` (and of its sub-apps)."""
    if not isinstance(app.info.cls, type):  # typer's placeholder for its default group class
        app.info.cls = Group
    for info in app.registered_commands:
        _polish_command(prefix + (info.name or info.callback.__name__), info)
    for group in app.registered_groups:
        polish(group.typer_instance, prefix + group.name + " ")
