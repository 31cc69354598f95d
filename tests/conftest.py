"""Shared fixtures: an in-process CLI runner, a subprocess CLI runner, and tiny model builders.

Tests build their own models; nothing binary is checked in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


class CLIResult:
    def __init__(self, code: int, stdout: str, stderr: str):
        self.exit_code = code
        self.stdout = stdout
        self.stderr = stderr

    def json(self):
        return json.loads(self.stdout)

    def __repr__(self):
        return f"CLIResult(exit={self.exit_code}, stderr={self.stderr[-2000:]!r})"


@pytest.fixture
def cli():
    """Run the CLI in-process (fast: frameworks stay imported): cli("convert", ...)."""
    from typer.testing import CliRunner

    from modelport.cli import app

    runner = CliRunner()

    def invoke(*args: str) -> CLIResult:
        r = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
        return CLIResult(r.exit_code, r.stdout, r.stderr)

    return invoke


@pytest.fixture
def cli_proc():
    """Run the CLI as a real process (for stdout/stderr discipline and start-up behaviour)."""

    def invoke(*args: str, timeout: float = 600, env: dict | None = None) -> CLIResult:
        e = {**os.environ, **(env or {})}
        p = subprocess.run([sys.executable, "-m", "modelport", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=e)
        return CLIResult(p.returncode, p.stdout, p.stderr)

    return invoke


def tree(path: Path) -> list[str]:
    """Every path under `path` (relative), for asserting nothing was left behind."""
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*"))


@pytest.fixture
def tiny_onnx(tmp_path) -> Path:
    """A small ONNX model (MatMul + Add + Relu) with a dynamic batch, saved to a folder of its own."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder = tmp_path / "src"
    folder.mkdir()
    path = folder / "tiny.onnx"
    onnx.save(model, str(path))
    return path
