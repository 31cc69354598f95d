"""Help that teaches: every command's options grouped into panels, one worked example per command,
and value names (metavars) that say what to type instead of `<str>`/`<bool>`.

`polish(app)` makes every command of the app a `Command`, which dresses its click parameters from
the tables below when typer builds it, so a command module declares its options and nothing
else. A flag's panel and value name are looked up by any of its spellings; the shared flags of
`cli/options.py` are listed here too, and each target's own flags (declared by its options class:
`modelport.targets.flags`) join the Targets panel with their value names. Nothing heavy is imported here.
"""

from __future__ import annotations

import typer
from typer.core import TyperCommand, TyperGroup

from modelport.targets import flags as target_flags

SOURCE, TARGETS, VALIDATION, OPTIMISATION, OUTPUT = "Source", "Targets", "Validation", "Optimisation", "Output"
QUANTISATION = "FP16/INT8 details"
BATCH = "Batch"

PANELS = {
    SOURCE: ("--from", "--task", "-in", "-iw", "--input", "--inputShape", "--output", "--arch", "--arch-args", "--state-dict-key",
             "--opset", "--trust", "--signature", "--input-names", "--layout", "--mean", "--std", "--scale", "--channel-order", "--range"),
    TARGETS: ("--to", "--route", *(f.flag for f in target_flags()), "--package", "--for",
              "--name", "--version", "--add-version", "--runtime", "--backend", "--device", "--postprocess", "--server",
              "--max-batch-size", "--instances", "--image", "--cpu", "--memory", "--gpus", "--replicas"),
    VALIDATION: ("--seed", "--dim", "--data", "--inputs", "--value", "--atol", "--rtol", "--min-cosine", "--strict", "--localize",
                 "--match-by-position", "--max-size-growth", "--max-nodes-growth", "--max-error-growth", "--max-cosine-drop",
                 "--max-latency-growth", "--new-tokens", "--reference"),
    OPTIMISATION: ("--optimize", "--level", "--passes", "--precision", "--runtimes", "--calibration", "--accuracy-budget",
                   "--allow-precision-fallback"),
    QUANTISATION: ("--int8-mode", "--calibration-method", "--per-channel", "--keep-io-types", "--block-size", "--asymmetric"),
    BATCH: ("--jobs", "--executor", "--address", "--rerun-failed", "--only", "--emit", "--pvc"),
    OUTPUT: ("-o", "--force", "--keep-failed", "--json", "--junit", "--quiet", "--cache-dir", "--all", "--stage-timeout",
             "--stage-memory"),
}
PANEL_OF = {flag: panel for panel, flags in PANELS.items() for flag in flags}

METAVARS = {
    "--to": "T1,T2", "-o": "DIR", "--from": "FRAMEWORK", "-in": "FILE", "-iw": "FILE", "--input": "NAME:SHAPE[:DTYPE]",
    "--inputShape": "SHAPE", "--output": "NAMES", "--arch": "ARCH", "--arch-args": "NAME=V[,NAME=V]", "--state-dict-key": "KEY", "--opset": "N", "--signature": "NAME", "--input-names": "NAMES",
    "--optimize": "LEVEL", "--level": "LEVEL", "--passes": "P1,P2", "--precision": "PRECISION", "--accuracy-budget": "EXPR",
    "--package": "S1,S2", "--for": "S1,S2", "--dim": "NAME=N", "--seed": "N", "--data": "FILE.npz", "--value": "NAME=V",
    "--atol": "[OUTPUT=]X", "--rtol": "[OUTPUT=]X", "--min-cosine": "[OUTPUT=]X", "--layout": "[NAME=]LAYOUT",
    "--mean": "[NAME=]V,V,V", "--std": "[NAME=]V,V,V", "--scale": "[NAME=]V", "--channel-order": "RGB|BGR", "--range": "[NAME=]LOW,HIGH",
    "--calibration": "DATA", **{f.flag: f.metavar for f in target_flags() if f.metavar}, "--int8-mode": "MODE", "--calibration-method": "METHOD", "--cache-dir": "DIR", "--runs": "N",
    "--duration": "SECONDS", "--warmup": "N", "--batch": "B1,B2", "--threads": "N", "--concurrency": "N", "--runtime": "RUNTIME",
    "--rate": "PER_SECOND", "--requests": "N", "--header": "'NAME: VALUE'", "--inputs": "FILE.npz",
    "--task": "TASK", "--runtimes": "R1,R2", "--route": "ROUTE", "--junit": "FILE.xml", "--jobs": "N", "--executor": "local|ray", "--address": "HOST:PORT", "--only": "NAMES",
    "--max-size-growth": "FRACTION", "--max-nodes-growth": "FRACTION", "--max-error-growth": "FACTOR", "--max-cosine-drop": "X",
    "--max-latency-growth": "FRACTION", "--emit": "k8s-job", "--pvc": "CLAIM", "--stage-timeout": "SECONDS",
    "--stage-memory": "SIZE",
}

EXAMPLES = {
    "convert": "modelport convert model.pt2 --to onnx,tflite -o out/",
    "inspect": "modelport inspect out/model.onnx | grep -i conv",
    "optimize": "modelport optimize out/model.onnx --level auto --accuracy-budget cosine>=0.999 -o opt/",
    "emit": "modelport emit out/model.onnx --to tflite,ort --precision fp16 -o edge/",
    "validate": "modelport validate model.pt2 out/model.tflite --data inputs.npz --atol logits=1e-3",
    "package": "modelport package out/ --for triton,k8s -o serve/",
    "serve": "modelport serve out/ --http-port 8000 --grpc-port 8001 --max-batch-size 8",
    "bench": "modelport bench out/model.onnx out/model.tflite --batch 1,8 --runs 200   |   "
             "modelport bench http://127.0.0.1:8080/v2/models/cnn/infer --concurrency 8 --duration 30",
    "doctor": "modelport doctor --json",
    "batch": "modelport batch models.yaml -o nightly/ --jobs 2 --junit nightly.xml",
    "report diff": "modelport report diff last-night/summary.json tonight/summary.json --json",
    "zoo list": "modelport zoo list | grep keras",
    "zoo build": "modelport zoo build cnn_small -o src/",
    "zoo fetch": "modelport zoo fetch NAME --cache-dir ~/.cache/modelport",
    "repo list": "modelport repo list repo/",
    "repo add": "modelport repo add repo/ ranker runs/v8/",
    "repo promote": "modelport repo promote repo/ ranker 8",
    "repo rollback": "modelport repo rollback repo/ ranker",
}


def _value_name(p) -> str:
    """What to type after an option: its entry in METAVARS, else by its type (nothing after a flag)."""
    if getattr(p, "is_flag", False):
        return ""
    flag = next((o for o in p.opts if o in METAVARS), None)
    if flag:
        return METAVARS[flag]
    kind = p.bare_type() if hasattr(p, "bare_type") else ""
    return {"int": "N", "float": "X", "list[int]": "N", "list[float]": "X"}.get(kind, "TEXT")


def _dress(params) -> None:
    """Panels and value names on a command's click parameters, from the tables above."""
    for p in params:
        if p.param_type_name == "argument":
            if p.metavar is None:
                p.metavar = p.name.upper() + ("..." if p.nargs != 1 else "")
            p.display_type_rich = _no_type  # the argument's name (its metavar) says it
            continue
        if getattr(p, "rich_help_panel", None) is None:
            p.rich_help_panel = next((PANEL_OF[o] for o in p.opts if o in PANEL_OF), None)
        if p.metavar is None:
            p.metavar = _value_name(p)


PANEL_ORDER = {None: 0, SOURCE: 1, TARGETS: 2, VALIDATION: 3, OPTIMISATION: 4, QUANTISATION: 5, BATCH: 6, OUTPUT: 7}


def _no_type(ctx) -> None:
    return None


def _quiet_flags(command, ctx) -> None:
    """No value name after typer's own flags (--help, the completion flags) either."""
    for p in command.get_params(ctx):
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""


class Command(TyperCommand):
    """A command whose help lists its options in panels (PANEL_ORDER), with value names, not `<type>`s."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _dress(self.params)
        self.params.sort(key=lambda p: -1 if p.param_type_name == "argument" else PANEL_ORDER.get(p.rich_help_panel, 9))

    def format_help(self, ctx, formatter) -> None:
        _quiet_flags(self, ctx)
        return super().format_help(ctx, formatter)


class Group(TyperGroup):
    def format_help(self, ctx, formatter) -> None:
        _quiet_flags(self, ctx)
        return super().format_help(ctx, formatter)


def polish(app: typer.Typer, prefix: str = "") -> None:
    """Every command of `app` (and of its sub-apps) built by Command/Group, with its example."""
    if not isinstance(app.info.cls, type):  # typer's placeholder for its default group class
        app.info.cls = Group
    for info in app.registered_commands:
        name = prefix + (info.name or info.callback.__name__)
        if info.cls in (None, TyperCommand):
            info.cls = Command
        if info.epilog is None and name in EXAMPLES:
            info.epilog = "Example:  " + EXAMPLES[name]
    for group in app.registered_groups:
        polish(group.typer_instance, prefix + group.name + " ")
