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
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

from modelport.errors import BadInputError, ModelportError
from modelport.ir import TensorSpec

DATA_HINT = "pin it with --value NAME=V (a scalar broadcast to the input) or --data inputs.npz (arrays keyed by input name)"


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
            lo, hi = spec.value_range or (0, 10)
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
        randomised = [s.name for s in specs if s.name not in (given or {})]
        control = [s.name for s in specs if s.name in randomised and s.dtype not in ("float16", "float32", "float64", "bfloat16")]
        named = control or randomised
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInputError(f"the reference run failed on the sample inputs ({type(e).__name__}: {reason[:300]}); "
                            f"random values went to inputs {named}", path=path,
                            hint=DATA_HINT if named else None) from None
