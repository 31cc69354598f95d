"""Deterministic sample inputs from TensorSpecs: the same specs and seed give the same arrays.

`reference_varies` runs the source a second time, on a second sample set derived from the same
seed, and says per output whether the output changed: a reference that ignores its input (a
degenerate random-init network, an output that is all NaN/Inf) makes every parity check pass
while proving nothing about the conversion.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

from modelport.ir import TensorSpec


def make_inputs(specs: list[TensorSpec], dims: dict[str, int] | None = None, *, seed: int = 0,
                variant: int = 0) -> dict[str, np.ndarray]:
    """`variant` 0 is the reference sample set; another variant is a distinct set from the same seed."""
    feeds = {}
    for spec in specs:
        rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode()), *([variant] if variant else [])])
        shape = spec.concrete_shape(dims)
        dtype = np.dtype(spec.dtype if spec.dtype != "bfloat16" else "float32")
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
                     dims: dict[str, int] | None = None, *, seed: int = 0) -> dict[str, bool | None]:
    """Per output of `first` (the outputs on the reference samples): does it change when `run`
    gets the second sample set? A second run that fails leaves every output undecided (None)."""
    second_feeds = make_inputs(specs, dims, seed=seed, variant=1)
    try:
        second = run(second_feeds)
    except Exception:
        return dict.fromkeys(first)
    return {name: output_varies(value, second.get(name)) for name, value in first.items()}
