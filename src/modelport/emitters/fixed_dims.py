"""Dynamic dims fixed for converters that write static shapes (litert-torch), or that keep only the
dims declared with bounds dynamic (ExecuTorch, Core ML: `--dim batch=1..8`, `modelport.dims`).

`fixed_sizes(ir, keep)` chooses the size each dynamic input dim not in `keep` is fixed at;
`reference_at(ir, module, sizes, converter)` is the reference at those sizes, what the artifact is
validated on; `kept_bounds(ir)` the declared bounds an input dim has; `dims_entry` what an
artifact's report entry says of every symbolic input dim (kept with its bounds, or fixed).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from modelport.dims import input_dims
from modelport.errors import UnsupportedError, one_line
from modelport.ir import IRModel, Reference
from modelport.reference.sample_sets import nudge
from modelport.runtimes.torch import TorchRunner


def kept_bounds(ir: IRModel) -> dict:
    """{dim: dims.DimSpec} of the declared ranges and lists (`IRModel.dim_bounds`) an input has."""
    symbolic = {d for s in ir.inputs for d in s.shape if isinstance(d, str)}
    return {d: b for d, b in ir.dim_bounds.items() if d in symbolic}


def dims_entry(ir: IRModel, sizes: dict[str, int], kept: dict) -> dict:
    """An artifact's `dims`: per input, each symbolic dim kept with its bounds or fixed at its size."""

    return input_dims(ir.inputs, kept, sizes)


def _identifier(name: str) -> str:
    text = re.sub(r"\W", "_", name)
    return text if text and not text[0].isdigit() else f"d_{text}"


def export_dynamic_shapes(ir: IRModel, kept: dict, module=None):
    """`torch.export`'s `dynamic_shapes` for `module` taking the inputs positionally (as one
    `*args` where its forward says so): the dims kept with their bounds (one `Dim` per dim name,
    shared by every input that has it; a list of sizes as its smallest to its largest), or None
    when none is kept."""
    if not kept:
        return None
    import torch

    made = {d: torch.export.Dim(_identifier(d), min=b.low, max=b.high) for d, b in kept.items()}
    shapes = tuple({axis: made[d] for axis, d in enumerate(s.shape) if isinstance(d, str) and d in made} or None
                   for s in ir.inputs)
    return (shapes,) if module is not None and _varargs(module) else shapes


def _varargs(module) -> bool:
    """Whether `module`'s forward takes its inputs as one `*args`."""
    import inspect

    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError, AttributeError):
        return False
    return len(params) == 1 and params[0].kind is inspect.Parameter.VAR_POSITIONAL


def fixed_sizes(ir: IRModel, keep=()) -> dict[str, int]:
    """{dynamic dim: the size the file fixes it at}, for every dynamic dim of the inputs but those
    in `keep` (the dims a target keeps dynamic within their declared bounds).

    Declared sizes win: the IR's sample dims (`--dim`, a zoo entry, a `.pt2`'s range) and the
    dims of inputs the user gave data for. Otherwise a batch is 1 (the sample's 2 would leave a
    file that answers a one-sample call with two rows) and any other dim keeps its sample size,
    which the source is known to run at."""
    given = getattr(ir.source.spec, "given", None) if ir.source else None
    declared = dict(ir.sample_dims)
    for s in ir.inputs:
        if given and s.name in given and np.ndim(given[s.name]) > 0:
            shape = ir.reference.inputs[s.name].shape
            declared.update({d: int(n) for d, n in zip(s.shape, shape, strict=True) if isinstance(d, str)})
    batches = {s.shape[0] for s in ir.inputs if s.shape and isinstance(s.shape[0], str)}
    sizes: dict[str, int] = {}
    for s in ir.inputs:
        sample = ir.reference.inputs[s.name].shape
        for axis, d in enumerate(s.shape):
            if isinstance(d, str) and d not in sizes and d not in keep:
                sizes[d] = int(declared[d]) if d in declared else 1 if d in batches else int(sample[axis])
    return sizes


def cut(ir: IRModel, inputs: dict[str, np.ndarray], sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """`inputs` cut to `sizes` along their dynamic dims (a fixed size is never above the sample's; a
    dim not in `sizes` keeps its size)."""
    return {s.name: np.ascontiguousarray(inputs[s.name][tuple(slice(0, sizes[d]) if isinstance(d, str) and d in sizes
                                                              else slice(None)
                                                              for d in s.shape)]) for s in ir.inputs}


def reference_at(ir: IRModel, module, sizes: dict[str, int], converter: str, run_source=None) -> Reference:
    """The reference at `sizes`: the IR's own when its inputs have those sizes, else its inputs cut
    to them and the source run on the cut inputs: the source `module`, or `run_source(feeds) -> outputs`
    when given (the IR's ONNX in ONNX Runtime, for a module generated from it)."""

    ref = ir.reference
    source = run_source or TorchRunner(module, input_names=[s.name for s in ir.inputs], output_names=[s.name for s in ir.outputs],
                                       inputs=ir.inputs).run

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return {k: np.asarray(v) for k, v in source(feeds).items()}
        except Exception as e:
            shapes = {n: list(a.shape) for n, a in feeds.items()}
            raise UnsupportedError(f"{converter} fixes the dynamic dims at {sizes}, and the source does not run on inputs {shapes}: "
                                   f"{one_line(e, 200, typed=True)}",
                                   hint="declare the sizes the file should take with --dim NAME=N") from None

    feeds = cut(ir, ref.inputs, sizes)
    if all(feeds[n].shape == ref.inputs[n].shape for n in feeds):
        return ref
    extra = []
    for x in ref.extra:  # a set's conditioning is measured again at the cut size: one ulp away from its cut inputs
        cut_in = cut(ir, x.inputs, sizes)
        extra.append(replace(x, inputs=cut_in, outputs=run(cut_in), nudged=run(nudge(cut_in)) if x.nudged else None))
    return Reference(feeds, run(feeds), ref.producer, extra=extra, first_kind=ref.first_kind)
