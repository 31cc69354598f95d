"""Lazy imports of optional frameworks, turning an ImportError into a clear install hint."""

from __future__ import annotations

import importlib
from types import ModuleType

from modelport.errors import MissingDependencyError

# module name -> extra that installs it
EXTRAS = {
    "torch": "torch",
    "safetensors": "torch",
    "transformers": "torch",
    "tensorflow": "tf",
    "tf2onnx": "tf",
    "keras": "tf",
    "onnx2tf": "tf",
    "ai_edge_litert": "tf",
    "tensorrt": "tensorrt",
    "tritonclient": "serve",
    "onnxsim": "optimize",
    "onnxscript": "optimize",
    "onnx_ir": "optimize",
    "PIL": "optimize",
    "onnxconverter_common": "optimize",
}


def require(module: str, *, purpose: str | None = None) -> ModuleType:
    """Import `module` or raise MissingDependencyError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        extra = EXTRAS.get(top)
        what = f" for {purpose}" if purpose else ""
        hint = f'pip install "modelport[{extra}]"' if extra else f"pip install {top}"
        raise MissingDependencyError(f"'{top}' is not installed{what}: {e}", hint=hint) from e


def version_of(module: str) -> str | None:
    """The installed version of a distribution, without importing it."""
    from importlib import metadata

    names = {"ai_edge_litert": "ai-edge-litert", "tensorflow": "tensorflow-cpu"}
    for name in (module, names.get(module, module), module.replace("_", "-")):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    if module == "tensorflow":
        try:
            return metadata.version("tensorflow")
        except metadata.PackageNotFoundError:
            return None
    return None
