"""Shared fixtures: an in-process CLI runner, a subprocess CLI runner, and tiny model builders.

Tests build their own models; nothing binary is checked in. Both CLI runners check that a
command leaves its inputs byte-identical (`InputGuard`). No test reaches the network beyond
127.0.0.1: `tests/netguard` refuses any other connection or name lookup, in this process and in
every child process, and a test during which one was attempted fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
NETGUARD = REPO / "tests" / "netguard"


_CREATED_LOG: list[str] = []


def pytest_configure(config):
    """Install the network guard here and, through PYTHONPATH, in every child process. Each xdist
    worker gets a log of its own (its children write to it too): with one log for all workers, a
    test's window also saw what a test on the other worker did, such as tests/test_netguard.py's
    deliberate lookups of github.com before it removes them from the log."""
    import importlib.util
    import tempfile

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if os.environ.get("MODELPORT_TEST_NET_LOG_OWNER") != worker:
        fd, log = tempfile.mkstemp(prefix=f"modelport-net-{worker}-", suffix=".log")
        os.close(fd)
        os.environ["MODELPORT_TEST_NET_LOG"] = log
        os.environ["MODELPORT_TEST_NET_LOG_OWNER"] = worker
        _CREATED_LOG.append(log)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(NETGUARD), os.environ.get("PYTHONPATH")) if p)
    spec = importlib.util.spec_from_file_location("modelport_test_netguard", NETGUARD / "sitecustomize.py")
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    guard.install()


def pytest_unconfigure(config):
    for log in _CREATED_LOG:
        Path(log).unlink(missing_ok=True)


def network_attempts() -> list[str]:
    """What the guard refused so far (this process and its children), oldest first."""
    try:
        return Path(os.environ["MODELPORT_TEST_NET_LOG"]).read_text().splitlines()
    except (KeyError, OSError):
        return []


@pytest.fixture(autouse=True)
def _no_network():
    """Fail the test if anything in it, or in a process it started, tried to leave the loopback."""
    before = len(network_attempts())
    yield
    new = network_attempts()[before:]
    if new:
        pytest.fail("network access outside 127.0.0.1 during the test: " + "; ".join(line.split(" ", 1)[1] for line in new[:3]),
                    pytrace=False)


class CLIResult:
    def __init__(self, code: int, stdout: str, stderr: str):
        self.exit_code = code
        self.stdout = stdout
        self.stderr = stderr

    def json(self):
        return json.loads(self.stdout)

    def __repr__(self):
        return f"CLIResult(exit={self.exit_code}, stderr={self.stderr[-2000:]!r})"


# Options whose value is a path the command writes; every other argument naming a file is an input.
OUTPUT_OPTIONS = frozenset({"-o", "--output-dir", "-om", "--outputModel", "--cache-dir", "--junit"})


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class InputGuard:
    """sha256 of every input file of a CLI command, taken before it runs and checked after.

    Inputs are the arguments naming existing paths, except the values of output options. A file
    brings its siblings (model.onnx.data, model.safetensors beside model.pt2), a folder everything
    under it; anything inside an output path is left out, since the command may replace it.
    """

    def __init__(self, args: list[str]):
        self.outputs = []
        candidates = []
        if args[:2] in (["repo", "add"], ["repo", "promote"], ["repo", "rollback"]) and len(args) > 2:
            self.outputs.append(Path(args[2]).resolve())  # the repository these commands edit
        it = iter(args)
        for a in it:
            opt, eq, value = a.partition("=")
            if opt in OUTPUT_OPTIONS:
                self.outputs.append(Path(value if eq else next(it, "")).resolve())
            else:
                candidates.append(a)
        self.before = self.hashes(candidates)

    def _is_output(self, p: Path) -> bool:
        return any(p == o or o in p.parents for o in self.outputs)

    def hashes(self, args: list[str]) -> dict[Path, str]:
        files: set[Path] = set()
        for a in args:
            try:
                p = Path(a).resolve()
                exists = p.exists()
            except (OSError, ValueError):
                continue
            if not exists or self._is_output(p) or p == Path(p.anchor) or REPO == p or p in REPO.parents:
                continue
            found = p.rglob("*") if p.is_dir() else [p, *p.parent.iterdir()]
            files.update(f for f in found if f.is_file() and not f.is_symlink() and not self._is_output(f))
        return {f: _sha256(f) for f in sorted(files)}

    def check(self) -> None:
        """Fail the test naming every input file the command changed or removed."""
        changed = [f"{f} ({'removed' if not f.exists() else 'changed'})" for f, digest in self.before.items()
                   if not f.is_file() or _sha256(f) != digest]
        if changed:
            pytest.fail("the command touched its inputs: " + ", ".join(changed), pytrace=False)


@pytest.fixture
def cli():
    """Run the CLI in-process (fast: frameworks stay imported): cli("convert", ...).

    The command's input files must be byte-identical afterwards (InputGuard)."""
    from typer.testing import CliRunner

    from modelport.cli import app

    runner = CliRunner()

    def invoke(*args: str) -> CLIResult:
        argv = [str(a) for a in args]
        guard = InputGuard(argv)
        r = runner.invoke(app, argv, catch_exceptions=False)
        guard.check()
        return CLIResult(r.exit_code, r.stdout, r.stderr)

    return invoke


@pytest.fixture
def cli_proc():
    """Run the CLI as a real process (for stdout/stderr discipline and start-up behaviour).

    The command's input files must be byte-identical afterwards (InputGuard)."""

    def invoke(*args: str, timeout: float = 600, env: dict | None = None) -> CLIResult:
        e = {**os.environ, **(env or {})}
        argv = [str(a) for a in args]
        guard = InputGuard(argv)
        p = subprocess.run([sys.executable, "-m", "modelport", *argv], capture_output=True, text=True, timeout=timeout, env=e)
        guard.check()
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


def check_options_class(cls, bad: list[tuple[dict, str]], given: dict, normalised: dict) -> None:
    """An options class checks its own values (BadInputError with the CLI's words), normalises
    what it keeps (`given` -> `normalised`) and is frozen."""
    import dataclasses
    import re

    from modelport.errors import BadInputError

    for kwargs, words in bad:
        with pytest.raises(BadInputError, match=re.escape(words)):
            cls(**kwargs)
    opts = cls(**given)
    assert {k: getattr(opts, k) for k in normalised} == normalised
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(opts, next(iter(normalised)), None)

