"""Runner for generated PyTorch source: imports `model.py` from its folder and loads `model.safetensors`.

The module is imported from its path under a unique name and kept out of `sys.modules`, so two
generated models (or a user's own `model` module) never shadow each other.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError
from modelport.ir import TensorSpec
from modelport.runtimes.torch import TorchRunner


def import_generated(folder: str | Path):
    """The generated module in `folder` (a folder holding model.py, or the model.py path itself)."""
    path = Path(folder)
    if path.is_dir():
        path = path / "model.py"
    if not path.is_file():
        raise BadInputError("no generated model.py here", path=path)
    name = "modelport_generated_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # compiled here rather than by the loader, which would write __pycache__/ into a folder that is not ours
    exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), module.__dict__)
    return module


def load_generated(folder: str | Path):
    """`Model()` from the folder's model.py with the weights of its model.safetensors, in eval mode."""

    require("torch", purpose="running generated PyTorch code")
    require("safetensors")
    from safetensors.torch import load_file

    path = Path(folder)
    folder = path if path.is_dir() else path.parent
    module = import_generated(folder)
    model = module.Model()
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise BadInputError("model.safetensors is missing beside model.py", path=folder)
    model.load_state_dict(load_file(str(weights)))
    return model.eval()


class TorchSourceRunner(TorchRunner):
    """A TorchRunner over the generated module; its input specs are the contract's, which the emitter
    passes (`inputs`): generated code does not state shapes."""

    name = "torch_source"
    distribution = "torch"

    def __init__(self, model, *, input_names: list[str], output_names: list[str] | None = None,
                 inputs: list[dict | TensorSpec] | None = None):
        module = load_generated(model) if isinstance(model, (str, Path)) else model
        super().__init__(module, input_names=input_names, output_names=output_names, inputs=inputs)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BadInputError(f"missing inputs {missing}; the model expects {self.input_names}")
        return super().run(feeds)
