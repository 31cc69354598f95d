"""Test-only targets made of nothing but their own module and one descriptor each, as
docs/adding_a_target.md describes a target; `tests/test_targets.py` registers them and checks that
every part of the program sees them.

- `tiny` writes the IR's ONNX graph as `model.tiny`, runs it in onnxruntime, and takes one option
  of its own (with its flag);
- `tiny-board` writes `model.board` for a runtime that cannot run here: its runner reads a file's
  inputs and outputs anywhere but declares `cannot_run()`, so the pipeline checks the artifact's
  I/O against the contract without running it, as it does for Core ML off macOS;
- `tiny-native` is reached by a native route only (from ONNX sources, by this module).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelport.errors import BadInputError, ValidationError
from modelport.ir import TensorSpec
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.targets import Target, option

NAME = "tiny"
RUNTIME = "onnxruntime"
DESCRIPTION = "the IR's ONNX graph under another name (a test target)"
BOARD = "tiny-board"
CANNOT_RUN = "the tiny board runs its models; this machine only reads them"


@dataclass(frozen=True)
class TinyOptions:
    """The target's own options, checked on construction as every options class is; `header` has a flag."""

    header: str = option("tiny", flag="--tiny-header", help="Tiny: the header word written beside the model.")

    def __post_init__(self):
        if not self.header.isidentifier():
            raise BadInputError(f"--tiny-header must be a name, not '{self.header}'")


def preflight(model, options):
    from modelport.emitters.preflight import Preflight, opset_of

    return Preflight(NAME, RUNTIME, None, opset_of(model.model), None, nodes=len(model.model.graph.node))


def emit(model, out_dir: Path, options):
    from modelport.emitters import Artifact
    from modelport.onnxfile.onnx_io import save_onnx

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

    return {**inspect_onnx(Path(path)), "format": Path(path).suffix.lstrip(".")}


# --- tiny-board: a runtime that cannot run here -------------------------------------------------

class BoardRunner(OnnxRuntimeRunner):
    """The board's runtime, as seen from this machine: a model's inputs and outputs are read from the
    file, running it is the board's (`cannot_run`)."""

    name = BOARD

    @classmethod
    def cannot_run(cls) -> str | None:
        return CANNOT_RUN

    def output_specs(self) -> list[TensorSpec]:
        from modelport.ir import contract_from_onnx
        from modelport.onnxfile.onnx_io import load_onnx

        return contract_from_onnx(load_onnx(self.path, weights=False))[1]

    def run(self, feeds):
        raise ValidationError(f"the {BOARD} model cannot be run here: {CANNOT_RUN}", path=self.path)


class Board:
    """The tiny-board emitter (`emit`, `preflight`), written as a module would be: the same graph as `tiny`."""

    NAME, RUNTIME = BOARD, BOARD

    @staticmethod
    def preflight(model, options):
        return preflight(model, options)

    @staticmethod
    def emit(model, out_dir: Path, options):
        from modelport.emitters import Artifact
        from modelport.onnxfile.onnx_io import save_onnx

        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "model.board"
        return Artifact(target=BOARD, runtime=BOARD, path=path, files=list(save_onnx(model.model, path)),
                        precision=options.precision, runner=BOARD)


def open_board(path):
    """validate's opener for a user's .board file: read here, never run."""
    return BoardRunner(Path(path))


TINY = Target(NAME, "Tiny", "tests.tiny_target", runtime="onnxruntime",
              runner="modelport.runtimes.onnxruntime:OnnxRuntimeRunner", opener="tests.tiny_target:open_tiny",
              inspector="tests.tiny_target:inspect", suffixes=(".tiny",), file="model.tiny", artifact="a tiny file",
              precisions=("fp32", "fp16"), needs=("onnxruntime",), options="tests.tiny_target:TinyOptions")

TINY_BOARD = Target(BOARD, "Tiny board", "tests.tiny_target:Board", runtime=BOARD, runner="tests.tiny_target:BoardRunner",
                    opener="tests.tiny_target:open_board", inspector="tests.tiny_target:inspect", suffixes=(".board",),
                    file="model.board", artifact="a tiny board file", needs=("onnxruntime",), bench=False)


# a target reached by a native route only: from ONNX sources, by this module
NATIVE = Target("tiny-native", "Tiny native", "tests.tiny_target", runtime="onnxruntime", precisions=("fp32",),
                native={"onnx": "tests.tiny_target"}, onnx_route=False)
AUTO = "first"
PRECISIONS = ("fp32",)
SOURCE_ONLY = False


def refusal(ir, options):
    return None


# --- tiny-faulty: an artifact its own runtime fails on, and a converter that talks too much ----------

class Faulty:
    """An emitter whose file onnxruntime cannot load (`mode` "corrupt"), or that refuses the model
    with a page of a converter's internals (`mode` "verbose")."""

    NAME, RUNTIME = "tiny-faulty", "onnxruntime"
    mode = "corrupt"

    @staticmethod
    def preflight(model, options):
        return preflight(model, options)

    @classmethod
    def emit(cls, model, out_dir: Path, options):
        from modelport.emitters import Artifact
        from modelport.errors import UnsupportedError

        if cls.mode == "verbose":
            trace = "\n".join(f"  File \"converter/internals_{i}.py\", line {i}, in step_{i}" for i in range(40))
            raise UnsupportedError("the converter failed: tensor 'x' cannot be lowered\nTraceback (most recent call last):\n"
                                   + trace)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "model.tiny"
        path.write_bytes(b"\x08\x07" + b"not a model " * 40)  # a truncated protobuf: onnxruntime refuses it
        return Artifact(target=cls.NAME, runtime=cls.RUNTIME, path=path, files=[path], precision=options.precision,
                        runner="onnxruntime")


TINY_FAULTY = Target("tiny-faulty", "Tiny faulty", "tests.tiny_target:Faulty", runtime="onnxruntime",
                     runner="modelport.runtimes.onnxruntime:OnnxRuntimeRunner", file="model.tiny", artifact="a broken tiny file",
                     needs=("onnxruntime",), bench=False)


# --- tiny-runaway: a converter that runs away in time or in memory --------------------------------

class Runaway:
    """An emitter that loops (`mode` "time") or keeps allocating (`mode` "memory") far past any
    reasonable bound, in Python, with a safety stop of its own so a broken bound cannot hang a test."""

    NAME, RUNTIME = "tiny-runaway", "onnxruntime"
    mode = "time"
    held: list = []

    @staticmethod
    def preflight(model, options):
        return preflight(model, options)

    @classmethod
    def emit(cls, model, out_dir: Path, options):
        import time

        start = time.monotonic()
        while time.monotonic() - start < 120:  # the safety stop: a test fails long before, if the bound does not hold
            if cls.mode == "memory" and len(cls.held) < 160:
                cls.held.append(bytearray(32 << 20))  # touched: resident, 32 MiB at a time up to 5 GiB
            time.sleep(0.05)
        raise RuntimeError("the runaway converter was not stopped")


TINY_RUNAWAY = Target("tiny-runaway", "Tiny runaway", "tests.tiny_target:Runaway", runtime="onnxruntime",
                      runner="modelport.runtimes.onnxruntime:OnnxRuntimeRunner", file="model.tiny", artifact="a tiny file",
                      needs=("onnxruntime",), bench=False)
