"""An artifact that keeps declared dims dynamic, run at the sizes they take, not just the sample's.

A dim declared with bounds (`--dim batch=1..8`, `--dim seq=128,256,512`: `modelport.dims`) that an
artifact keeps dynamic is checked at three points: every kept dim at its smallest size, every one at
a size between, every one at its largest (`DimSpec.check_sizes`). The largest is capped by a memory
estimate: the sample run's inputs and outputs scaled by each dim's ratio to its sample size, at most
MEMORY_CAP bytes, halving the dims with the largest ratio first; the report says so when it caps.

At each point the inputs are fresh samples at those sizes (seeded, each input's declared value
range kept; inputs the user pinned keep their values where no kept dim sizes them), the reference
is the IR run in onnxruntime (the IR is proven against the source before any artifact is made),
and the artifact's outputs are judged by the same tolerance as its sample sets. The rows go in the
artifact's report entry (`sizes`); a miss at any point fails the artifact (exit 4) naming the sizes.
"""

from __future__ import annotations

import math

import numpy as np

from modelport.errors import ValidationError
from modelport.reference.samples import make_inputs
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation.compare import compare
from modelport.validation.tolerance import finite_or_none

MEMORY_CAP = 512 << 20  # bytes of inputs and outputs one check run may hold


def kept_dims(artifact, ir) -> dict:
    """The IR's declared bounds (`IRModel.dim_bounds`) that `artifact` keeps dynamic: all but the
    dims its entry says it fixed (`dims`, else `fixed_dims`)."""
    bounds = getattr(ir, "dim_bounds", None) or {}
    if not bounds:
        return {}
    dims = artifact.details.get("dims")
    if dims is not None:
        kept = {d for per in dims.values() for d, form in per.items() if form.get("kind") in ("range", "sizes")}
        return {d: b for d, b in bounds.items() if d in kept}
    fixed = {d for per in (artifact.details.get("fixed_dims") or {}).values() for d in per}
    return {d: b for d, b in bounds.items() if d not in fixed}


def other_layout(artifact, ir) -> list[str]:
    """The tensors the artifact takes or gives in another layout than the contract's (its own
    reference, `Artifact.reference`, has a fixed dim of the contract elsewhere: a channels-last
    TFLite file): the IR's inputs at other sizes are not its inputs."""
    ref = artifact.reference
    if ref is None:
        return []
    moved = []
    for specs, arrays in ((ir.inputs, ref.inputs), (ir.outputs, ref.outputs)):
        for s in specs:
            shape = np.shape(arrays[s.name]) if s.name in arrays else None
            if shape is not None and (len(shape) != len(s.shape)
                                      or any(isinstance(d, int) and d != n for d, n in zip(s.shape, shape, strict=True))):
                moved.append(s.name)
    return moved


def _sample_sizes(ir, kept: dict) -> dict[str, int]:
    """The size each kept dim has in the reference's first sample set."""
    sizes = {}
    for s in ir.inputs:
        for axis, d in enumerate(s.shape):
            if isinstance(d, str) and d in kept and s.name in ir.reference.inputs:
                sizes.setdefault(d, int(np.shape(ir.reference.inputs[s.name])[axis]))
    return sizes


def _bytes(arrays: dict) -> int:
    return sum(np.asarray(a).nbytes for a in arrays.values())


def points(ir, kept: dict, cap: int = MEMORY_CAP) -> tuple[list[dict[str, int]], dict]:
    """([{dim: size}] the checks run at, smallest first; a note of the cap where the memory estimate
    lowered the largest sizes, else {})."""
    sample = _sample_sizes(ir, kept)
    base = _bytes(ir.reference.inputs) + _bytes(ir.reference.outputs)

    def estimate(at: dict[str, int]) -> int:
        return int(base * math.prod(at[d] / max(sample.get(d, 1), 1) for d in at))

    def combos(caps: dict[str, int | None]) -> list[dict[str, int]]:
        ladders = {d: b.check_sizes(caps.get(d)) for d, b in kept.items()}
        return [{d: ladder[min(i, len(ladder) - 1)] for d, ladder in ladders.items()} for i in range(3)]

    largest = combos({})[-1]
    top, note = dict(largest), {}
    while estimate(top) > cap:
        d = max(top, key=lambda k: top[k] / kept[k].low)
        if top[d] <= kept[d].low:
            break
        smaller = [n for n in (kept[d].sizes or ()) if n < top[d]]
        top[d] = smaller[-1] if smaller else max(kept[d].low, top[d] // 2)
    if top != largest:
        note = {"capped_at": dict(top), "largest": largest, "estimate_bytes": estimate(largest), "cap_bytes": cap}
    unique = []
    for c in combos(top):
        if c not in unique:
            unique.append(c)
    return unique, note


def _feeds(ir, at: dict[str, int], seed: int) -> dict[str, np.ndarray]:

    given = getattr(getattr(ir.source, "spec", None), "given", None) or {}
    sized = {s.name for s in ir.inputs if any(isinstance(d, str) and d in at for d in s.shape)}
    pinned = {k: v for k, v in given.items() if k not in sized}
    return make_inputs(ir.inputs, {**ir.sample_dims, **at}, seed=seed, given=pinned or None)


def check_sizes(runner, ir, model, kept: dict, tolerance, hop: str, *, seed: int = 0):
    """(rows for the report, the note of a cap, the ValidationError of the first miss or None):
    `runner` (the artifact's) at each point of `points`, against `model` (the IR's ONNX, or the file
    its weights are parked in) run in onnxruntime."""

    at_points, note = points(ir, kept)
    source = OnnxRuntimeRunner(model)
    feeds = [_feeds(ir, at, seed + 101 + i) for i, at in enumerate(at_points)]
    references = [source.run(f) for f in feeds]
    del source
    actual = runner.run_many(feeds)
    rows, failure = [], None
    for at, ref, got in zip(at_points, references, actual, strict=True):
        label = ", ".join(f"{d}={n}" for d, n in at.items())
        parity = compare(ref, got, tolerance, hop=f"{hop} at {label}")
        worst = min(parity.outputs, key=lambda o: o.cosine) if parity.outputs else None
        rows.append({"dims": at, "ok": parity.ok, "max_abs": finite_or_none(max((o.max_abs for o in parity.outputs), default=None)),
                     "cosine": finite_or_none(worst.cosine) if worst else None})
        if not parity.ok and failure is None:
            failure = ValidationError(f"parity failed for {hop} at {label}: {parity.summary()}", parity=parity.to_dict(),
                                      hint="the artifact holds at the sample size only: fix the dim with --dim NAME=N, "
                                           "or narrow its bounds")
    return rows, note, failure
