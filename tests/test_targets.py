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
    from modelport.orchestration.validate import validate_models
    from modelport.registry import EMITTERS

    assert "tiny" in EMITTERS and targets.all_precisions() == ("fp32", "fp16", "int8", "best", "bf16", "uint8")
    assert ConvertOptions(targets=["tiny"]).emitter_options("tiny") == tiny_target.TinyOptions()
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
    from modelport.serving.bundle import conventional, target_kinds

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


def test_options_classes_are_the_emitters_own():
    """A descriptor's options class is the one its emitter module declares as OPTIONS."""
    for t in targets.TARGETS.values():
        if t.options:
            assert targets.load(t.options) is targets.load(t.emitter).OPTIONS, t.name
