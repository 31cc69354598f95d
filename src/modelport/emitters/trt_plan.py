"""The TensorRT build plan: optimisation profiles, precision, workspace, and the equivalent trtexec command.

Profiles come from the I/O contract: every dynamic dim gets min/opt/max, either from the user
(`NAME:MIN:OPT:MAX`, shapes written `1x3x224x224`) or derived: min 1, opt the size the sample
data used, max 4× that (at least 8). Every name the user gives is checked against the model's
real inputs: trtexec silently builds a 1×… profile for a misspelt name, we refuse it.

Precision by TensorRT version: 10.x is weakly typed by default (`--fp16` lets the builder
choose FP16 kernels); from 11.x networks are strongly typed and precision flags are gone, so an
FP16 engine is built from an FP16 ONNX file (our precision pass) with no flag at all.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from modelport.errors import BadInputError
from modelport.ir import IRModel

DEFAULT_WORKSPACE_MIB = 4096


@dataclass
class Profile:
    name: str
    min: list[int]
    opt: list[int]
    max: list[int]
    source: str  # "user" | "declared" (--dim bounds) | "derived" | "static"

    def to_dict(self) -> dict:
        return {"name": self.name, "min": self.min, "opt": self.opt, "max": self.max, "source": self.source}


@dataclass
class BuildPlan:
    precision: str
    workspace_mib: int
    profiles: list[Profile] = field(default_factory=list)
    onnx: str = "model.onnx"
    onnx_fp16: str | None = None
    engine: str = "../model.plan"
    timing_cache: str = "timing.cache"

    def to_dict(self) -> dict:
        return {"precision": self.precision, "workspace_mib": self.workspace_mib, "onnx": self.onnx,
                "onnx_fp16": self.onnx_fp16, "engine": self.engine, "timing_cache": self.timing_cache,
                "profiles": [p.to_dict() for p in self.profiles]}


def parse_shape(text: str, what: str) -> list[int]:
    try:
        dims = [int(d) for d in text.lower().split("x")]
    except ValueError:
        raise BadInputError(f"{what}: '{text}' is not a shape like 1x3x224x224") from None
    if not dims or any(d < 1 for d in dims):
        raise BadInputError(f"{what}: '{text}' must have positive dims")
    return dims


def parse_shapes_option(items: list[str] | str | None) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """'NAME:MIN:OPT:MAX' (repeatable or comma-separated) -> {name: (min, opt, max)}."""
    if not items:
        return {}
    if isinstance(items, str):
        items = [items]
    out = {}
    for item in (i for entry in items for i in entry.split(",") if i.strip()):
        parts = item.strip().rsplit(":", 3)
        if len(parts) != 4 or not parts[0]:
            raise BadInputError(f"--trt-shapes '{item}': expected NAME:MIN:OPT:MAX, e.g. input:1x3x224x224:8x3x224x224:32x3x224x224")
        name = parts[0]
        mn, opt, mx = (parse_shape(p, f"--trt-shapes {name}") for p in parts[1:])
        if not (len(mn) == len(opt) == len(mx)):
            raise BadInputError(f"--trt-shapes {name}: min, opt and max must have the same rank")
        if any(not (a <= b <= c) for a, b, c in zip(mn, opt, mx, strict=False)):
            raise BadInputError(f"--trt-shapes {name}: every dim needs min <= opt <= max")
        out[name] = (mn, opt, mx)
    return out


def derive_profiles(ir: IRModel, user: dict[str, tuple[list[int], list[int], list[int]]]) -> list[Profile]:
    names = [s.name for s in ir.inputs]
    unknown = [n for n in user if n not in names]
    if unknown:
        raise BadInputError(f"--trt-shapes names {unknown} are not inputs of the model; its inputs are {names}")
    ref = ir.reference.inputs if ir.reference else {}
    profiles = []
    for spec in ir.inputs:
        if spec.name in user:
            mn, opt, mx = user[spec.name]
            if len(mn) != len(spec.shape):
                raise BadInputError(f"--trt-shapes {spec.name}: rank {len(mn)}, the input has rank {len(spec.shape)} ({spec.shape})")
            for i, d in enumerate(spec.shape):
                if isinstance(d, int) and not (mn[i] == opt[i] == mx[i] == d):
                    raise BadInputError(f"--trt-shapes {spec.name}: axis {i} is fixed at {d} in the model")
            profiles.append(Profile(spec.name, mn, opt, mx, "user"))
            continue
        if not spec.dynamic_dims:
            shape = [int(d) for d in spec.shape]
            profiles.append(Profile(spec.name, shape, shape, shape, "static"))
            continue
        sample = list(ref[spec.name].shape) if spec.name in ref else list(spec.concrete_shape(ir.sample_dims))
        mn, opt, mx, declared = [], [], [], False
        bounds = getattr(ir, "dim_bounds", None) or {}
        for i, d in enumerate(spec.shape):
            if isinstance(d, int):
                mn.append(d), opt.append(d), mx.append(d)
            elif d in bounds:  # --dim batch=1..8: the profile spans the declared bounds
                mn.append(bounds[d].low), opt.append(int(sample[i])), mx.append(bounds[d].high)
                declared = True
            else:
                o = int(sample[i])
                mn.append(1), opt.append(o), mx.append(max(4 * o, 8))
        profiles.append(Profile(spec.name, mn, opt, mx, "declared" if declared else "derived"))
    return profiles


def make_plan(ir: IRModel, precision: str, *, shapes=None, workspace_mib: int | None = None) -> BuildPlan:
    plan = BuildPlan(precision=precision, workspace_mib=int(workspace_mib or DEFAULT_WORKSPACE_MIB))  # checked by TensorRTOptions
    plan.profiles = derive_profiles(ir, parse_shapes_option(shapes))
    if precision in ("fp16", "best"):
        plan.onnx_fp16 = "model_fp16.onnx"
    return plan


def _shape(dims: list[int]) -> str:
    return "x".join(str(d) for d in dims)


def trtexec_command(plan: BuildPlan, trt_major: int) -> str:
    """The trtexec command that builds the same engine, for the given TensorRT major version."""
    onnx = plan.onnx_fp16 if (trt_major >= 11 and plan.onnx_fp16) else plan.onnx
    args = ["trtexec", f"--onnx={onnx}", f"--saveEngine={plan.engine}"]
    dyn = [p for p in plan.profiles if p.min != p.max]
    if dyn:
        for flag, key in (("--minShapes", "min"), ("--optShapes", "opt"), ("--maxShapes", "max")):
            args.append(f"{flag}=" + ",".join(f"{p.name}:{_shape(getattr(p, key))}" for p in dyn))
    args.append(f"--memPoolSize=workspace:{plan.workspace_mib}M")
    args.append(f"--timingCacheFile={plan.timing_cache}")
    if trt_major < 11:
        if plan.precision == "fp16":
            args.append("--fp16")
        elif plan.precision == "best":
            args.append("--best")
    return " ".join(shlex.quote(a) for a in args)


def trtexec_script(plan: BuildPlan) -> str:
    """A shell script choosing the command by the installed TensorRT major version."""
    return (
        "#!/bin/sh\n"
        "# Builds ../model.plan on the serving machine. TensorRT 11 is strongly typed: its command\n"
        "# takes the FP16 ONNX file instead of a precision flag.\n"
        "set -e\ncd \"$(dirname \"$0\")\"\n"
        "major=$(python3 -c 'import tensorrt; print(tensorrt.__version__.split(\".\")[0])' 2>/dev/null || echo 10)\n"
        f"if [ \"$major\" -ge 11 ]; then\n  {trtexec_command(plan, 11)}\nelse\n  {trtexec_command(plan, 10)}\nfi\n"
    )
