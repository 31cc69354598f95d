"""Darknet sources: a yolov3-tiny-shaped cfg and seeded weights written here, converted to every
CPU target with parity against OpenCV DNN, and the refusals (untranslated sections, truncated
weights, paths in the cfg)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from modelport.errors import BadInputError
from modelport.parsers import SourceSpec, detect
from modelport.parsers.darknet import parse
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

ANCHORS = "10,14, 23,27, 37,58, 81,82, 135,169, 344,319"
# yolov3-tiny scaled down: 64x64, 2 classes, maxpool size=2 stride=1, route, upsample, two heads
TINY = f"""[net]
batch=1
width=64
height=64
channels=3

[convolutional]
batch_normalize=1
filters=8
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=1

[convolutional]
batch_normalize=1
filters=32
size=3
stride=1
pad=1
activation=leaky

[convolutional]
size=1
stride=1
pad=1
filters=21
activation=linear

[yolo]
mask = 3,4,5
anchors = {ANCHORS}
classes=2
num=6

[route]
layers = -4

[convolutional]
batch_normalize=1
filters=8
size=1
stride=1
pad=1
activation=leaky

[upsample]
stride=2

[route]
layers = -1, 2

[convolutional]
size=1
stride=1
pad=1
filters=21
activation=linear

[yolo]
mask = 0,1,2
anchors = {ANCHORS}
classes=2
num=6
"""


def sections(cfg: str) -> list[tuple[str, dict[str, str]]]:
    out = []
    for line in cfg.splitlines():
        line = line.strip()
        if line.startswith("["):
            out.append((line[1:-1], {}))
        elif "=" in line:
            key, value = line.split("=", 1)
            out[-1][1][key.strip()] = value.strip()
    return out


def weights_for(cfg: str, seed: int = 0) -> bytes:
    """A version 0.2 weights file for `cfg`: small seeded weights (activations stay near zero, so
    the yolo decode's exp and sigmoids are well conditioned and class scores stay clear of `thresh`)."""
    rng = np.random.default_rng(seed)
    (_, net), *layers = sections(cfg)
    shapes, channels, floats = [], int(net["channels"]), []
    for i, (kind, o) in enumerate(layers):
        if kind == "convolutional":
            filters, size = int(o["filters"]), int(o["size"])
            floats.append(rng.uniform(-0.1, 0.1, filters))
            if o.get("batch_normalize") == "1":
                floats += [rng.uniform(0.5, 1.5, filters), rng.uniform(-0.1, 0.1, filters), rng.uniform(0.5, 1.5, filters)]
            fan = channels * size * size
            floats.append(rng.standard_normal(filters * fan) * 0.3 / np.sqrt(fan))
            channels = filters
        elif kind == "route":
            refs = [int(r) for r in o["layers"].split(",")]
            channels = sum(shapes[r if r >= 0 else r + i] for r in refs)
        shapes.append(channels)
    return struct.pack("<3iq", 0, 2, 5, 0) + np.concatenate(floats).astype("<f4").tobytes()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("darknet")
    (d / "yolo.cfg").write_text(TINY)
    (d / "yolo.weights").write_bytes(weights_for(TINY))
    return d


def _files(d):
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


def test_sniff(tiny, tmp_path):
    assert detect(tiny / "yolo.cfg") == "darknet"
    other = tmp_path / "setup.cfg"
    other.write_text("[metadata]\nname = x\n")
    with pytest.raises(BadInputError):
        detect(other)


def test_convert_every_target_against_opencv(cli, tiny, tmp_path):
    """MMdnn's form: -in cfg -iw weights, to four targets in one run, each validated against OpenCV."""
    before = _files(tiny)
    out = tmp_path / "out"
    r = cli("convert", "-in", tiny / "yolo.cfg", "-iw", tiny / "yolo.weights", "--to", "onnx,tflite,openvino,executorch",
            "-o", out, "--json")
    assert r.exit_code == 0, r
    report = json.loads((out / "report.json").read_text())
    (spec,) = report["contract"]["inputs"]
    assert spec["name"] == "data" and spec["shape"] == ["batch", 3, 64, 64] and spec["layout"] == "NCHW"
    assert spec["value_range"] == [0.0, 1.0]
    assert [(o["name"], o["shape"]) for o in report["contract"]["outputs"]] == [
        ("yolo_8", ["batch", 16 * 16 * 3, 7]), ("yolo_14", ["batch", 32 * 32 * 3, 7])]
    assert report["source"]["framework"] == "darknet"
    arts = {a["target"]: a for a in report["artifacts"]}
    assert sorted(arts) == ["executorch", "onnx", "openvino", "tflite"]
    assert all(a.get("validated_with") and "not_validated" not in a for a in arts.values()), arts
    ended = {p["hop"]: p["ok"] for p in report["parity"] if p["hop"].endswith("(end to end)")}
    assert ended == {f"darknet→{t} (end to end)": True for t in arts}, report["parity"]
    assert all(p["ok"] for p in report["parity"])
    assert _files(tiny) == before


def test_references_are_opencvs_and_the_onnx_graph_matches_them(tiny):
    """The reference outputs are OpenCV's (decoded boxes in [0, 1] units, scores away from 0 and
    `thresh`), and the translated graph gives them on every sample set."""
    ir = parse(tiny / "yolo.cfg", SourceSpec(path=tiny / "yolo.cfg"))
    assert ir.reference.producer.startswith("opencv ")
    runner = OnnxRuntimeRunner(ir.model)
    for sample in [ir.reference, *ir.reference.extra]:
        got = runner.run(sample.inputs)
        for name, want in sample.outputs.items():
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5)
    scores = ir.reference.outputs["yolo_14"][..., 5:]
    assert scores.min() > 0.2 + 0.01  # every class score clears the default thresh: no flip on rounding
    assert 0 < ir.reference.outputs["yolo_14"][..., 0].min() and ir.reference.outputs["yolo_14"][..., 0].max() < 1


def test_plain_form_finds_weights_beside_and_sf(cli, tiny, tmp_path):
    r = cli("convert", tiny / "yolo.cfg", "-sf", "darknet", "--to", "onnx", "-o", tmp_path / "a", "--json")
    assert r.exit_code == 0, r
    assert r.json()["source"]["framework"] == "darknet"
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "net.cfg").write_text(TINY)
    r = cli("convert", lone / "net.cfg", "--to", "onnx", "-o", tmp_path / "b")
    assert r.exit_code == 2 and "no darknet weights (.weights) found" in r.stderr and "net.weights" in r.stderr, r
    assert not (tmp_path / "b").exists()


def test_untranslated_section_is_named(cli, tmp_path):
    cfg = TINY.replace("[route]\nlayers = -4", "[sam]\nfrom = -2\n\n[route]\nlayers = -5", 1)
    (tmp_path / "sam.cfg").write_text(cfg)
    (tmp_path / "sam.weights").write_bytes(weights_for(TINY))
    r = cli("convert", tmp_path / "sam.cfg", "--to", "onnx", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "layer 9 [sam] has no translation" in r.stderr, r
    assert not (tmp_path / "out").exists()


def test_truncated_weights_name_the_layer_and_tensor(cli, tiny, tmp_path):
    data = weights_for(TINY)
    (tmp_path / "cut.cfg").write_text(TINY)
    # header (20 bytes) + layer 0 (8 biases, 3 x 8 batch norm, 216 weights) + layer 2's biases and norms + 400 floats
    (tmp_path / "cut.weights").write_bytes(data[:20 + 4 * (8 * 4 + 216 + 16 * 4 + 400)])
    r = cli("convert", "-in", tmp_path / "cut.cfg", "-iw", tmp_path / "cut.weights", "--to", "onnx", "-o", tmp_path / "o")
    assert r.exit_code == 2 and "layer 2 [convolutional] weights: 1152 floats expected, 400 left" in r.stderr, r
    assert not (tmp_path / "o").exists()


def test_extra_weights_are_a_warning(tmp_path):
    (tmp_path / "x.cfg").write_text(TINY)
    (tmp_path / "x.weights").write_bytes(weights_for(TINY) + b"\0" * 12)
    ir = parse(tmp_path / "x.cfg", SourceSpec(path=tmp_path / "x.cfg", sampling={"randoms": 1, "structured": False}))
    assert any("3 float32 values left" in w for w in ir.provenance["warnings"])


@pytest.mark.parametrize("line,needle", [("weights_file=/etc/passwd", "'weights_file' names a file"),
                                         ("tree=data/9k.tree", "'tree' names a file"),
                                         ("stride=../../2", "looks like a path")])
def test_cfg_naming_a_path_is_refused(cli, tmp_path, line, needle):
    cfg = TINY.replace("[upsample]\nstride=2", f"[upsample]\n{line}" if line.startswith("stride") else f"[upsample]\nstride=2\n{line}")
    (tmp_path / "p.cfg").write_text(cfg)
    (tmp_path / "p.weights").write_bytes(weights_for(TINY))
    before = _files(tmp_path)
    r = cli("convert", tmp_path / "p.cfg", "--to", "onnx", "-o", tmp_path / "out")
    assert r.exit_code == 3 and needle in r.stderr and "p.cfg" in r.stderr, r  # refused as unsafe
    assert _files(tmp_path) == before and not (tmp_path / "out").exists()


def test_nms_inside_yolo_and_unknown_activation_are_refused(tmp_path):
    for edit, needle in ((("classes=2\nnum=6\n", "classes=2\nnum=6\nnms_threshold=0.45\n"), "nms_threshold=0.45"),
                         (("activation=linear", "activation=hardtan"), "activation=hardtan has no translation")):
        (tmp_path / "m.cfg").write_text(TINY.replace(*edit, 1))
        (tmp_path / "m.weights").write_bytes(weights_for(TINY))
        with pytest.raises(BadInputError, match=needle):
            parse(tmp_path / "m.cfg", SourceSpec(path=tmp_path / "m.cfg"))


def test_an_output_never_replaces_the_weights_found_beside_the_cfg(cli, tmp_path):
    (tmp_path / "w.cfg").write_text(TINY)
    (tmp_path / "w.weights").write_bytes(weights_for(TINY))
    before = _files(tmp_path)
    r = cli("convert", tmp_path / "w.cfg", "--to", "onnx", "-o", tmp_path / "w.weights", "--force")
    assert r.exit_code == 2 and "would overwrite or contain the input" in r.stderr and "w.weights" in r.stderr, r
    assert _files(tmp_path) == before


def test_inspect_reads_the_cfg_alone(cli, tmp_path):
    (tmp_path / "i.cfg").write_text(TINY)  # no weights beside it: inspect does not need them
    r = cli("inspect", tmp_path / "i.cfg", "--json")
    assert r.exit_code == 0, r
    info = r.json()
    assert info["format"] == "darknet cfg" and info["inputs"][0]["shape"] == ["batch", 3, 64, 64]
    assert [o["name"] for o in info["outputs"]] == ["yolo_8", "yolo_14"] and info["ops"]["yolo"] == 2
