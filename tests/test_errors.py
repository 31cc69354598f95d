"""Errors carry their payload from construction: `str(e) == e.message` whatever path raised them."""

from __future__ import annotations

import pickle

import pytest

from modelport.errors import BadInputError, ModelportError, PassError, StageError, UnsupportedError, ValidationError, one_line


def test_fields_are_fixed_at_construction():
    err = ValidationError("parity failed", path="m.onnx", parity={"ok": False}, rows=["row"])
    for name, value in (("reason", "other"), ("report", {}), ("rows", []), ("parity", None), ("exit_code", 0)):
        with pytest.raises(AttributeError, match="fixed at construction"):
            setattr(err, name, value)
    assert str(err) == err.message == "m.onnx: parity failed" and err.rows == ["row"]


def test_with_reason_and_with_report_make_new_errors_of_the_same_class():
    cause = RuntimeError("boom")
    err = StageError("emit:onnx", ["parse"], cause)
    renamed = err.with_reason("emit failed")
    assert type(renamed) is StageError and renamed.stage == "emit:onnx" and renamed.before == ["parse"]
    assert str(renamed) == renamed.message == "emit failed" and str(err) == err.message != renamed.message
    reported = err.with_report({"status": "failed"})
    assert reported.report == {"status": "failed"} and err.report is None and str(reported) == err.message
    unsupported = UnsupportedError("3 nodes", hint="TFLite", preflight={"ok": False}).with_reason("4 nodes")
    assert unsupported.preflight == {"ok": False} and unsupported.message == "4 nodes (TFLite)" == str(unsupported)
    back = pickle.loads(pickle.dumps(PassError("fold", ["shape"], "mutated the model it was given")))
    assert back.pass_name == "fold" and str(back) == back.message and "pass 'fold' mutated" in back.message


def _pair(tiny_onnx):
    """tiny_onnx with named nodes, and a copy with other weights: a validate mismatch whose first
    diverging node is the MatMul."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(tiny_onnx))
    for i, node in enumerate(model.graph.node):
        node.name = f"{node.op_type.lower()}_{i}"
    a, b = tiny_onnx.parent / "a.onnx", tiny_onnx.parent / "b.onnx"
    onnx.save(model, str(a))
    w = model.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 3 + 1, w.name))
    onnx.save(model, str(b))
    return a, b


def _validate_localized(tiny_onnx, tmp_path):
    from modelport.orchestration.validate import validate_models

    validate_models(*_pair(tiny_onnx), localize=True)


def _convert_fp16_undeliverable(tiny_onnx, tmp_path):
    import modelport

    modelport.convert(tiny_onnx, tmp_path / "o", targets="ort", precision="fp16", atol=1e-9, rtol=0)


def _optimize_strict_precision(tiny_onnx, tmp_path):
    import modelport

    modelport.convert(tiny_onnx, tmp_path / "o", optimize="none", precision="fp16", atol=1e-9, rtol=0, command="optimize")


def _package_unknown_system(tiny_onnx, tmp_path):
    from modelport.orchestration.package import package

    package(tiny_onnx, tmp_path / "p", "nginx")


def _convert_missing_file(tiny_onnx, tmp_path):
    import modelport

    modelport.convert(tiny_onnx.parent / "missing.onnx", tmp_path / "o")


PATHS = {  # the commands' failure paths: (the call, the error class, words of the message)
    "validate --localize": (_validate_localized, ValidationError, "; first diverging node: matmul_0 (MatMul, tensor 'mm')"),
    "convert --precision fp16": (_convert_fp16_undeliverable, ValidationError, "--precision fp16 cannot be delivered within tolerance: pass 'fp16'"),
    "optimize --precision fp16": (_optimize_strict_precision, ValidationError, "--precision fp16 cannot be delivered"),
    "package --for nginx": (_package_unknown_system, BadInputError, "unknown serving system 'nginx'"),
    "convert missing.onnx": (_convert_missing_file, BadInputError, "missing.onnx"),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_errors_raised_through_the_commands_say_what_they_hold(tiny_onnx, tmp_path, path):
    """`str(e)`, `e.message` and the report's error agree (the reason was once edited after construction)."""
    call, cls, words = PATHS[path]
    with pytest.raises(ModelportError) as e:
        call(tiny_onnx, tmp_path)
    err = e.value
    assert type(err) is cls and words in err.message, err.message
    assert str(err) == err.message
    assert err.report is not None and err.report["error"]["message"] == err.message
    assert err.report["exit_code"] == err.exit_code and err.report["status"] == "failed"


def test_one_line_is_the_first_non_empty_line_folded_and_cut():
    assert one_line("\n  first   line \nsecond") == "first line"
    assert one_line("x" * 30, 10) == "x" * 9 + "…" and one_line("") == ""


def test_one_line_of_an_exception_falls_back_to_and_may_lead_with_its_class_name():
    assert one_line(ValueError("bad shape\n  at line 3")) == "bad shape"
    assert one_line(ValueError()) == "ValueError" and one_line(KeyError("")) == "''"
    assert one_line(ValueError("bad shape"), typed=True) == "ValueError: bad shape"
    assert one_line(RuntimeError("  \n"), typed=True) == "RuntimeError"
    assert one_line(ValueError("y" * 30), 10, typed=True) == "ValueError: " + "y" * 9 + "…"
