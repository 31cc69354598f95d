"""One signature per listed size: how a static-shape TFLite converter (litert-torch) keeps a dim
declared as enumerated sizes (`--dim seq=128,256,512`, `modelport.dims`).

litert-torch traces static shapes, and its dynamic shapes fail on common ops (a Linear over a 3-D
input). A dim declared with listed sizes is kept instead as one signature per size in one `.tflite`
file: each signature is its own graph traced at those sizes, the weights shared between them. With
several listed dims every combination gets one (at most MAX_SIGNATURES). The signatures are keyed
by their sizes (`seq_128`, `batch_2_seq_128`); the first is the sample's sizes, the file's main
graph, and is also `serving_default`. LiteRT's callers pick one with
`interpreter.get_signature_runner("seq_256")`; modelport's runner picks the one whose shapes take
the feeds (`runtimes.tflite`). A dim declared as a range cannot be kept so: exit 2 naming it.
"""

from __future__ import annotations

import itertools

import numpy as np

from modelport.emitters.fixed_dims import kept_bounds
from modelport.errors import UnsupportedError
from modelport.ir import IRModel
from modelport.reference.samples import make_inputs

MAX_SIGNATURES = 16


def sized_dims(ir: IRModel, converter: str) -> dict:
    """{dim: DimSpec} of the declared dims with listed sizes; a declared range is exit 2 naming it."""
    declared = kept_bounds(ir)
    ranges = {d: b for d, b in declared.items() if b.kind == "range"}
    if ranges:
        raise UnsupportedError(f"{converter} converts static shapes: it cannot keep "
                               f"{', '.join(f'{d}={b}' for d, b in ranges.items())} dynamic",
                               hint="list the sizes it takes (--dim NAME=16,32,64: one signature per size), fix the dim with "
                                    "--dim NAME=N, or take the onnx route (onnx2tf keeps dynamic dims where the graph allows)")
    return {d: b for d, b in declared.items() if b.kind == "sizes"}


def _sample(ir: IRModel, dim: str) -> int | None:
    for s in ir.inputs:
        for axis, d in enumerate(s.shape):
            if d == dim and s.name in ir.reference.inputs:
                return int(np.shape(ir.reference.inputs[s.name])[axis])
    return None


def signature_sizes(ir: IRModel, listed: dict) -> list[dict[str, int]]:
    """[{dim: size}] one per signature, the sample's sizes first, the others in ascending order;
    [{}] when no dim is listed (one signature). Over MAX_SIGNATURES is exit 2."""
    if not listed:
        return [{}]
    combos = [dict(zip(listed, sizes, strict=True)) for sizes in itertools.product(*(b.sizes for b in listed.values()))]
    if len(combos) > MAX_SIGNATURES:
        raise UnsupportedError(f"the listed sizes of {', '.join(listed)} make {len(combos)} signatures; "
                               f"one .tflite file holds at most {MAX_SIGNATURES}", hint="list fewer sizes")
    sample = {d: _sample(ir, d) for d in listed}
    first = sample if sample in combos else combos[0]
    return [first, *(c for c in combos if c != first)]


def signature_key(at: dict[str, int]) -> str:
    """The key of the signature at `at`'s sizes: `seq_128`, `batch_2_seq_128`."""
    return "_".join(f"{d}_{n}" for d, n in at.items())


def trace_inputs(ir: IRModel, at: dict[str, int]) -> dict[str, np.ndarray]:
    """Sample inputs at `at`'s sizes (each input's value range kept: token ids stay ids)."""

    return make_inputs(ir.inputs, {**ir.sample_dims, **at}, seed=sum(at.values()))


def convert_sizes(litert_torch, ir: IRModel, module, in_specs, reference, sizes: dict[str, int], combos: list[dict], wide: bool):
    """litert-torch's edge model of `module`: one signature per entry of `combos` (see
    `signature_sizes`), or its one static graph at the reference's sizes when nothing is listed."""
    import torch

    def args(feeds):
        return tuple(torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in in_specs)

    if combos == [{}]:
        return litert_torch.convert(module, args(reference.inputs), enable_x64=wide)
    converter = None
    for at in combos:
        sample = args(reference.inputs if at == combos[0] else trace_inputs(ir, {**sizes, **at}))
        converter = (litert_torch.signature(signature_key(at), module, sample) if converter is None
                     else converter.signature(signature_key(at), module, sample))
    return converter.convert(enable_x64=wide)
