"""A target made of nothing but its own module and one descriptor: `tiny` writes the IR's ONNX
graph as `model.tiny`, runs it in onnxruntime, and takes one option of its own. `tests/test_targets.py`
registers it and checks that every part of the program sees it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelport.errors import BadInputError
from modelport.targets import Target

NAME = "tiny"
RUNTIME = "onnxruntime"
DESCRIPTION = "the IR's ONNX graph under another name (a test target)"


@dataclass(frozen=True)
class TinyOptions:
    """The target's own options, checked on construction as every options class is."""

    header: str = "tiny"

    def __post_init__(self):
        if not self.header.isidentifier():
            raise BadInputError(f"--tiny-header must be a name, not '{self.header}'")


def preflight(model, options):
    from modelport.emitters.preflight import Preflight, opset_of

    return Preflight(NAME, RUNTIME, None, opset_of(model.model), None, nodes=len(model.model.graph.node))


def emit(model, out_dir: Path, options):
    from modelport.emitters import Artifact
    from modelport.onnx_io import save_onnx

    opts = options.target or TinyOptions()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.tiny"
    files = save_onnx(model.model, path)
    return Artifact(target=NAME, runtime=RUNTIME, path=path, files=list(files), precision=options.precision,
                    details={"header": opts.header}, runner="onnxruntime")


def open_tiny(path):
    """validate's opener: a user's .tiny file as a runner."""
    from modelport.runtimes.onnxruntime import open_onnx_file

    return open_onnx_file(Path(path))


def inspect(path) -> dict:
    from modelport.orchestration.inspect import inspect_onnx

    return {**inspect_onnx(Path(path)), "format": NAME}


TINY = Target(NAME, "Tiny", "tests.tiny_target", runtime="onnxruntime",
              runner="modelport.runtimes.onnxruntime:OnnxRuntimeRunner", opener="tests.tiny_target:open_tiny",
              inspector="tests.tiny_target:inspect", suffixes=(".tiny",), file="model.tiny", artifact="a tiny file",
              precisions=("fp32", "fp16"), needs=("onnxruntime",), options="tests.tiny_target:TinyOptions")


# a target reached by a native route only: from ONNX sources, by this module
NATIVE = Target("tiny-native", "Tiny native", "tests.tiny_target", runtime="onnxruntime", precisions=("fp32",),
                native={"onnx": "tests.tiny_target"}, onnx_route=False)
AUTO = "first"


def refusal(ir, options):
    return None
