"""The sample sets every hop is judged on beyond the first (`samples.make_inputs`).

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
  [0, 1] range) through its preprocessing, where the contract knows an image input's range; an
  input shaped like an image (NCHW/NHWC with 1 or 3 channels) with no range takes 114/255, the
  [0, 1] convention of raw detector exports;
- the sweep, on every float input whose range nobody declared: constant frames at the values
  real inputs take and random data never reach: `grey-raw`, raw 114 on an input shaped like an
  image (exports fed 0..255), and on every such input, each with a full float32 mantissa
  (`sweep_value`): `floor-db` (20·log10 of float32's eps, -138.47: digital silence after a dB
  front end), `floor-log` (its natural log, -15.94: silence after a log-mel or log-power front
  end), `full-mantissa` and `full-mantissa-large` (seeded constants in [10, 100) and
  [100, 1000): raw sensor counts, pixel values, levels);
- `data-3`, …: further samples the user stacked in `--data`.
Structured sets change float and 8-bit inputs only: other integer and bool inputs (token ids,
masks, indices) keep the first set's values, except at `low`/`high` where a `value_range` is
declared, and so do the inputs named in `keep` (what the graph shows is a size, a scale or an
index: `input_roles.py`). A set identical to the first is left out, and so is one the source
itself fails on (named in the provenance's `samples_skipped`).

Why full mantissas (docs/validation.md): a constant frame is where a one-pass variance
E[x²]−E[x]² cancels, and whether it shows depends on the constant's mantissa, not its size: at
-138.4375 or -138.5 (short mantissas) float32 sums and squares of the frame are exact and every
kernel gives the norm's bias; at -138.47 the square rounds, and XNNPACK's program gave NaN,
LiteRT and OpenVINO errors of 1e-2. Each sweep constant has its lowest mantissa bit set, so no
sum or square of it is exact by luck. The magnitudes start at 10: below that a rounded square
stays under a norm's usual eps (1e-5) and the random sets judge the same kernels.

Every precision is judged on every set, the sweep included: half precision
holds these magnitudes, and a dynamic INT8 model quantises each activation at its run-time range.
A model calibrated on the user's data is judged on that data and the structured sets instead
(`optimize/quantize.py`): the calibration says which values are real.

Conditioning: for each structured and sweep set the source also runs with its float inputs moved
one ulp (`nudge`); `Sample.nudged` keeps those outputs. Where they move past a hop's tolerance,
the source's own answer on that set is rounding noise amplified (a GroupNorm over a constant
frame that the network's own sums made slightly uneven), and the set is `ill-conditioned` for
that hop (`validation/compare.py`): it does not fail it, NaN and Inf aside.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

from modelport.errors import one_line
from modelport.ir import Sample, TensorSpec
from modelport.reference.samples import make_inputs, numpy_dtype, output_varies

RANDOM_KINDS = ("random-2", "random-small")
# sets at values a real input takes (kept beside a calibrated model's data), then the sweep of inputs
# whose range nobody declared
STRUCTURED_KINDS = ("zeros", "constant", "low", "high", "grey")
DB_FLOOR = float(np.float32(20 * np.log10(np.finfo(np.float32).eps)))  # -138.47: dB of float32 silence
LOG_FLOOR = float(np.float32(np.log(np.finfo(np.float32).eps)))  # -15.94: log of float32 silence
BANDS = {"full-mantissa": (10.0, 100.0), "full-mantissa-large": (100.0, 1000.0)}  # seeded constants' magnitudes
SWEEP_KINDS = ("grey-raw", "floor-db", "floor-log", *BANDS)
# what a model quantised to int8 is not judged on, by design: 1/100 of the amplitude lies below its
# calibrated resolution; a model calibrated on the user's data is not judged on the sweep either
NOT_FOR_INT8 = ("random-small",)
SMALL = 0.01  # the amplitude of `random-small`
GREY = 114  # the letterbox grey of a [0, 255] image
EIGHT_BIT = (np.uint8, np.int8)
IMAGE_LAYOUTS = ("NCHW", "NHWC", "NCDHW", "NDHWC")


def sweep_value(kind: str, seed: int = 0) -> float:
    """The constant of a sweep set: a floor, or a seeded constant in its band (log-uniform) with
    the lowest mantissa bit set, so that neither its square nor the sum of a frame of it is exact."""
    if kind == "floor-db":
        return DB_FLOOR
    if kind == "floor-log":
        return LOG_FLOOR
    lo, hi = BANDS[kind]
    rng = np.random.default_rng([seed, zlib.crc32(kind.encode())])
    value = np.float32(10 ** rng.uniform(np.log10(lo), np.log10(hi)))
    return float((np.asarray(value).view(np.uint32) | np.uint32(1)).view(np.float32))


def nudge(feeds: dict[str, np.ndarray], fixed=()) -> dict[str, np.ndarray]:
    """`feeds` with every float input not in `fixed` moved one ulp up (to the next value of its dtype)."""
    return {k: np.nextafter(v, np.asarray(np.inf, v.dtype)) if np.issubdtype(v.dtype, np.floating) and k not in fixed else v
            for k, v in feeds.items()}


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


def _structured(spec: TensorSpec, kind: str, first: np.ndarray, seed: int = 0) -> np.ndarray | None:
    """The input's values in a structured set, or None where the set keeps the first set's."""
    dtype = numpy_dtype(spec)
    shape = first.shape
    if np.issubdtype(dtype, np.floating):
        rng = _float_range(spec)
        if kind == "zeros":
            return np.zeros(shape, dtype)
        if kind == "constant":
            return np.full(shape, 1.0 if rng is None else (rng[0] + rng[1]) / 2, dtype)
        if kind == "grey-raw":
            return np.full(shape, GREY, dtype) if rng is None and _image_like(spec, shape) else None
        if kind in SWEEP_KINDS:  # a declared range says which values are real: nothing to sweep
            return None if rng is not None else np.full(shape, sweep_value(kind, seed), dtype)
        if kind == "grey":
            return _grey(spec, rng, shape, dtype)
        if rng is None:
            return None
        if spec.preprocess and not spec.value_range:
            raw = _raw_range(spec.preprocess)[0 if kind == "low" else 1]
            return _preprocessed(spec, raw, shape).astype(dtype)
        return np.full(shape, rng[0] if kind == "low" else rng[1], dtype)
    if dtype in EIGHT_BIT and not spec.value_range and kind not in SWEEP_KINDS:  # an 8-bit image's raw grey is its `grey`
        info = np.iinfo(dtype)
        if kind == "grey":  # raw 114 of an 8-bit image (int8 data: offset by -128)
            return np.full(shape, GREY + int(info.min), dtype) if spec.layout in IMAGE_LAYOUTS else None
        value = {"zeros": 0, "constant": (int(info.min) + int(info.max) + 1) // 2, "low": info.min, "high": info.max}[kind]
        return np.full(shape, value, dtype)
    if np.issubdtype(dtype, np.integer) and spec.value_range and kind in ("low", "high"):
        lo, hi = int(spec.value_range[0]), int(spec.value_range[1])
        return np.full(shape, lo if kind == "low" else max(lo, hi - 1), dtype)
    return None


def _image_like(spec: TensorSpec, shape: tuple[int, ...]) -> bool:
    """A 4-D input with 1 or 3 channels where its layout (declared, or NCHW/NHWC by the shape) puts them."""
    if len(shape) != 4:
        return False
    if spec.layout in ("NCHW", "NHWC"):
        return shape[1 if spec.layout == "NCHW" else 3] in (1, 3)
    return spec.layout is None and (shape[1] in (1, 3) or shape[3] in (1, 3))


def _grey(spec: TensorSpec, rng: tuple[float, float] | None, shape, dtype) -> np.ndarray | None:
    """The letterbox grey of an image input as the model sees it (None: not an image). With no
    declared range, an input shaped like an image takes 114/255: the [0, 1] frames of raw exports."""
    if rng is None:
        return np.full(shape, GREY / 255, dtype) if _image_like(spec, shape) else None
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
                value = None if spec.name in pinned or spec.name in keep else _structured(spec, kind, first[spec.name], seed)
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
    out because the source failed on them): `run` is the source framework's own run. A structured
    or sweep set also keeps the source's outputs one ulp away (`Sample.nudged`, the conditioning
    measure; None where nothing moves or that run failed)."""

    varies: dict[str, bool | None] = dict.fromkeys(first_outputs)
    extra, skipped = [], []
    fixed = {s.name for s in specs if s.name in (given or {}) or s.name in keep}
    for kind, feeds in sample_sets(specs, first, dims, seed=seed, given=given, path=path, randoms=randoms,
                                   structured=structured, keep=keep):
        try:
            outputs = {k: np.asarray(v) for k, v in run(feeds).items()}
        except Exception as e:  # the source's own failure on a set: that set proves nothing either way
            skipped.append(f"{kind}: {one_line(e, 200, typed=True)}")
            continue
        if kind == "random-2":
            varies = {name: output_varies(value, outputs.get(name)) for name, value in first_outputs.items()}
        extra.append(Sample(kind, feeds, outputs, _nudged(run, feeds, fixed) if kind in STRUCTURED_KINDS + SWEEP_KINDS else None))
    return varies, extra, skipped


def _nudged(run, feeds: dict[str, np.ndarray], fixed) -> dict[str, np.ndarray] | None:
    moved = nudge(feeds, fixed)
    if all(moved[k] is feeds[k] for k in feeds):
        return None
    try:
        return {k: np.asarray(v) for k, v in run(moved).items()}
    except Exception:  # the measure is missing, not the set: it is judged as well-conditioned
        return None


