"""PyTorch runner: an nn.Module (or ExportedProgram module) called with inputs in spec order."""

from __future__ import annotations

import numpy as np


def flatten_outputs(out) -> list:
    """Tensors of a module's output in a stable order (tuples, lists, dicts, ModelOutput)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict) or hasattr(out, "to_tuple"):
        values = out.to_tuple() if hasattr(out, "to_tuple") else tuple(out.values())
        return [t for v in values for t in flatten_outputs(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in flatten_outputs(v)]
    return []


class TorchRunner:
    name = "torch"

    def __init__(self, module, *, input_names: list[str], output_names: list[str] | None = None):
        self.module = module
        self.input_names = input_names
        self.output_names = output_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        args = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self.input_names]
        with torch.no_grad():
            outs = flatten_outputs(self.module(*args))
        arrays = [o.detach().cpu().numpy() for o in outs]
        names = self.output_names or [f"output_{i}" for i in range(len(arrays))]
        return dict(zip(names, arrays, strict=False))
