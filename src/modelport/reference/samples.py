"""Deterministic sample inputs from TensorSpecs: the same specs and seed give the same arrays.

`reference_varies` runs the source a second time, on a second sample set derived from the same
seed, and says per output whether the output changed: a reference that ignores its input (a
degenerate random-init network, an output that is all NaN/Inf) makes every parity check pass
while proving nothing about the conversion.

Inputs the user pins (`--data inputs.npz`, `--value NAME=V`) arrive as `given`: a named array of
rank 0 is a value broadcast to the input's shape and dtype; an array of the input's rank is used as
given (its leading axis the batch), checked against the input's fixed dims and dtype, and a symbolic
dim it fixes takes that size for the random inputs too; an array of one rank more is a stack of
samples: the reference set takes the first, the second set the second (when there is one). Both sample sets keep the given arrays, so a
pinned control input (a sample rate, a mode flag) never makes a run fail or look input-blind.

The sample sets beyond the first, every hop is judged on them too, are `sample_sets.py`'s.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from modelport.errors import BadInputError, ModelportError, one_line
from modelport.ir import TensorSpec
from modelport.run.file_checks import check_model_file

DATA_HINT = "pin it with --value NAME=V (a scalar broadcast to the input) or --data inputs.npz (arrays keyed by input name)"
COMMON_SIZES = (32, 64, 224, 640)  # sizes networks with strided paths accept (multiples of 32; 224, 640: common image sizes)
DEFAULT_SIZE = 2  # a symbolic dim's sample size unless sized (TensorSpec.concrete_shape's default)
MAX_RETRY_ELEMENTS = 1 << 26  # a retry's inputs stay under this many elements in all (256 MiB of float32)


# An integer input named like an attention mask with no declared range is sampled as ones (no
# padding): random values 0..9 mask whole rows, where frameworks legitimately disagree on outputs
# nobody reads. `--data`/`--value` or a value range sample padding on purpose.
MASK = "attention_mask"


def load_data(path) -> dict[str, np.ndarray]:
    """The named arrays of an .npz (`--data`), loaded without pickle."""

    p = check_model_file(path, kind="input data file")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except (ValueError, OSError) as e:
        raise BadInputError(f"cannot read input data (an .npz keyed by input name): {one_line(e)}", path=p) from None


def parse_values(values: list[str]) -> dict[str, np.ndarray]:
    """`--value NAME=V`: a number (or true/false) as a rank-0 array, cast to the input's dtype later."""
    out = {}
    for text in values:
        name, _, value = text.partition("=")
        try:
            number = {"true": 1, "false": 0}.get(value.strip().lower())
            number = number if number is not None else (int(value) if value.strip().lstrip("+-").isdigit() else float(value))
        except ValueError:
            number = None
        if not name or number is None:
            raise BadInputError(f"bad --value '{text}': expected NAME=NUMBER, e.g. sr=16000")
        out[name] = np.asarray(number)
    return out


def check_given(specs: list[TensorSpec], given: dict[str, np.ndarray] | None, path=None) -> None:
    """Every name in `given` must be one of the model's inputs (exit 2 listing them)."""
    unknown = sorted(set(given or {}) - {s.name for s in specs})
    if unknown:
        raise BadInputError(f"--data/--value name {unknown} which the model does not take; its inputs are "
                            f"{[s.name for s in specs]}", path=path)


def numpy_dtype(spec: TensorSpec) -> np.dtype:
    """The array dtype of an input's sample data (numpy has no bfloat16: float32 stands in)."""
    return np.dtype(spec.dtype if spec.dtype != "bfloat16" else "float32")


def _sample(spec: TensorSpec, value: np.ndarray, variant: int) -> np.ndarray:
    """`value`, or one sample of it when it stacks samples on an extra leading axis."""
    if value.ndim == len(spec.shape) + 1 and len(value):
        return value[min(variant, len(value) - 1)]
    return value


def _pinned(spec: TensorSpec, value: np.ndarray, dims: dict[str, int], path) -> np.ndarray:
    dtype = numpy_dtype(spec)
    if value.ndim == 0:
        return np.broadcast_to(value.astype(dtype), spec.concrete_shape(dims)).copy()
    if value.dtype != dtype:
        raise BadInputError(f"input data for '{spec.name}' is {value.dtype}; the model takes {dtype}", path=path)
    if len(spec.shape) != value.ndim or any(isinstance(d, int) and d != v for d, v in zip(spec.shape, value.shape, strict=True)):
        raise BadInputError(f"input data for '{spec.name}' has shape {list(value.shape)}; the model takes "
                            f"{[d if d is not None else '?' for d in spec.shape]}", path=path)
    return value


def bind_dims(specs: list[TensorSpec], given: dict[str, np.ndarray] | None, dims: dict[str, int] | None) -> dict[str, int]:
    """`dims` with every symbolic dim that a given array (rank > 0) fixes set to its size there."""
    out = dict(dims or {})
    for spec in specs:
        value = (given or {}).get(spec.name)
        if value is not None and value.ndim == len(spec.shape):
            out.update({d: int(v) for d, v in zip(spec.shape, value.shape, strict=True) if isinstance(d, str)})
    return out


def make_inputs(specs: list[TensorSpec], dims: dict[str, int] | None = None, *, seed: int = 0,
                variant: int = 0, given: dict[str, np.ndarray] | None = None, path=None) -> dict[str, np.ndarray]:
    """`variant` 0 is the reference sample set; another variant is a distinct set from the same seed.
    `given` (the user's `--data`/`--value` arrays) replaces the random values of the inputs it names."""
    check_given(specs, given, path)
    given = {s.name: _sample(s, np.asarray(given[s.name]), variant) for s in specs if given and s.name in given}
    dims = bind_dims(specs, given, dims)
    feeds = {}
    for spec in specs:
        if given and spec.name in given:
            feeds[spec.name] = _pinned(spec, np.asarray(given[spec.name]), dims, path)
            continue
        rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode()), *([variant] if variant else [])])
        shape = spec.concrete_shape(dims)
        dtype = numpy_dtype(spec)
        if dtype == np.bool_:
            arr = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            lo, hi = spec.value_range or ((1, 2) if MASK in spec.name.lower() else (0, 10))
            arr = rng.integers(int(lo), int(hi), size=shape).astype(dtype)
        else:
            if spec.value_range:
                lo, hi = spec.value_range
                arr = rng.uniform(lo, hi, size=shape)
            else:
                arr = rng.standard_normal(size=shape)
            arr = arr.astype(dtype)
        feeds[spec.name] = arr
    return feeds


def output_varies(first, second) -> bool | None:
    """False when a float output is all NaN/Inf or identical on two sample sets; None when a
    discrete (integer/bool) output agrees, which is common for a working model (an argmax)."""
    a = np.asarray(first)
    if second is None:
        return None
    b = np.asarray(second)
    floating = np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating)
    if a.size == 0:
        return True
    if floating and not np.isfinite(a).any():
        return False
    if a.shape != b.shape:
        return True
    if np.array_equal(a, b, equal_nan=floating):
        return False if floating else None
    return True


def reference_varies(run: Callable[[dict[str, np.ndarray]], dict], specs: list[TensorSpec], first: dict,
                     dims: dict[str, int] | None = None, *, seed: int = 0,
                     given: dict[str, np.ndarray] | None = None) -> dict[str, bool | None]:
    """Per output of `first` (the outputs on the reference samples): does it change when `run`
    gets the second sample set (the user's given inputs kept)? A second run that fails, or inputs
    that the user pinned every one of (no second distinct set exists), leave every output undecided (None)."""
    stacked = any(np.ndim(given[s.name]) == len(s.shape) + 1 and len(given[s.name]) > 1 for s in specs if given and s.name in given)
    if all(given and s.name in given for s in specs) and not stacked:
        return dict.fromkeys(first)
    second_feeds = make_inputs(specs, dims, seed=seed, variant=1, given=given)
    try:
        second = run(second_feeds)
    except Exception:
        return dict.fromkeys(first)
    return {name: output_varies(value, second.get(name)) for name, value in first.items()}


def run_reference(run: Callable[[dict[str, np.ndarray]], dict], feeds: dict[str, np.ndarray], specs: list[TensorSpec],
                  given: dict[str, np.ndarray] | None = None, path=None):
    """`run(feeds)`, the source framework's reference run. A failure there is the sample data's
    fault as far as the user can act on it (a control input fed a random value: a sample rate an
    `If` tests, an index out of range), so it is exit 2 naming the inputs that got random values,
    integer and bool ones first, with the flags that pin them."""
    try:
        return run(feeds)
    except ModelportError:
        raise
    except Exception as e:
        raise reference_failure(e, specs, given, path) from None


_ORT_FAILURE = re.compile(r"while running (\w+) node\..*?Status Message: (?:\S+\.\w+:\d+ \w+ )?(.*)")


def _reason(e: BaseException) -> str:
    """The error in one line (errors.one_line); onnxruntime's `[ONNXRuntimeError] : 1 : FAIL : Non-zero status code
    returned while running Concat node. Name:'' Status Message: concatbase.h:135 Prepare… X` as `Concat: X`."""
    m = _ORT_FAILURE.search(str(e))  # `.` stops at a newline: the match lies within one line
    return one_line(f"{m.group(1)}: {m.group(2)}", 300) if m else one_line(e, 300, typed=True)


def reference_failure(e: Exception, specs: list[TensorSpec], given: dict[str, np.ndarray] | None, path) -> BadInputError:
    """The exit-2 error of a failed reference run (see run_reference)."""
    randomised = [s.name for s in specs if s.name not in (given or {})]
    control = [s.name for s in specs if s.name in randomised and s.dtype not in ("float16", "float32", "float64", "bfloat16")]
    named = control or randomised
    return BadInputError(f"the reference run failed on the sample inputs ({_reason(e)}); "
                         f"random values went to inputs {named}", path=path, hint=DATA_HINT if named else None)


@dataclass
class SampledReference:
    """The reference run's inputs and outputs, and the dims it ran at (`dims`: the sample dims
    given, plus any size a retry chose); `note` says what a retry changed (None: nothing)."""

    feeds: dict[str, np.ndarray]
    outputs: dict
    dims: dict[str, int]
    note: str | None = None
    tried: list[dict[str, int]] = field(default_factory=list)


def free_dims(specs: list[TensorSpec], dims: dict[str, int] | None, given: dict[str, np.ndarray] | None) -> list[str]:
    """The symbolic dims no one sized (not in `dims`, not fixed by a given array), past the batch:
    a dim at axis 0 of a rank >= 2 input stays at its default."""
    bound = bind_dims(specs, given, dims)
    batch = {s.shape[0] for s in specs if len(s.shape) >= 2 and isinstance(s.shape[0], str)}
    found: list[str] = []
    for spec in specs:
        for d in spec.shape:
            if isinstance(d, str) and d not in bound and d not in batch and d not in found:
                found.append(d)
    return found


def _sizes(dims: dict[str, int], names: list[str]) -> str:
    return ", ".join(f"{n}={dims[n]}" for n in names)


def _fits_memory(specs: list[TensorSpec], dims: dict[str, int]) -> bool:
    return sum(int(np.prod(s.concrete_shape(dims), dtype=np.int64)) for s in specs) <= MAX_RETRY_ELEMENTS


def sample_reference(run: Callable[[dict[str, np.ndarray]], dict], specs: list[TensorSpec], dims: dict[str, int] | None = None,
                     *, seed: int = 0, given: dict[str, np.ndarray] | None = None, path=None,
                     hints: dict[str, int] | None = None, hints_from: str = "the model's metadata") -> SampledReference:
    """The reference run on deterministic samples (`make_inputs` + `run_reference`). When it fails
    and the model has symbolic dims no one sized, those dims are retried at the sizes `hints` give
    (read from the model, e.g. ultralytics' `imgsz`), then at each of COMMON_SIZES: a detector whose
    strided and upsampled paths are concatenated runs only at multiples of 32, never at the
    default 2. A retry that runs is kept and said (`note`); when none does, the exit-2 message
    names every such dim with the size sampled and the `--dim` flag that sets it."""
    dims = dict(dims or {})
    feeds = make_inputs(specs, dims, seed=seed, given=given, path=path)
    free = free_dims(specs, dims, given)
    if not free:
        return SampledReference(feeds, run_reference(run, feeds, specs, given, path), dims)
    try:
        return SampledReference(feeds, run(feeds), dims)
    except ModelportError:
        raise
    except Exception as e:
        first = e
    sampled = {n: DEFAULT_SIZE for n in free}
    hinted = {n: int(v) for n, v in (hints or {}).items() if n in free and int(v) > 0}
    tries = ([(hinted, hints_from)] if hinted else []) + [(dict.fromkeys(free, size), "a common size") for size in COMMON_SIZES]
    tried: list[dict[str, int]] = []
    for sizes, source in tries:
        attempt = {**dims, **sizes}
        if attempt in tried or not _fits_memory(specs, attempt):
            continue
        tried.append(attempt)
        feeds = make_inputs(specs, attempt, seed=seed, given=given, path=path)
        try:
            outputs = run(feeds)
        except Exception:
            continue
        note = (f"the reference run failed with symbolic dims at the default sample size ({_sizes(sampled, free)}): "
                f"{_reason(first)}; it ran with {_sizes(attempt, free)} ({source}), the sizes every check of "
                f"this run uses (--dim NAME=N sets them)")
        return SampledReference(feeds, outputs, attempt, note, tried)
    also = ", ".join(_compact(a, free) for a in tried)
    example = " ".join(f"--dim {n}={hinted.get(n, 640)}" for n in free)
    control = [s.name for s in specs if s.name not in (given or {}) and s.dtype not in ("float16", "float32", "float64", "bfloat16")]
    pin = f"; random values went to inputs {control} ({DATA_HINT})" if control else ""
    raise BadInputError(f"the reference run failed on the sample inputs ({_reason(first)}) with symbolic dims "
                        f"sampled at {_sizes(sampled, free)}" + (f" (also tried {also})" if also else "")
                        + f": set sizes the model takes with --dim, e.g. {example}{pin}", path=path) from None


def _compact(dims: dict[str, int], names: list[str]) -> str:
    """'640' when every dim of `names` has that size, else '(64, 96)'."""
    sizes = [dims[n] for n in names]
    return str(sizes[0]) if len(set(sizes)) == 1 else f"({', '.join(map(str, sizes))})"
