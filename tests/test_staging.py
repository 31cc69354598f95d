from __future__ import annotations

import pytest

from modelport.errors import BadInputError
from modelport.staging import check_output, staged_dir


def test_failure_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with staged_dir(out) as stage:
            (stage / "model.onnx").write_bytes(b"half")
            raise RuntimeError("killed mid-write")
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old").write_text("keep")
    with pytest.raises(BadInputError, match="--force"):
        check_output(out)
    with staged_dir(out, force=True) as stage:
        (stage / "new").write_text("x")
    assert sorted(p.name for p in out.iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("relation", ["same", "inside-input-dir", "contains-input"])
def test_output_must_not_touch_inputs(tmp_path, relation):
    src = tmp_path / "src"
    src.mkdir()
    model = src / "m.onnx"
    model.write_bytes(b"x")
    out = {"same": model, "inside-input-dir": src / "out", "contains-input": src}[relation]
    inputs = [src] if relation == "inside-input-dir" else [model]
    with pytest.raises(BadInputError, match="overwrite or contain"):
        check_output(out, inputs, force=True)
