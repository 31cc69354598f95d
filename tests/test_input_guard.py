"""The CLI fixtures' input guard: which files count as inputs, and that a touched one fails the test."""

from __future__ import annotations

import pytest

from tests.conftest import InputGuard


@pytest.fixture
def layout(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for name in ("model.onnx", "model.onnx.data", "sub/extra.bin"):
        (src / name).write_bytes(name.encode())
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("{}")
    return src, out


def test_inputs_are_named_paths_and_their_siblings_not_outputs(layout):
    src, out = layout
    guard = InputGuard(["convert", str(src / "model.onnx"), "--input", "x:batch,8", "-o", str(out)])
    assert sorted(p.name for p in guard.before) == ["model.onnx", "model.onnx.data"]
    guard = InputGuard(["package", str(src), f"--output-dir={out}"])
    assert sorted(p.name for p in guard.before) == ["extra.bin", "model.onnx", "model.onnx.data"]
    guard = InputGuard(["convert", str(src / "model.onnx"), "-o", str(src / "sub")])  # an output inside the input's folder
    assert sorted(p.name for p in guard.before) == ["model.onnx", "model.onnx.data"]


@pytest.mark.parametrize("touch", ["rewrite", "remove"])
def test_a_touched_input_fails_naming_the_file(layout, touch):
    src, out = layout
    guard = InputGuard(["convert", str(src / "model.onnx"), "-o", str(out)])
    (out / "report.json").write_text("replaced")  # outputs may change
    guard.check()
    data = src / "model.onnx.data"
    if touch == "rewrite":
        data.write_bytes(b"simplified")
    else:
        data.unlink()
    word = {"rewrite": "changed", "remove": "removed"}[touch]
    with pytest.raises(pytest.fail.Exception, match=rf"touched its inputs: {data} \({word}\)"):
        guard.check()
