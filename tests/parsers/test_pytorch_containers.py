"""A `.pt2` whose output container type this process never registered still loads."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch.utils import _pytree as pytree

from modelport.parsers import SourceSpec, parse
from modelport.parsers.pytorch_containers import spec_type_names


@dataclasses.dataclass
class Heads:
    """A ModelOutput-like container: registered while exporting, gone when the file is loaded."""

    logits: torch.Tensor
    embedding: torch.Tensor


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 2)
        self.b = torch.nn.Linear(4, 3)

    def forward(self, x):
        return Heads(self.a(x), self.b(x))


def test_unregistered_output_container_loads_as_named_outputs(tmp_path):
    name = f"{__name__}.Heads"
    pytree.register_dataclass(Heads, serialized_type_name=name)
    try:
        torch.manual_seed(0)
        model = TwoHeads().eval()
        ep = torch.export.export(model, (), {"x": torch.randn(2, 4)}, dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
        path = tmp_path / "heads.pt2"
        torch.export.save(ep, str(path))
    finally:
        pytree._deregister_pytree_node(Heads)  # as in a new process: the type is unknown to pytree
    assert name in spec_type_names(path)
    ir = parse(path, SourceSpec(path=path))
    assert [o.name for o in ir.outputs] == ["logits", "embedding"]
    x = ir.reference.inputs["x"]
    with torch.no_grad():
        want = model(torch.from_numpy(x))
    np.testing.assert_allclose(ir.reference.outputs["embedding"], want.embedding.numpy(), rtol=1e-6)
    assert Heads not in pytree.SUPPORTED_NODES  # nothing from the file was imported or registered as Heads


def test_inspect_names_outputs_as_convert_does(cli, tmp_path):
    name = f"{__name__}.Heads"
    pytree.register_dataclass(Heads, serialized_type_name=name)
    try:
        ep = torch.export.export(TwoHeads().eval(), (torch.randn(2, 4),))
        path = tmp_path / "heads.pt2"
        torch.export.save(ep, str(path))
    finally:
        pytree._deregister_pytree_node(Heads)
    r = cli("inspect", path, "--json")
    assert r.exit_code == 0, r
    assert [(o["name"], o["shape"]) for o in r.json()["outputs"]] == [("logits", [2, 2]), ("embedding", [2, 3])]
