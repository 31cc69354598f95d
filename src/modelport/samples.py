"""Deterministic sample inputs from TensorSpecs: the same specs and seed give the same arrays."""

from __future__ import annotations

import zlib

import numpy as np

from modelport.ir import TensorSpec


def make_inputs(specs: list[TensorSpec], dims: dict[str, int] | None = None, *, seed: int = 0) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in specs:
        rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
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
