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
from modelport.resolve.specs import SourceSpec  # what a parser is asked to read (defined below the parsers)

# framework name -> module; order matters for sniffing (first match wins). Aliases: other
# spellings users type, MMdnn's included.
PARSERS = Registry("source framework", {
    "onnx": "modelport.parsers.onnx",
    "paddle": "modelport.parsers.paddle",  # before keras: Paddle's inference.json is not a Keras architecture
    "caffe": "modelport.parsers.caffe",
    "darknet": "modelport.parsers.darknet",
    "pytorch": "modelport.parsers.pytorch",
    "keras": "modelport.parsers.keras",
    "savedmodel": "modelport.parsers.savedmodel",
    "graphdef": "modelport.parsers.graphdef",
    "tflite": "modelport.parsers.tflite",
    "huggingface": "modelport.parsers.huggingface",
}, aliases={
    "torch": "pytorch", "pth": "pytorch", "tensorflow": "savedmodel", "tf": "savedmodel", "saved_model": "savedmodel",
    "frozen": "graphdef", "pb": "graphdef", "tf.keras": "keras", "h5": "keras", "lite": "tflite",
    "hf": "huggingface", "transformers": "huggingface", "paddlepaddle": "paddle", "pdmodel": "paddle",
    "prototxt": "caffe", "caffemodel": "caffe", "yolo": "darknet",
})
# what each source framework needs: top-level modules (deps.EXTRAS names the extra), read by `doctor`
PARSER_NEEDS = {"onnx": ["onnx", "onnxruntime"], "pytorch": ["torch"], "keras": ["tensorflow", "keras", "tf2onnx"],
                "savedmodel": ["tensorflow", "tf2onnx"], "graphdef": ["tensorflow", "tf2onnx"],
                "tflite": ["tensorflow", "tf2onnx", "ai_edge_litert"], "paddle": ["paddle", "paddle2onnx"],
                "caffe": ["onnx", "cv2"], "darknet": ["onnx", "cv2"]}
# network files whose weights are a second file, given by MMdnn's -iw (else found beside them by name):
# suffix -> the parser that reads them (spec.options["weights"] carries the weights' path)
NETWORK_FILES = {".json": "keras", ".prototxt": "caffe", ".cfg": "darknet", ".pdmodel": "paddle"}
# the second file a source file of these suffixes is read with when -iw does not name it (found by
# file_checks.companion_file): an output must not overwrite it either
COMPANIONS = {".prototxt": ".caffemodel", ".caffemodel": ".prototxt", ".cfg": ".weights", ".pdmodel": ".pdiparams",
              ".json": ".pdiparams"}
# source format -> (its parser's "module:function" returning `inspect`'s dict, the file endings it takes; "/"
# any folder); the orchestration's `inspect` looks them up after the targets' artifact formats
INSPECTORS = (
    ("pytorch", "modelport.parsers.pytorch:inspect", (".pt", ".pth", ".pt2", ".safetensors")),
    ("keras", "modelport.parsers.keras:inspect", (".keras", ".h5", ".hdf5")),
    ("savedmodel", "modelport.parsers.savedmodel:inspect", ("saved_model.pb",)),
    ("graphdef", "modelport.parsers.graphdef:inspect", (".pb",)),
    ("darknet", "modelport.parsers.darknet:inspect", (".cfg",)),
    ("paddle", "modelport.parsers.paddle:inspect", (".pdmodel", "inference.json")),
    ("huggingface", "modelport.parsers.huggingface:inspect", ("/config.json",)),
    ("savedmodel", "modelport.parsers.savedmodel:inspect", ("/",)),  # any other folder, last
)
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
        "cannot tell the source framework from the file", path=path, hint=f"pass --from; known: {', '.join(PARSERS)}"
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
