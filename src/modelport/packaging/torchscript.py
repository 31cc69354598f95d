"""TorchScript `model.pt` for Triton's pytorch_libtorch backend, traced from the emitted PyTorch code.

The generated `Model` is traced with `torch.jit.trace` on the contract's sample inputs (batch 2
when there is a batch axis), saved, loaded back with `torch.jit.load`, and checked before the file
is kept: on the trace inputs against the eager module (and against onnxruntime when the folder
holds the ONNX artifact), then at other sizes of every dynamic dim (batch 3, each other symbolic
dim one larger) against the eager module. A trace that froze a dynamic size (a Python int taken
from a shape) fails that second check; `torch.jit.script` is tried next, and when it cannot do
better the packaging fails with exit 4 rather than ship a model that breaks at another batch size.

Importing `model.py` runs its code, so tracing a folder's code needs `trust` (the convert pipeline
passes it for the code it has just written).
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

from modelport.errors import UnsafeInputError, ValidationError, one_line
from modelport.packaging.bundle import Artifacts
from modelport.packaging.torchserve import pytorch_files
from modelport.reference.samples import make_inputs
from modelport.runtimes.torch import flatten_outputs
from modelport.runtimes.torch_source import load_generated
from modelport.validation import Tolerance, compare

TOLERANCE = Tolerance(1e-4, 1e-3, 0.9999)


def _shifted_dims(artifacts: Artifacts) -> dict[str, int]:
    """Every symbolic dim at another size than the trace's: batch 3, the others one larger."""
    dims = dict(artifacts.sample_dims)
    axis = artifacts.batch_axis()
    for spec in artifacts.inputs:
        for i, d in enumerate(spec.shape):
            if isinstance(d, str) and d != axis:
                dims[d] = spec.concrete_shape(artifacts.sample_dims)[i] + 1
    if axis:
        dims[axis] = 3
    return dims


def _run(module, artifacts: Artifacts, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch


    args = [torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in artifacts.inputs]
    with torch.no_grad():
        outs = flatten_outputs(module(*args))
    return {s.name: o.detach().cpu().numpy() for s, o in zip(artifacts.outputs, outs, strict=True)}


def _check(candidate, eager, artifacts: Artifacts, feeds: dict, hop: str):
    """Parity of `candidate` with the eager module on `feeds`; the comparison, or the error it raised."""
    try:
        got = _run(candidate, artifacts, feeds)
    except Exception as e:  # a specialised trace often fails on a reshape at another size
        return one_line(e, 200, typed=True)
    return compare(_run(eager, artifacts, feeds), got, TOLERANCE, hop=hop)


def _problem(result) -> str | None:
    if isinstance(result, str):
        return result
    return None if result.ok else result.summary()


def write_torchscript(artifacts: Artifacts, dst: Path, *, trust: bool) -> dict:
    """Trace the emitted PyTorch code into `dst` (model.pt); returns the parity figures of the checks."""
    import torch


    folder = artifacts.get("pytorch", "a TorchScript model.pt")
    if not trust:
        raise UnsafeInputError("tracing the PyTorch code into TorchScript imports and runs its model.py", path=folder,
                               hint="pass --trust if the folder is your own 'modelport convert' output")

    # importing model.py writes __pycache__ beside it: the code is imported from a copy inside the staging folder
    with tempfile.TemporaryDirectory(prefix=".torchscript-", dir=dst.parent) as tmp:
        for name, src in pytorch_files(artifacts).items():
            shutil.copyfile(src, Path(tmp) / name)
        eager = load_generated(tmp)
    trace_feeds = artifacts.sample_inputs(batch=2, seed=0)

    other_feeds = make_inputs(artifacts.inputs, _shifted_dims(artifacts), seed=1)
    args = tuple(torch.from_numpy(np.ascontiguousarray(trace_feeds[s.name])) for s in artifacts.inputs)
    failures: list[str] = []
    for method in ("trace", "script"):
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                scripted = torch.jit.trace(eager, args, check_trace=False) if method == "trace" else torch.jit.script(eager)
        except Exception as e:
            failures.append(f"torch.jit.{method} failed: {one_line(e, 200, typed=True)}")
            continue
        torch.jit.save(scripted, str(dst))
        loaded = torch.jit.load(str(dst), map_location="cpu").eval()
        same = _check(loaded, eager, artifacts, trace_feeds, "torchscript")
        other = _check(loaded, eager, artifacts, other_feeds, "torchscript, other sizes")
        bad = _problem(same) or _problem(other)
        if bad is None:
            figures = {"method": method, "trace_shapes": {k: list(v.shape) for k, v in trace_feeds.items()},
                       "checked_shapes": {k: list(v.shape) for k, v in other_feeds.items()},
                       "parity": same.to_dict(), "parity_other_sizes": other.to_dict()}
            if artifacts.has("onnx"):
                ref = compare(artifacts.reference_outputs(trace_feeds), _run(loaded, artifacts, trace_feeds), TOLERANCE,
                              hop="torchscript vs onnx")
                if not ref.ok:
                    dst.unlink()
                    raise ValidationError(f"the TorchScript model is off the ONNX reference: {ref.summary()}", path=folder)
                figures["parity_onnx"] = ref.to_dict()
            return figures
        failures.append(f"torch.jit.{method}: {bad}")
        dst.unlink()
    raise ValidationError("no TorchScript model that keeps the dynamic dims: " + "; ".join(failures), path=folder,
                          hint="serve the ONNX artifact instead (--backend onnx)")
