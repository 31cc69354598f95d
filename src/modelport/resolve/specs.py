"""Parsing the user's tensor specs: `NAME:SHAPE[:DTYPE]`, MMdnn's `--inputShape`, layouts, mean/std."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelport.dims import parse_dims as parse_dim_specs
from modelport.errors import BadInputError
from modelport.ir import LAYOUTS, Preprocess, TensorSpec

DTYPES = {
    "float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16", "f16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "double": "float64",
    "int64": "int64", "i64": "int64", "long": "int64",
    "int32": "int32", "i32": "int32", "int": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
}
_DIM = re.compile(r"^(\d+|[A-Za-z_][A-Za-z0-9_]*|\?|-1)$")
# words that can only be meant as a dtype (a misspelt or unsupported one), never as a dim name
_DTYPE_LIKE = re.compile(r"^(float|bfloat|double|half|long|bool|complex|string|fp|bf|int|uint|[ifu])\d+$|^(float|double|half|bool|bfloat)$",
                         re.IGNORECASE)
SCALAR_SHAPES = ("scalar", "[]", "()")  # a 0-d input's SHAPE
_SHAPE_TEXT = re.compile(r"[\[\(]?[\w?,\-]*[\]\)]?")


def _looks_like_shape(text: str) -> bool:
    # a lone '0' is TensorFlow's output index ('x:0'), never a shape (a dim of 0 is invalid)
    return text != "0" and bool(_SHAPE_TEXT.fullmatch(text)) and (any(c.isdigit() for c in text) or "," in text)


def unknown_dtype(text: str, word: str) -> BadInputError:
    known = ", ".join(sorted(set(DTYPES.values())))
    return BadInputError(f"bad input spec '{text}': unknown dtype '{word}'; known: {known}")


def parse_shape(text: str) -> list[int | str]:
    """'1x3x224x224', '1,3,224,224', 'batch,3,224,224' or '[1,3,224,224]'; '?'/-1 become named dims."""
    t = text.strip().strip("[]()")
    if not t:
        return []
    parts = re.split(r"[x,]", t) if "," in t or re.fullmatch(r"[\dx]+", t) else [t]
    dims: list[int | str] = []
    for i, p in enumerate(parts):
        p = p.strip()
        if not _DIM.match(p):
            raise BadInputError(f"bad shape '{text}': dim '{p}' is neither a number nor a name")
        if p in ("?", "-1"):
            dims.append(f"dim{i}")
        elif p.isdigit():
            if int(p) == 0:
                raise BadInputError(f"bad shape '{text}': a dim of 0")
            dims.append(int(p))
        else:
            dims.append(p)
    return dims


def parse_input_spec(text: str) -> TensorSpec:
    """`NAME[:SHAPE[:DTYPE]]`; the name may itself hold ':' (TensorFlow's 'x:0'). SHAPE `scalar`
    (or `[]`, `()`) declares a 0-d input, e.g. a sample rate: `sr:scalar:int64`."""
    pieces = text.split(":")
    dtype = "float32"
    if len(pieces) > 1 and pieces[-1].lower() in DTYPES:
        dtype = DTYPES[pieces.pop().lower()]
    elif len(pieces) > 1 and (_DTYPE_LIKE.match(pieces[-1]) or (len(pieces) > 2 and _looks_like_shape(pieces[-2]))):
        raise unknown_dtype(text, pieces[-1])  # NAME:SHAPE:WORD, or NAME:float99
    shape: list[int | str] = []
    scalar = len(pieces) > 1 and pieces[-1].strip().lower() in SCALAR_SHAPES
    if scalar:
        pieces.pop()
    elif len(pieces) > 1 and _looks_like_shape(pieces[-1]):
        shape = parse_shape(pieces.pop())
    name = ":".join(pieces)
    if not name:
        raise BadInputError(f"bad input spec '{text}': expected NAME:SHAPE[:DTYPE], e.g. input:1x3x224x224")
    return TensorSpec(name=name, dtype=dtype, shape=shape, scalar=scalar)


def positional_name(i: int) -> str:
    """A placeholder for 'the i-th input of the model', resolved when the model's inputs are known."""
    return f"#{i}"


def positional_index(name: str) -> int | None:
    return int(name[1:]) if name.startswith("#") and name[1:].isdigit() else None


def parse_floats(text: str, what: str) -> list[float]:
    try:
        return [float(v) for v in text.strip("[]").split(",") if v.strip()]
    except ValueError:
        raise BadInputError(f"bad {what} '{text}': expected comma-separated numbers") from None


def _split_named(text: str) -> tuple[str | None, str]:
    if "=" in text:
        name, _, value = text.partition("=")
        return name, value
    return None, text


def apply_options(
    specs: list[TensorSpec], *, input_shapes: list[str] = (), layouts: list[str] = (),
    means: list[str] = (), stds: list[str] = (), scales: list[str] = (), channel_order: str | None = None,
    ranges: list[str] = (),
) -> list[TensorSpec]:
    """Fold MMdnn-style --inputShape and the --layout/--mean/--std/--scale/--range options into specs.

    Each option is 'VALUE' (first input, or every input for --layout) or 'NAME=VALUE'. `--range
    LOW,HIGH` is the values the input takes: the sample sets stay inside it (`sample_sets.py`).
    """
    specs = list(specs)
    for i, shape_text in enumerate(input_shapes):
        shape = parse_shape(shape_text)
        if i < len(specs):
            specs[i].shape = specs[i].shape or shape
        else:
            specs.append(TensorSpec(name=positional_name(i), shape=shape))

    def target(name: str | None, option: str) -> list[TensorSpec]:
        if name is None:
            if not specs:
                specs.append(TensorSpec(name=positional_name(0)))
            return specs[:1]
        found = [s for s in specs if s.name == name]
        if not found:
            specs.append(TensorSpec(name=name))
            found = specs[-1:]
        return found

    for text in layouts:
        name, value = _split_named(text)
        value = value.upper()
        if value not in LAYOUTS:
            raise BadInputError(f"unknown --layout '{text}'; known: {', '.join(LAYOUTS)}")
        for s in (target(name, "--layout") if name else (specs or target(None, "--layout"))):
            s.layout = value
    for option, values, attr in (("--mean", means, "mean"), ("--std", stds, "std"), ("--scale", scales, "scale")):
        for text in values:
            name, value = _split_named(text)
            nums = parse_floats(value, option)
            for s in target(name, option):
                s.preprocess = s.preprocess or Preprocess()
                setattr(s.preprocess, attr, nums[0] if attr == "scale" else nums)
    for text in ranges:
        name, value = _split_named(text)
        nums = parse_floats(value, "--range")
        if len(nums) != 2 or not nums[0] < nums[1]:
            raise BadInputError(f"bad --range '{text}': expected LOW,HIGH with LOW < HIGH, e.g. -100,40")
        for s in target(name, "--range"):
            s.value_range = nums
    if channel_order:
        if channel_order.upper() not in ("RGB", "BGR"):
            raise BadInputError(f"bad --channel-order '{channel_order}': RGB or BGR")
        for s in target(None, "--channel-order"):
            s.preprocess = s.preprocess or Preprocess()
            s.preprocess.channel_order = channel_order.upper()
    return specs


def parse_dims(values: list[str]) -> dict[str, int]:
    """`--dim NAME=VALUE`: the size symbolic dims take in sample data (a range or a list of sizes:
    the size inside it that `dims.DimSpec.sample` picks; `dims.parse_dims` keeps the bounds)."""

    return {name: spec.sample for name, spec in parse_dim_specs(values).items()}


_ARG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ARCH_ARGS_EXAMPLE = "model=tiny,dim=256"


def _json_scalar(text: str):
    """A JSON scalar (256, 0.5, true, null, "x") as its Python value; any other text is a string."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if value is None or isinstance(value, (bool, int, float, str)) else text


def parse_arch_args(texts) -> dict[str, Any]:
    """`--arch-args NAME=VALUE[,NAME=VALUE...]` (repeatable): keyword arguments for the `--arch`
    constructor, so that a checkpoint saved from a non-default configuration (`model=tiny`) can be
    rebuilt. A value is read as a JSON scalar (256, 0.5, true, false, null), else kept as text."""
    out: dict[str, Any] = {}
    for text in [texts] if isinstance(texts, str) else list(texts or ()):
        if not str(text).strip():
            continue
        for item in str(text).split(","):
            name, eq, value = item.partition("=")
            name, value = name.strip(), value.strip()
            if not eq or not _ARG_NAME.fullmatch(name) or not value:
                raise BadInputError(f"bad --arch-args '{text}': '{item.strip()}' is not NAME=VALUE with a Python name; "
                                    f"expected e.g. {ARCH_ARGS_EXAMPLE}")
            if name in out:
                raise BadInputError(f"bad --arch-args '{text}': '{name}' is given twice")
            out[name] = _json_scalar(value)
    return out


def arch_args_text(args: dict[str, Any]) -> str:
    """`args` as the `--arch-args` text that gives them."""
    return ",".join(f"{k}={v if isinstance(v, str) and _json_scalar(v) == v else json.dumps(v)}" for k, v in args.items())


def check_arch_args(fn, args: dict[str, Any], what: str, *, reserved: tuple[str, ...] = ()) -> list[str]:
    """The keyword parameters `fn` (a class or a builder) takes, less `reserved` ones (a zoo builder's
    `seed`); exit 2 when `args` names one it does not take. A callable whose signature cannot be read,
    or that takes **kwargs, accepts anything here and lets the call decide."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    takes = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in reserved]
    if args and not any(p.kind is p.VAR_KEYWORD for p in params):
        unknown = [k for k in args if k not in takes]
        if unknown:
            offer = f"it takes {', '.join(takes)}" if takes else "it takes no constructor arguments"
            raise BadInputError(f"--arch-args {', '.join(unknown)}: {what} has no such parameter ({offer})")
    return takes


@dataclass
class SourceSpec:
    """Everything the user told us about the source, beyond the file itself: what
    `parsers.parse(source, spec)` is asked to read (here, below the parsers, so that the zoo and
    the orchestration build one without importing them)."""

    path: Path | None = None
    framework: str | None = None
    inputs: list[TensorSpec] = field(default_factory=list)  # user-given (shape and dtype may be partial)
    output_names: list[str] | None = None
    arch: str | None = None  # "zoo:NAME" or "package.module:Class"
    arch_args: dict[str, Any] = field(default_factory=dict)  # keyword arguments for the arch's constructor (--arch-args)
    state_dict_key: str | None = None  # the checkpoint entry holding the weights, 'a' or 'a.b' (--state-dict-key)
    trust: bool = False
    opset: int | None = None
    sample_dims: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    given: dict[str, Any] = field(default_factory=dict)  # user-pinned sample inputs (--data, --value): name -> ndarray
    # how many sample sets the reference holds (sample_sets.sample_sets): random ones with the first, and
    # whether the structured ones (zeros, constant, range ends) are added
    sampling: dict[str, Any] = field(default_factory=lambda: {"randoms": 3, "structured": True})
    options: dict[str, Any] = field(default_factory=dict)  # framework-specific (signature, tf inputs, ...)
    # where an exporter may leave the exported weights in files (the IR's `stored`; the caller reads
    # them in with `IRModel.attach_stored` and removes the folder): set by convert, None elsewhere
    weights_dir: Path | None = None
