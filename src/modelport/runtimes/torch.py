"""PyTorch runner: an nn.Module (or ExportedProgram module) called with inputs in spec order.

A module does not state its input shapes: the caller gives them (`inputs`, the contract's specs),
or they are read from an exported graph's placeholders."""

from __future__ import annotations

import numpy as np

from modelport.errors import BadInputError
from modelport.ir import TensorSpec
from modelport.runtimes.base import Runner


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


class TorchRunner(Runner):
    name = "torch"
    imports = ("torch", "safetensors")

    def __init__(self, module, *, input_names: list[str], output_names: list[str] | None = None,
                 inputs: list[TensorSpec | dict] | None = None):
        self.module = module
        self.input_names = input_names
        self.output_names = output_names
        self.inputs = [TensorSpec.from_dict(s) if isinstance(s, dict) else s for s in inputs or []]

    def input_specs(self) -> list[TensorSpec]:
        return module_input_specs(self.module, self.input_names, self.inputs)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        args = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self.input_names]
        with torch.no_grad():
            outs = flatten_outputs(self.module(*args))
        arrays = [o.detach().cpu().numpy() for o in outs]
        names = self.output_names or [f"output_{i}" for i in range(len(arrays))]
        return dict(zip(names, arrays, strict=False))


def module_input_specs(module, input_names: list[str], given: list[TensorSpec]) -> list[TensorSpec]:
    """The specs given for `input_names`, else those of an exported graph's placeholders (a dynamic
    dim, a SymInt there, is named after its input)."""
    if given:
        by_name = {s.name: s for s in given}
        missing = [n for n in input_names if n not in by_name]
        if missing:
            raise BadInputError(f"no input spec for {missing}; given: {sorted(by_name)}")
        return [by_name[n] for n in input_names]
    graph = getattr(module, "graph", None)
    vals = [n.meta.get("val") for n in getattr(graph, "nodes", []) if n.op == "placeholder"]
    vals = [v for v in vals if hasattr(v, "shape")][-len(input_names):] if input_names else []
    if len(vals) != len(input_names):
        raise BadInputError("the module does not state its input shapes: give the runner `inputs` (the contract's specs)")
    return [TensorSpec(n, str(v.dtype).removeprefix("torch."),
                       [int(d) if isinstance(d, int) else f"{n}_dim{k}" for k, d in enumerate(v.shape)])
            for n, v in zip(input_names, vals, strict=True)]
