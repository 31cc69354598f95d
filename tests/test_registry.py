from __future__ import annotations

import json
import subprocess
import sys

import pytest

from modelport.emitters import EMITTERS
from modelport.errors import BadInputError
from modelport.parsers import PARSERS
from modelport.registry import Registry
from modelport.runtimes import RUNNERS
from modelport.serving import PACKAGERS


def test_lookup_aliases_and_errors():
    r = Registry("widget", {"a": "json", "b": "json:dumps"}, aliases={"alpha": "a"})
    assert r.load("ALPHA").__name__ == "json" and r.load("b")([1]) == "[1]"
    assert list(r) == ["a", "b"] and "a" in r
    with pytest.raises(BadInputError, match=r"unknown widget 'c'; known: \['a', 'b'\]"):
        r.load("c")
    r.register("a", "json")  # the same entry again is fine
    with pytest.raises(ValueError, match="already registered"):
        r.register("a", "os")


HEAVY = ("onnx", "onnxruntime", "torch", "tensorflow", "keras", "tf_keras", "onnx2tf", "tf2onnx", "onnxsim", "onnxscript", "transformers",
         "tensorrt", "ai_edge_litert", "safetensors")


@pytest.mark.parametrize("registry", [PARSERS, EMITTERS, RUNNERS, PACKAGERS], ids=lambda r: r.kind)
def test_every_registered_entry_imports(registry):
    """Each entry's module imports without its heavy framework (those load inside functions).

    Checked in a fresh interpreter: this test process has long imported torch and TensorFlow."""
    modules = sorted({registry[name].partition(":")[0] for name in registry})
    code = ("import json, sys\n"
            f"for m in {modules!r}:\n"
            "    __import__(m)\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [], f"importing the {registry.kind} modules loaded heavy frameworks"


def test_every_alias_points_at_an_entry():
    for registry in (PARSERS, EMITTERS, RUNNERS, PACKAGERS):
        for alias, target in registry.aliases.items():
            assert target in registry, (registry.kind, alias)
