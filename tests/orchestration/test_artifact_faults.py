"""An artifact modelport wrote that its own runtime then fails on, hangs on or crashes on is a
conversion that failed its own check (exit 4), not bad input (exit 2): the runtime's message in
one line of at most 200 characters, the whole of it in report.json. A converter's page of
internals is cut the same way, and `--dim` is suggested only where a shape was the trouble."""

from __future__ import annotations

import pytest

from modelport import targets
from modelport.errors import SHORT, UnsupportedError
from tests import tiny_target


@pytest.fixture
def faulty(monkeypatch):
    with targets.registered(tiny_target.TINY_FAULTY) as t:
        yield t


def _error_line(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    return line


def test_a_runtime_failing_on_our_artifact_is_exit_4_in_one_short_line(faulty, tiny_onnx, tmp_path, cli):
    out = tmp_path / "out"
    r = cli("convert", tiny_onnx, "--to", "tiny-faulty", "-o", out, "--json")
    assert r.exit_code == 4, r.stderr  # it was 2 ("the onnxruntime runtime failed: ..."), as for a user's bad file
    line = _error_line(r.stderr)
    assert "the onnxruntime runtime failed on the artifact modelport wrote: onnxruntime cannot load the model" in line
    reason = r.json()["error"]["message"].split(": ", 1)[1]  # after the path
    assert len(reason.split(" (")[0]) <= SHORT + len("the onnxruntime runtime failed on the artifact modelport wrote: ")
    assert "onnxruntime cannot load the model" in r.json()["error"]["detail"]
    assert not out.exists()


def test_a_runtime_that_does_not_finish_on_our_artifact_is_exit_4(tiny_onnx, tmp_path, cli, monkeypatch):
    monkeypatch.setenv("MODELPORT_CHILD_TIMEOUT", "0.001")  # one sample set: the child gets 0.001 s in all
    r = cli("convert", tiny_onnx, "--to", "onnx", "-o", tmp_path / "out", "--samples", "1", "--no-structured-samples")
    assert r.exit_code == 4, r.stderr  # it was 2, "(corrupt or hostile file?)"
    line = _error_line(r.stderr)
    assert "did not finish within 0.001 s on the artifact modelport wrote" in line and "hostile" not in line
    assert "MODELPORT_CHILD_TIMEOUT=<seconds>" in line


def test_a_converter_s_page_of_internals_is_one_line_with_the_rest_in_the_report(faulty, tiny_onnx, tmp_path, cli, monkeypatch):
    monkeypatch.setattr(tiny_target.Faulty, "mode", "verbose")
    r = cli("convert", tiny_onnx, "--to", "tiny-faulty", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 2, r.stderr  # the converter refused the model: bad input, as before
    line = _error_line(r.stderr)
    assert line.endswith("the converter failed: tensor 'x' cannot be lowered") and len(line) < 400  # was 1,800 characters
    assert "internals_39.py" in r.json()["error"]["detail"]


def test_dim_is_suggested_only_where_a_shape_is_the_trouble(monkeypatch, tmp_path):
    """onnx2tf's failure on a model with dynamic dims names --dim only when it is about a shape."""
    import numpy as np

    from modelport.emitters import tf_model
    from modelport.ir import IRModel, Reference, TensorSpec

    ir = IRModel(model=None, inputs=[TensorSpec("x", "float32", ["batch", 3, "h", "w"])], outputs=[],
                 reference=Reference({"x": np.zeros((1, 3, 8, 8), np.float32)}, {}))
    for reason, suggested in (("Unsupported operator: GridSample", False), ("cannot broadcast shape [1, 3] to [1, 4]", True)):
        def fail(*args, reason=reason, **kwargs):
            raise UnsupportedError(reason)

        monkeypatch.setattr(tf_model, "onnx2tf_model", fail)
        monkeypatch.setattr(tf_model, "_lowered", lambda *args: UnsupportedError("no TensorFlow form for GridSample"))
        with pytest.raises(UnsupportedError) as e:
            tf_model.build(ir, tmp_path, tmp_path / "log")
        # in the hint, which is never cut: the converter's reason may be shortened to one line
        assert ("--dim NAME=N" in (e.value.hint or "")) is suggested, e.value.message
        assert "modelport's ONNX lowering could not either: no TensorFlow form for GridSample" in e.value.hint
        assert e.value.reason == reason
