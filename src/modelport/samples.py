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

Every hop is judged on more than the first set (`sample_sets`, `reference_samples`): the
source's outputs are also computed on
- `random-2`: the second seed (the set `reference_varies` runs);
- `random-small`: a third seed at 1/100 of the amplitude (a quiet signal, a dark image), or
  `random-3` where no input is a float;
- `zeros`: every float input all zeros (digital silence, a black tensor);
- `constant`: every float input one value (1.0, or the middle of its range);
- `low` / `high`: the ends of the input's range, where the contract knows it: its `value_range`,
  the raw pixel range [0, 255] (or [0, 1]) through its preprocessing (`--mean/--std/--scale`),
  or the whole range of an 8-bit integer input;
- `grey`: an image's letterbox grey, raw 114 of [0, 255] (ultralytics' padding; 114/255 of a
  [0, 1] range) through its preprocessing, where the contract knows an image input's range;
- `large`, `large-negative`: every float input whose range nobody declared at +/-LARGE (138.4):
  a magnitude real inputs take and random data never reach (digital silence is -138.47 dB after
  a log-power front end: 20·log10 of float32's eps; raw 8-bit pixels, raw sensor values);
- `data-3`, …: further samples the user stacked in `--data`.
Structured sets change float and 8-bit inputs only: other integer and bool inputs (token ids,
masks, indices) keep the first set's values, except at `low`/`high` where a `value_range` is
declared, and so do the inputs named in `keep` (what the graph shows is a size, a scale or an
index: `input_roles.py`). A set identical to the first is left out, and so is one the source
itself fails on (named in the provenance's `samples_skipped`).

Why LARGE is 2215/16 = 138.4375, in two sets (docs/validation.md): a constant frame at a large
mean is where a one-pass variance E[x²]−E[x]² cancels and half precision or an approximation runs
out. The silence floor with a 12-bit mantissa: float32 sums of up to 7,574 copies are exact (correct
implementations agree exactly on a constant frame's mean), its square's sums round (a one-pass
variance shows); float16 holds it and its square. Both signs, as ReLU, log and sqrt differ. The
sweep judges fp32 models only (`for_precision`).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from modelport.errors import BadInputError, ModelportError
from modelport.ir import TensorSpec

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
    from modelport.file_checks import check_model_file

    p = check_model_file(path, kind="input data file")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except (ValueError, OSError) as e:
        raise BadInputError(f"cannot read input data (an .npz keyed by input name): {str(e).splitlines()[0]}", path=p) from None


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


def _numpy_dtype(spec: TensorSpec) -> np.dtype:
    """The array dtype of an input's sample data (numpy has no bfloat16: float32 stands in)."""
    return np.dtype(spec.dtype if spec.dtype != "bfloat16" else "float32")


def _sample(spec: TensorSpec, value: np.ndarray, variant: int) -> np.ndarray:
    """`value`, or one sample of it when it stacks samples on an extra leading axis."""
    if value.ndim == len(spec.shape) + 1 and len(value):
        return value[min(variant, len(value) - 1)]
    return value


def _pinned(spec: TensorSpec, value: np.ndarray, dims: dict[str, int], path) -> np.ndarray:
    dtype = _numpy_dtype(spec)
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
        dtype = _numpy_dtype(spec)
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


RANDOM_KINDS = ("random-2", "random-small")
# sets at values a real input takes (kept beside a calibrated model's data), then the sweep of inputs
# whose range nobody declared
STRUCTURED_KINDS = ("zeros", "constant", "low", "high", "grey")
SWEEP_KINDS = ("large", "large-negative")
# what a model quantised to int8 is not judged on, by design: 1/100 of the amplitude lies below its
# calibrated resolution, the sweep beyond its calibrated range (`for_precision`)
NOT_FOR_INT8 = ("random-small", *SWEEP_KINDS)
SMALL = 0.01  # the amplitude of `random-small`
LARGE = 2215 / 16  # the magnitude of `large`: 138.4375 (module docstring: exact sums, a rounding square)
GREY = 114  # the letterbox grey of a [0, 255] image
EIGHT_BIT = (np.uint8, np.int8)
IMAGE_LAYOUTS = ("NCHW", "NHWC", "NCDHW", "NDHWC")


def for_precision(reference, precision: str | None):
    """`reference` as a model computing at `precision` is judged on it: an fp32 model on every set;
    one at a lower precision (fp16, bf16, int8, …) less the sweep: half precision and a calibrated
    range are built for a range, and the sweep is a guess where nobody declared one (a declared
    range's values, `low`/`high`/`grey`, judge every precision)."""
    if reference is None or (precision or "fp32") == "fp32":
        return reference
    return reference.without(*SWEEP_KINDS)


def _raw_range(pre) -> tuple[float, float]:
    """The raw data range a preprocessing implies: [0, 255] for pixels scaled or centred in 0..255
    units, [0, 1] for data already in unit range."""
    big = pre.scale is not None or any(abs(m) > 1.5 for m in (pre.mean or []))
    return 0.0, 255.0 if big else 1.0


def _preprocessed(spec: TensorSpec, raw: float, shape: tuple[int, ...]) -> np.ndarray:
    """`raw` (one value of the raw data) as the model sees it: (raw * scale - mean) / std per channel."""
    pre = spec.preprocess
    x = raw * (pre.scale if pre.scale is not None else 1.0)
    mean = np.asarray(pre.mean if pre.mean else [0.0], dtype=np.float64)
    std = np.asarray(pre.std if pre.std else [1.0], dtype=np.float64)
    values = (x - mean) / std
    channels = max(len(mean), len(std))
    axis = {"NCHW": 1, "NCW": 1, "NCDHW": 1, "NHWC": -1, "NWC": -1, "NDHWC": -1}.get(spec.layout or "")
    if channels == 1 or axis is None or not shape or shape[axis] != channels:
        return np.full(shape, float(values.mean()))
    view = [1] * len(shape)
    view[axis] = channels
    return np.broadcast_to(np.broadcast_to(values, (channels,)).reshape(view), shape)


def _float_range(spec: TensorSpec) -> tuple[float, float] | None:
    if spec.value_range:
        return float(spec.value_range[0]), float(spec.value_range[1])
    if spec.preprocess and not spec.preprocess.is_empty() and (spec.preprocess.mean or spec.preprocess.std or spec.preprocess.scale):
        pre = spec.preprocess
        raw = np.asarray(_raw_range(pre)) * (pre.scale if pre.scale is not None else 1.0)
        ends = (raw[:, None] - np.asarray(pre.mean or [0.0])) / np.asarray(pre.std or [1.0])
        return float(ends.min()), float(ends.max())
    return None


def _structured(spec: TensorSpec, kind: str, first: np.ndarray) -> np.ndarray | None:
    """The input's values in a structured set, or None where the set keeps the first set's."""
    dtype = _numpy_dtype(spec)
    shape = first.shape
    if np.issubdtype(dtype, np.floating):
        rng = _float_range(spec)
        if kind == "zeros":
            return np.zeros(shape, dtype)
        if kind == "constant":
            return np.full(shape, 1.0 if rng is None else (rng[0] + rng[1]) / 2, dtype)
        if kind in SWEEP_KINDS:  # a declared range says which values are real: nothing to sweep
            return None if rng is not None else np.full(shape, LARGE if kind == "large" else -LARGE, dtype)
        if rng is None:
            return None
        if kind == "grey":
            return _grey(spec, rng, shape, dtype)
        if spec.preprocess and not spec.value_range:
            raw = _raw_range(spec.preprocess)[0 if kind == "low" else 1]
            return _preprocessed(spec, raw, shape).astype(dtype)
        return np.full(shape, rng[0] if kind == "low" else rng[1], dtype)
    if dtype in EIGHT_BIT and not spec.value_range and kind not in SWEEP_KINDS:
        info = np.iinfo(dtype)
        if kind == "grey":  # raw 114 of an 8-bit image (int8 data: offset by -128)
            return np.full(shape, GREY + int(info.min), dtype) if spec.layout in IMAGE_LAYOUTS else None
        value = {"zeros": 0, "constant": (int(info.min) + int(info.max) + 1) // 2, "low": info.min, "high": info.max}[kind]
        return np.full(shape, value, dtype)
    if np.issubdtype(dtype, np.integer) and spec.value_range and kind in ("low", "high"):
        lo, hi = int(spec.value_range[0]), int(spec.value_range[1])
        return np.full(shape, lo if kind == "low" else max(lo, hi - 1), dtype)
    return None


def _grey(spec: TensorSpec, rng: tuple[float, float], shape, dtype) -> np.ndarray | None:
    """The letterbox grey of an image input as the model sees it (None: not an image)."""
    if spec.preprocess and not spec.value_range:
        raw = GREY * _raw_range(spec.preprocess)[1] / 255
        return _preprocessed(spec, raw, shape).astype(dtype)
    if spec.layout not in IMAGE_LAYOUTS:
        return None
    return np.full(shape, rng[0] + (rng[1] - rng[0]) * GREY / 255, dtype)


def sample_sets(specs: list[TensorSpec], first: dict[str, np.ndarray], dims: dict[str, int] | None = None, *,
                seed: int = 0, given: dict[str, np.ndarray] | None = None, path=None, randoms: int = 3,
                structured: bool = True, keep=()) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The sample sets beyond the first (`first`, the reference's inputs), as (kind, feeds): see
    the module docstring. `randoms` counts the random sets with the first; the user's pinned
    inputs, and those named in `keep` (sizes, scales, indices), keep their values in every
    structured set."""
    given = given or {}
    pinned = {s.name for s in specs if s.name in given}
    stacked = max((len(given[s.name]) for s in specs if s.name in given
                   and np.ndim(given[s.name]) == len(s.shape) + 1), default=0)
    out: list[tuple[str, dict]] = []
    if randoms >= 2 and (len(pinned) < len(specs) or stacked > 1):
        out.append(("random-2", make_inputs(specs, dims, seed=seed, variant=1, given=given, path=path)))
    if randoms >= 3 and len(pinned) < len(specs):
        feeds = make_inputs(specs, dims, seed=seed, variant=2, given=given, path=path)
        scaled = False
        for spec in specs:
            if spec.name in pinned or not np.issubdtype(feeds[spec.name].dtype, np.floating):
                continue
            rng = _float_range(spec)
            x = feeds[spec.name].astype(np.float64)
            feeds[spec.name] = (rng[0] + (x - rng[0]) * SMALL if rng else x * SMALL).astype(feeds[spec.name].dtype)
            scaled = True
        out.append(("random-small" if scaled else "random-3", feeds))  # a third seed where nothing scales
    for extra in range(3, randoms):
        if len(pinned) < len(specs):
            out.append((f"random-{extra + 1}", make_inputs(specs, dims, seed=seed, variant=extra, given=given, path=path)))
    for k in range(2, stacked):
        out.append((f"data-{k + 1}", make_inputs(specs, dims, seed=seed, variant=k, given=given, path=path)))
    if structured:
        for kind in STRUCTURED_KINDS + SWEEP_KINDS:
            feeds, changed = {}, False
            for spec in specs:
                value = None if spec.name in pinned or spec.name in keep else _structured(spec, kind, first[spec.name])
                changed |= value is not None and not np.array_equal(value, first[spec.name])
                feeds[spec.name] = first[spec.name] if value is None else value
            if changed:
                out.append((kind, feeds))
    return out


def reference_samples(run: Callable[[dict[str, np.ndarray]], dict], specs: list[TensorSpec], first: dict,
                      first_outputs: dict, dims: dict[str, int] | None = None, *, seed: int = 0,
                      given: dict[str, np.ndarray] | None = None, path=None, randoms: int = 3,
                      structured: bool = True, keep=()) -> tuple[dict[str, bool | None], list, list[str]]:
    """(reference_varies, the extra sample sets with the source's outputs on them, the kinds left
    out because the source failed on them): `run` is the source framework's own run."""
    from modelport.ir import Sample

    varies: dict[str, bool | None] = dict.fromkeys(first_outputs)
    extra, skipped = [], []
    for kind, feeds in sample_sets(specs, first, dims, seed=seed, given=given, path=path, randoms=randoms,
                                   structured=structured, keep=keep):
        try:
            outputs = {k: np.asarray(v) for k, v in run(feeds).items()}
        except Exception as e:  # the source's own failure on a set: that set proves nothing either way
            skipped.append(f"{kind}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}")
            continue
        if kind == "random-2":
            varies = {name: output_varies(value, outputs.get(name)) for name, value in first_outputs.items()}
        extra.append(Sample(kind, feeds, outputs))
    return varies, extra, skipped


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


def _first_line(e: BaseException) -> str:
    """The error's first line; onnxruntime's `[ONNXRuntimeError] : 1 : FAIL : Non-zero status code
    returned while running Concat node. Name:'' Status Message: concatbase.h:135 Prepare… X` as `Concat: X`."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    m = _ORT_FAILURE.search(line)
    return f"{m.group(1)}: {m.group(2)}"[:300] if m else f"{type(e).__name__}: {line[:300]}"


def reference_failure(e: Exception, specs: list[TensorSpec], given: dict[str, np.ndarray] | None, path) -> BadInputError:
    """The exit-2 error of a failed reference run (see run_reference)."""
    randomised = [s.name for s in specs if s.name not in (given or {})]
    control = [s.name for s in specs if s.name in randomised and s.dtype not in ("float16", "float32", "float64", "bfloat16")]
    named = control or randomised
    return BadInputError(f"the reference run failed on the sample inputs ({_first_line(e)}); "
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
                f"{_first_line(first)}; it ran with {_sizes(attempt, free)} ({source}), the sizes every check of "
                f"this run uses (--dim NAME=N sets them)")
        return SampledReference(feeds, outputs, attempt, note, tried)
    also = ", ".join(_compact(a, free) for a in tried)
    example = " ".join(f"--dim {n}={hinted.get(n, 640)}" for n in free)
    control = [s.name for s in specs if s.name not in (given or {}) and s.dtype not in ("float16", "float32", "float64", "bfloat16")]
    pin = f"; random values went to inputs {control} ({DATA_HINT})" if control else ""
    raise BadInputError(f"the reference run failed on the sample inputs ({_first_line(first)}) with symbolic dims "
                        f"sampled at {_sizes(sampled, free)}" + (f" (also tried {also})" if also else "")
                        + f": set sizes the model takes with --dim, e.g. {example}{pin}", path=path) from None


def _compact(dims: dict[str, int], names: list[str]) -> str:
    """'640' when every dim of `names` has that size, else '(64, 96)'."""
    sizes = [dims[n] for n in names]
    return str(sizes[0]) if len(set(sizes)) == 1 else f"({', '.join(map(str, sizes))})"
