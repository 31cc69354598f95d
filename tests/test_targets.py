"""A target is its own module(s) plus one descriptor (`modelport.targets`): registering `tests/tiny_target.py`'s
descriptor is all it takes for `--to`, convert, validate, inspect, doctor, precisions and options to know it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from modelport import targets
from modelport.errors import BadInputError
from tests import tiny_target


@pytest.fixture
def tiny():
    with targets.registered(tiny_target.TINY) as t:
        yield t


def test_every_descriptor_string_names_something_importable():
    """Each module or attribute a descriptor names exists (a typo is caught here, not by a user)."""
    import importlib.util

    for t in targets.TARGETS.values():
        for ref in (t.emitter, t.runner, t.opener, t.inspector, t.options, *t.native.values()):
            if ref:
                module = ref.partition(":")[0]
                assert importlib.util.find_spec(module) is not None, (t.name, ref)


def test_one_descriptor_makes_a_target(tiny, tiny_onnx, tmp_path, cli):
    from modelport.orchestration import ConvertOptions, convert
    from modelport.orchestration.doctor import doctor
    from modelport.orchestration.inspect import inspect
    from modelport.orchestration.request import decide
    from modelport.orchestration.validate import validate_models
    from modelport.registry import EMITTERS
    from modelport.resolve.precisions import all_precisions

    assert "tiny" in EMITTERS and all_precisions() == ("fp32", "fp16", "int8", "int4", "auto", "best", "bf16", "uint8")
    assert decide(tiny_onnx, tmp_path / "plan", ConvertOptions(targets=["tiny"])).target_options("tiny") == tiny_target.TinyOptions()
    out = tmp_path / "out"
    r = cli("convert", tiny_onnx, "--to", "onnx,tiny", "-o", out, "--json")  # the CLI's --to and convert's checks
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    art = next(a for a in report["artifacts"] if a["target"] == "tiny")
    assert art["header"] == "tiny" and (out / "model.tiny").is_file()
    assert any(p["hop"].endswith("tiny") or "tiny" in p["hop"] for p in report["parity"]), report["parity"]
    report = convert(tiny_onnx, tmp_path / "opts", ConvertOptions(targets=["tiny"], target_options={"tiny": tiny_target.TinyOptions("own")}))
    assert next(a for a in report["artifacts"] if a["target"] == "tiny")["header"] == "own"
    assert validate_models(out / "model.onnx", out / "model.tiny")["status"] == "ok"
    assert inspect(out / "model.tiny")["format"] == "tiny"
    assert next(t for t in doctor()["targets"] if t["name"] == "tiny")["ready"] is True
    with pytest.raises(BadInputError, match="the tiny target takes --precision fp32, fp16, not int8"):
        convert(tiny_onnx, tmp_path / "int8", ConvertOptions(targets=["tiny"], precision="int8"))
    assert not (tmp_path / "int8").exists()
    from modelport.packaging.bundle import conventional, target_kinds

    assert conventional()["tiny"] == "model.tiny" and target_kinds()["tiny"] == "tiny"


def test_a_target_taken_out_is_gone_everywhere(tiny_onnx):
    from modelport.orchestration.validate import KINDS
    from modelport.registry import EMITTERS

    with targets.registered(tiny_target.TINY):
        assert "tiny" in EMITTERS and KINDS.suffixes[".tiny"] == "tiny"
    assert "tiny" not in EMITTERS and ".tiny" not in KINDS.suffixes and "tiny" not in targets.TARGETS


def _ir(kind):
    return SimpleNamespace(source=SimpleNamespace(kind=kind))


def test_a_native_only_target_takes_its_native_route():
    from modelport.emitters.routes import plan

    with targets.registered(tiny_target.NATIVE):
        p = plan(_ir("onnx"), "tiny-native", "auto", None, None)
        assert [r.name for r in p.routes] == ["native"] and p.routes[0].emitter is tiny_target
        with pytest.raises(BadInputError) as e:
            plan(_ir("keras"), "tiny-native", "auto", None, None)
        assert e.value.exit_code == 2 and "tiny-native is reached from onnx sources only" in e.value.message
        with pytest.raises(BadInputError, match="has no ONNX route"):
            plan(_ir("onnx"), "tiny-native", "onnx", None, None)


def test_a_precision_no_target_takes_is_refused_before_work(tiny_onnx, tmp_path):
    from modelport.orchestration import ConvertOptions, convert

    with pytest.raises(BadInputError, match="the savedmodel target is fp32 only, not fp16"):
        convert(tiny_onnx, tmp_path / "o", ConvertOptions(targets=["savedmodel"], precision="fp16"))
    assert not (tmp_path / "o").exists()


def test_target_options_modules_are_light():
    """A target's options class sits in a module the command line imports to build its flags: it
    imports neither numpy nor a framework."""
    import json
    import subprocess
    import sys

    modules = sorted({t.options.partition(":")[0] for t in targets.TARGETS.values() if t.options})
    code = ("import importlib, json, sys; [importlib.import_module(m) for m in sys.argv[1:]]; "
            "print(json.dumps([m for m in ('numpy', 'torch', 'tensorflow', 'onnx', 'openvino') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, check=True)
    assert modules and json.loads(out.stdout) == []


@pytest.fixture
def board():
    with targets.registered(tiny_target.TINY_BOARD) as t:
        yield t


def test_a_target_whose_runtime_cannot_run_here_goes_through_every_command(board, tiny_onnx, tmp_path, cli):
    """The board's runner declares `cannot_run()`: convert writes the artifact, checks its inputs and
    outputs against the contract without running it, says so (validated false, a warning) and exits 0,
    or 4 under --strict with nothing written; validate compares it with the ONNX model it came from
    the same way; inspect reads it; doctor says it builds here but runs elsewhere."""
    from modelport.orchestration.doctor import doctor

    out = tmp_path / "out"
    r = cli("convert", tiny_onnx, "--to", "onnx,tiny-board", "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    art = next(a for a in report["artifacts"] if a["target"] == "tiny-board")
    assert art["validated"] is False and art["not_validated"] == tiny_target.CANNOT_RUN
    assert art["contract_check"]["inputs"] == "names, dtypes and ranks as the contract's"
    assert art["validated_with"]["process"] == "child"  # read where a user of it would read it, by its runner alone
    assert any("tiny-board: the artifact is not validated here" in w for w in report["warnings"])
    assert [p["hop"] for p in report["parity"] if "tiny-board" in p["hop"]] == []  # nothing of it was run
    assert (out / "model.board").is_file()

    strict = cli("convert", tiny_onnx, "--to", "tiny-board", "-o", tmp_path / "strict", "--strict")
    assert strict.exit_code == 4 and "--strict: every artifact must be validated" in strict.stderr
    assert not (tmp_path / "strict").exists()

    v = cli("validate", out / "model.onnx", out / "model.board", "--json")
    assert v.exit_code == 0, v.stderr
    side = v.json()["b"]
    assert side["validated"] is False and side["not_validated"] == tiny_target.CANNOT_RUN
    assert cli("validate", out / "model.onnx", out / "model.board", "--strict").exit_code == 4

    info = cli("inspect", out / "model.board", "--json")
    assert info.exit_code == 0 and info.json()["format"] == "board" and info.json()["inputs"][0]["name"] == "x"

    entry = next(t for t in doctor()["targets"] if t["name"] == "tiny-board")
    assert entry["ready"] is True and entry["runs_here"] is False and tiny_target.CANNOT_RUN in entry["note"]


def test_a_target_s_flags_come_from_its_options_class(tiny_onnx, tmp_path):
    """A command line built with `tiny` registered has its `--tiny-header` flag, from TinyOptions' declaration."""
    import subprocess
    import sys

    code = ("import sys; from modelport import targets; from tests import tiny_target; targets.register(tiny_target.TINY); "
            "from modelport.cli import main; sys.argv[0] = 'modelport'; main()")
    out = tmp_path / "flagged"
    r = subprocess.run([sys.executable, "-c", code, "convert", str(tiny_onnx), "--to", "tiny", "--tiny-header", "board",
                        "-o", str(out), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert next(a for a in json.loads(r.stdout)["artifacts"] if a["target"] == "tiny")["header"] == "board"
