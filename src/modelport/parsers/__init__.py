"""Parsers turn a source model into an IRModel. A registry keyed by framework name and file sniffing.

Each parser module has `NAME`, `DESCRIPTION`, `sniff(path) -> bool` (cheap: file names and magic
bytes only, no framework import) and `parse(source, spec: SourceSpec) -> IRModel`. Adding a
framework is one module plus one line in PARSERS.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from modelport.errors import BadInputError
from modelport.ir import IRModel
from modelport.registry import Registry
from modelport.specs import SourceSpec  # what a parser is asked to read (defined below the parsers)

# framework name -> module; order matters for sniffing (first match wins). Aliases: other
# spellings users type, MMdnn's included.
PARSERS = Registry("source framework", {
    "onnx": "modelport.parsers.onnx",
    "pytorch": "modelport.parsers.pytorch",
    "keras": "modelport.parsers.keras",
    "savedmodel": "modelport.parsers.savedmodel",
    "graphdef": "modelport.parsers.graphdef",
    "tflite": "modelport.parsers.tflite",
    "hf-decoder": "modelport.parsers.hf_decoder",
}, aliases={
    "torch": "pytorch", "pth": "pytorch", "tensorflow": "savedmodel", "tf": "savedmodel", "saved_model": "savedmodel",
    "frozen": "graphdef", "pb": "graphdef", "tf.keras": "keras", "h5": "keras", "lite": "tflite",
})
register_parser = PARSERS.register
canonical = PARSERS.canonical


def get_parser(name: str) -> ModuleType:
    return PARSERS.load(name)


def detect(path: Path) -> str:
    """The framework of a file or folder, from its name and first bytes."""
    for name in PARSERS:
        if PARSERS.load(name).sniff(path):
            return name
    raise BadInputError(
        "cannot tell the source framework from the file", path=path, hint=f"pass --from with one of {sorted(PARSERS)}"
    )


def parse(source, spec: SourceSpec) -> IRModel:
    if spec.framework:
        name = canonical(spec.framework)
    elif spec.path is not None:
        name = detect(spec.path)
    else:
        name = "pytorch"  # a Python object: an nn.Module, or a keras.Model (checked without importing Keras)
        if any(c.__module__.split(".")[0] in ("keras", "tf_keras") for c in type(source).__mro__):
            name = "keras"
    return get_parser(name).parse(source, spec)
