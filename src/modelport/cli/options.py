"""The flags several commands share, each declared once with its help text.

A command takes a flag as an annotation (`precision: flags.Precision = "fp32"`) or a whole group
of them with `@flags.taking(flags.TOLERANCES, ...)`, which adds the group's parameters to its
signature and hands their values over in `**shared`. The value a flag carries is checked by the
options class that owns it (OptimizeOptions, PackageOptions, the tolerance parser, each target's
options class), and every choice list named in a help text comes from the registry or class
that checks it. A target's own flags are declared by its options class, in its own module
(`modelport.targets.option`); TARGET_OPTIONS is built from those declarations. Nothing heavy is
imported here.
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Annotated, get_args

import typer

from modelport import targets
from modelport.registry import EMITTERS, PACKAGERS
from modelport.resolve.precisions import all_precisions

PRECISIONS = ("fp32", "fp16", "int8")  # optimize's (an ONNX model's)
EMIT_PRECISIONS = all_precisions()  # every target's (modelport.resolve.precisions); each target refuses the ones it does not take
ROUTES = ("auto", "native", "onnx")  # emitters.routes.ROUTES
HF_TASK_EXAMPLES = ("text-classification", "image-classification", "text2text-generation", "text-generation")  # in TASKS


def aliased(option, *extra: str):
    """`option` (an Annotated flag of this module) with more spellings for one command (MMdnn's)."""
    kind, info = get_args(option)
    info = copy.copy(info)
    info.param_decls = (*info.param_decls, *extra)
    return Annotated[kind, info]


def _tolerance(flag: str, text: str):
    return Annotated[list[str], typer.Option(flag, help=f"{text}; OUTPUT=VALUE for one output (repeatable, comma-separated).")]


# --- every command -------------------------------------------------------------------------------
JsonOut = Annotated[bool, typer.Option("--json", help="Print the result (the report) as exactly one JSON document on stdout.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No tables or progress on stderr.")]
Trust = Annotated[bool, typer.Option("--trust", help="Allow loading that runs code from the model (pickled modules, TorchScript, "
                                                     "Keras Lambda layers, generated model.py).")]
Force = Annotated[bool, typer.Option("--force", help="Replace an existing output folder that modelport wrote.")]
OutputDir = Annotated[str | None, typer.Option("-o", "--output-dir", help="Output folder (written through a staging folder).")]
Junit = Annotated[str | None, typer.Option("--junit", help="Also write the result as JUnit XML to this file (one test case per "
                                                            "target and parity hop), for CI systems.")]
KeepFailed = Annotated[bool, typer.Option("--keep-failed", help="On failure keep what was written in OUT.failed/ (marked by "
                                                                "FAILED.json) for debugging; never a valid output.")]

# --- sample inputs and parity --------------------------------------------------------------------
Seed = Annotated[int, typer.Option("--seed", help="Seed of the sample inputs.")]
Dim = Annotated[list[str], typer.Option("--dim", help="A symbolic dim: its size in the sample inputs (batch=4), or a range (batch=1..8) or sizes (seq=128,256,512) the artifacts keep it dynamic within (repeatable).")]
Inputs = Annotated[list[str], typer.Option("--input", "-i", help="NAME:SHAPE[:DTYPE], e.g. input:batch,3,224,224 (repeatable).")]
Data = Annotated[str | None, typer.Option("--data", help="Sample inputs to use instead of random ones: an .npz of arrays keyed "
                                                        "by input name, each used as given (leading axis the batch).")]
Value = Annotated[list[str], typer.Option("--value", help="NAME=V: a constant input (e.g. sr=16000), broadcast to its shape "
                                                          "and dtype; wins over --data (repeatable).")]
Samples = Annotated[int, typer.Option("--samples", min=1, help="Random sample sets every hop is judged on (different seeds "
                                                             "and scales; default 3).")]
NoStructured = Annotated[bool, typer.Option("--no-structured-samples", help="Judge every hop on the random sample sets only "
                                                                          "(no all-zeros, constant or range-end inputs).")]
Atol = _tolerance("--atol", "Absolute tolerance (scaled by each output's magnitude), e.g. 1e-4")
Rtol = _tolerance("--rtol", "Relative tolerance, e.g. 1e-3")
MinCosine = _tolerance("--min-cosine", "Minimum cosine similarity, e.g. 0.999")
Strict = Annotated[bool, typer.Option("--strict", help="An optimisation pass that breaks parity, a source output that ignores "
                                                       "its input, or a model that cannot be run here (Core ML off macOS) fails the "
                                                       "run (exit 4).")]
AllowFallback = Annotated[bool, typer.Option("--allow-precision-fallback", help="Accept an FP32 artifact when --precision cannot "
                                                                                "be delivered within tolerance (else exit 4).")]

# --- what a source holds ---------------------------------------------------------------------------
Task = Annotated[str | None, typer.Option("--task", help=f"Hugging Face folders: what to export, e.g. {', '.join(HF_TASK_EXAMPLES)} "
                                                         "(an unknown task lists them all); default: inferred from config.json's "
                                                         "architectures.")]

# --- precision and optimisation ------------------------------------------------------------------
Precision = Annotated[str, typer.Option("--precision", help=f"{', '.join(PRECISIONS)}.")]
_OWN_DEFAULTS = ", ".join(f"{t.name}: {t.precisions[0]}" for t in targets.emitting() if t.precisions and t.precisions[0] != "fp32")
EmitPrecision = Annotated[str, typer.Option("--precision", help=f"{', '.join(EMIT_PRECISIONS)}, for every target (each takes its own: "
                                                                "docs/precisions.md). Default: each target's own (fp32, "
                                                                f"{_OWN_DEFAULTS}).")]
Calibration = Annotated[str | None, typer.Option("--calibration", help="INT8 calibration data: .npz of named inputs or a folder of images.")]
AccuracyBudget = Annotated[str | None, typer.Option("--accuracy-budget", help="e.g. cosine>=0.999 or max_abs<=0.01 (precision passes and auto).")]

# --- the I/O contract's layout and preprocessing (also image calibration data) -------------------
Layout = Annotated[list[str], typer.Option("--layout", help="Input layout, e.g. NCHW or image=NHWC.")]
Mean = Annotated[list[str], typer.Option("--mean", help="Preprocessing mean, e.g. 0.485,0.456,0.406 or NAME=...")]
Std = Annotated[list[str], typer.Option("--std", help="Preprocessing std, e.g. 0.229,0.224,0.225 or NAME=...")]
Scale = Annotated[list[str], typer.Option("--scale", help="Preprocessing scale, e.g. 0.00392 or NAME=...")]
ChannelOrder = Annotated[str | None, typer.Option("--channel-order", help="RGB or BGR.")]
ValueRange = Annotated[list[str], typer.Option("--range", help="The values an input takes, LOW,HIGH or NAME=LOW,HIGH, e.g. "
                                                              "mel=-100,40: its sample sets stay inside it (no sweep).")]

# --- targets, routes, and each target's own flags (declared by its options class) -----------------
Targets = Annotated[list[str], typer.Option("--to", help=f"Target(s), comma-separated or repeated: {', '.join(EMITTERS)}.")]
Route = Annotated[str, typer.Option("--route", help=f"How {', '.join(t.name for t in targets.TARGETS.values() if t.native)} are reached: "
                                                     f"{', '.join(ROUTES)} (auto: the source framework's own converter where there is "
                                                     "one, else or on failure ONNX).")]


def _target_flag(flag: targets.Flag):
    """A target options field's flag: a repeatable option for a tuple field."""
    kind = list[str] if flag.kind == tuple[str, ...] else flag.kind
    default = list(flag.default) if isinstance(flag.default, tuple) else flag.default
    return flag.param, Annotated[kind, typer.Option(flag.flag, help=flag.help)], default


# --- bounds on each stage (stage_limits.py) -----------------------------------------------------
StageTimeout = Annotated[float | None, typer.Option("--stage-timeout", help="Seconds one stage may run before it is stopped "
                                                                            "(default 3600; MODELPORT_STAGE_TIMEOUT).")]
StageMemory = Annotated[str | None, typer.Option("--stage-memory", help="Memory one stage may take beyond what the run held "
                                                                       "when it began, process and children, e.g. 32G "
                                                                       "(default: what the machine has available when the "
                                                                       "stage begins, less 1 GiB; MODELPORT_STAGE_MEMORY).")]

# --- serving -------------------------------------------------------------------------------------
Systems = Annotated[list[str], typer.Option("--for", help=f"Serving system(s), comma-separated or repeated: {', '.join(PACKAGERS)}.")]


# --- groups of flags that commands take together: (parameter name, flag, default) ----------------
RESULT = (("json_out", JsonOut, False), ("quiet", Quiet, False), ("junit", Junit, None))
LIMITS = (("stage_timeout", StageTimeout, None), ("stage_memory", StageMemory, None))
WRITES = (("output", OutputDir, None), ("force", Force, False))
TOLERANCES = (("atol", Atol, []), ("rtol", Rtol, []), ("min_cosine", MinCosine, []))
SAMPLES = (("inputs", Inputs, []), ("dim", Dim, []), ("seed", Seed, 0), ("data", Data, None), ("values", Value, []))
SAMPLE_SETS = (("samples", Samples, 3), ("no_structured", NoStructured, False))
PRECISION = (("calibration", Calibration, None), ("strict", Strict, False), ("allow_fallback", AllowFallback, False))
PREPROCESSING = (("layout", Layout, []), ("mean", Mean, []), ("std", Std, []), ("scale", Scale, []),
                 ("channel_order", ChannelOrder, None), ("value_range", ValueRange, []))
TARGET_FLAGS = targets.flags()
TARGET_OPTIONS = (*(_target_flag(f) for f in TARGET_FLAGS), ("route", Route, "auto"))


def taking(*groups):
    """Add the flags of `groups` to a command's parameters (after its own; a parameter the command
    declares itself, e.g. a required `-o`, wins). The command receives them in `**shared`."""
    def decorate(fn):
        own = inspect.signature(fn, eval_str=True)
        mine = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        names = {p.name for p in mine}
        extra = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=flag)
                 for group in groups for name, flag, default in group if name not in names]

        @functools.wraps(fn)
        def command(**values):
            return fn(**values)

        command.__signature__ = own.replace(parameters=[*mine, *extra])
        command.__annotations__ = {**{p.name: p.annotation for p in mine}, **{p.name: p.annotation for p in extra}}
        return command
    return decorate


def tolerances(shared: dict) -> tuple[dict, dict]:
    """TOLERANCES as (defaults, per-output overrides); see validation.parse_tolerance_flags."""
    from modelport.validation import parse_tolerance_flags

    return parse_tolerance_flags(atol=shared["atol"], rtol=shared["rtol"], min_cosine=shared["min_cosine"])


def parity_kwargs(shared: dict) -> dict:
    """ConvertOptions keywords from TOLERANCES and SAMPLES' --dim, --seed, --data and --value."""
    from modelport.dims import parse_dims

    tols, per_output = tolerances(shared)
    dims = parse_dims(shared["dim"])
    return {**tols, "output_tolerances": per_output, "sample_dims": {n: d.sample for n, d in dims.items()},
            "dim_bounds": {n: d for n, d in dims.items() if d.kind != "fixed"}, "seed": shared["seed"],
            "data": shared["data"], "values": list(shared["values"]),
            "sampling": {"randoms": shared.get("samples", 3), "structured": not shared.get("no_structured", False)}}


def limit_kwargs(shared: dict) -> dict:
    """ConvertOptions keywords from LIMITS."""
    return {"stage_timeout": shared["stage_timeout"], "stage_memory": shared["stage_memory"]}


def preprocessing_kwargs(shared: dict) -> dict:
    """`specs.apply_options` keywords from PREPROCESSING."""
    return {"layouts": shared["layout"], "means": shared["mean"], "stds": shared["std"], "scales": shared["scale"],
            "channel_order": shared["channel_order"], "ranges": shared["value_range"]}


def target_kwargs(shared: dict) -> dict:
    """ConvertOptions keywords from TARGET_OPTIONS: each target's options object (`target_options`),
    built and checked by its class from its flags, and the route."""
    given: dict[str, dict] = {}
    for f in TARGET_FLAGS:
        if f.target not in targets.TARGETS:  # a plug-in's target taken out since the command line was built
            continue
        value = shared[f.param]
        given.setdefault(f.target, {})[f.field] = tuple(value) if isinstance(value, list) else value
    return {"route": shared["route"],
            "target_options": {name: targets.load(targets.get(name).options)(**fields) for name, fields in given.items()}}
