from __future__ import annotations

import json
import subprocess
import sys

import pytest

from modelport.emitters import EMITTERS
from modelport.errors import BadInputError
from modelport.ir import TensorSpec
from modelport.optimize import PASSES, Pass, PassResult
from modelport.orchestration.inspect import INSPECTORS
from modelport.orchestration.validate import KINDS
from modelport.packaging import PACKAGERS
from modelport.parsers import PARSERS
from modelport.registry import Registry
from modelport.runtimes import RUNNERS
from modelport.runtimes.base import Runner

ALL = [PARSERS, PASSES, EMITTERS, RUNNERS, PACKAGERS, INSPECTORS, KINDS]


def test_lookup_aliases_and_errors():
    r = Registry("widget", {"a": "json", "b": "json:dumps"}, aliases={"alpha": "a"})
    assert r.load("ALPHA").__name__ == "json" and r.load("b")([1]) == "[1]"
    assert list(r) == ["a", "b"] and "a" in r
    with pytest.raises(BadInputError, match=r"unknown widget 'c'; known: a, b$"):
        r.load("c")
    r.register("a", "json")  # the same entry again is fine
    with pytest.raises(ValueError, match="already registered"):
        r.register("a", "os")


HEAVY = ("onnx", "onnxruntime", "torch", "tensorflow", "keras", "tf_keras", "onnx2tf", "tf2onnx", "onnxsim", "onnxscript", "transformers",
         "tensorrt", "ai_edge_litert", "safetensors")


def test_lookup_by_file_name(tmp_path):
    r = Registry("reader", {"a": "json", "b": "json"}, suffixes={".a": "a", "x.b": "b", "/": "b"})
    (tmp_path / "m.A").write_text("")
    (tmp_path / "ax.b").write_text("")
    assert r.name_for(tmp_path / "m.A") == "a" and r.name_for(tmp_path / "ax.b") == "b" and r.name_for(tmp_path) == "b"
    assert r.name_for(tmp_path / "m.c") is None
    r.register("c", "json", suffixes=[".c"])
    assert r.name_for(tmp_path / "m.c") == "c"
    with pytest.raises(ValueError, match="already registered"):
        r.register_suffix(".a", "b")


def test_lookup_of_a_folder_by_a_file_inside(tmp_path):
    r = Registry("reader", {"hf": "json", "dir": "json"}, suffixes={"/config.json": "hf", "/": "dir"})
    (tmp_path / "plain").mkdir()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert r.name_for(tmp_path / "hf") == "hf" and r.name_for(tmp_path / "plain") == "dir"
    assert r.name_for(tmp_path / "hf" / "config.json") is None


@pytest.mark.parametrize("registry", ALL, ids=lambda r: r.kind)
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


def test_every_alias_and_file_ending_points_at_an_entry():
    for registry in ALL:
        for alias, target in {**registry.aliases, **registry.suffixes}.items():
            assert target in registry, (registry.kind, alias)


def test_a_new_extension_is_one_registry_line(monkeypatch, tmp_path, cli):
    """A pass, an inspector and a validate kind defined outside the package, each added with one
    line and then used through the commands like the built-in ones."""
    for registry in (PASSES, INSPECTORS, KINDS):  # the registrations below end with the test
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
        monkeypatch.setattr(registry, "suffixes", dict(registry.suffixes))
    PASSES.register("noop", "tests.test_registry:NoopPass")
    INSPECTORS.register("echo", "tests.test_registry:inspect_echo", suffixes=[".echo"])
    KINDS.register("echo", "tests.test_registry:EchoRunner", suffixes=[".echo"])

    from modelport.optimize import get_pass, parse_pass_list

    assert parse_pass_list("fold,noop") == ["fold", "noop"] and get_pass("noop").name == "noop"
    model = tmp_path / "m.echo"
    model.write_text("x:2,3")
    info = cli("inspect", model, "--json").json()
    # `inspect` adds each dim's form to whatever an inspector reports (orchestration/inspect.add_dims)
    fixed = [{"kind": "fixed", "size": 2}, {"kind": "fixed", "size": 3}]
    assert info == {"format": "echo", "inputs": [{"name": "x", "shape": [2, 3], "dims": fixed}], "path": str(model)}
    r = cli("validate", model, model, "--json")
    assert r.exit_code == 0, r
    assert r.json()["a"]["kind"] == "echo" and r.json()["inputs"] == {"x": [2, 3]}


class NoopPass(Pass):
    name = "noop"

    def apply(self, ir):
        return PassResult(ir.clone(), modified=False)


def _echo_spec(path) -> TensorSpec:
    name, _, dims = open(path).read().partition(":")
    return TensorSpec(name, "float32", [int(d) for d in dims.split(",")])


def inspect_echo(path) -> dict:
    spec = _echo_spec(path)
    return {"format": "echo", "inputs": [{"name": spec.name, "shape": spec.shape}]}


class EchoRunner(Runner):
    """A runtime whose model file names one input; its output is its input."""

    name = "echo"

    def __init__(self, path):
        self.spec = _echo_spec(path)

    def input_specs(self) -> list[TensorSpec]:
        return [self.spec]

    def run(self, feeds):
        return {"y": feeds[self.spec.name]}
