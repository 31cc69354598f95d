"""Image-folder calibration for static INT8: real image files written by Pillow, checked against an
independent numpy pipeline (Pillow's bilinear filter written out as a triangle filter), its
errors, and the CLI end to end on a small CNN."""

import json

import numpy as np
import pytest
from PIL import Image

from modelport.errors import BadInputError, UnsafeInputError
from modelport.ir import IRModel, Preprocess, TensorSpec
from modelport.optimize.calibration import MAX_IMAGES, load_calibration

H, W = 8, 12  # the model's input size; every image below has another size


def _ir(shape, *, layout=None, pre=None, dtype="float32", sample_dims=None, extra_inputs=()):
    spec = TensorSpec("x", dtype, list(shape), layout=layout, preprocess=pre)
    return IRModel(None, [spec, *extra_inputs], [], sample_dims=dict(sample_dims or {}))


def _triangle_weights(n_in: int, n_out: int) -> np.ndarray:
    """Bilinear (triangle) filter weights with pixel-centre alignment, widened when shrinking."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    centres = (np.arange(n_out) + 0.5) * scale
    w = np.clip(1 - np.abs(np.arange(n_in)[None, :] + 0.5 - centres[:, None]) / support, 0, None)
    return w / w.sum(axis=1, keepdims=True)


def _expected(pixels: np.ndarray, *, h=H, w=W, scale=1 / 255, mean=None, std=None, bgr=False, layout="NCHW"):
    a = pixels.astype(np.float64)
    a = np.einsum("ij,jkc,lk->ilc", _triangle_weights(a.shape[0], h), a, _triangle_weights(a.shape[1], w))
    if bgr:
        a = a[..., ::-1]
    a = a * scale
    if mean is not None:
        a = a - np.asarray(mean)
    if std is not None:
        a = a / np.asarray(std)
    return (a.transpose(2, 0, 1) if layout == "NCHW" else a)[None]


def _level(scale=1 / 255, std=None):
    """One grey level after preprocessing: Pillow rounds to 8 bits between its two filter passes."""
    return scale / (min(std) if std else 1.0) * 1.0 + 1e-5


def _random_rgb(rng, h, w):
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.fixture
def folder(tmp_path):
    """Three RGB images of other sizes (PNG, BMP lossless; JPEG decoded by Pillow) plus files to ignore."""
    rng = np.random.default_rng(0)
    d = tmp_path / "imgs"
    d.mkdir()
    pixels = {"img_01.bmp": _random_rgb(rng, 20, 30), "img_02.png": _random_rgb(rng, 5, 7),
              "img_10.jpg": _random_rgb(rng, 37, 23)}
    for name, arr in pixels.items():
        Image.fromarray(arr).save(d / name)
    with Image.open(d / "img_10.jpg") as im:
        pixels["img_10.jpg"] = np.asarray(im.convert("RGB"))  # JPEG is lossy: compare with what it decodes to
    (d / "notes.txt").write_text("not an image")
    np.save(d / "data.npy", np.zeros(3))
    (d / "sub.png").mkdir()  # a folder with an image suffix
    (d / "._img_03.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")  # macOS metadata, not an image
    return d, [pixels[k] for k in sorted(pixels)]


@pytest.mark.parametrize("case", [
    dict(),
    dict(layout="NHWC"),
    dict(scale=1.0, mean=[123.7, 116.3, 103.5], std=[58.4, 57.1, 57.4]),
    dict(bgr=True, mean=[0.406, 0.456, 0.485], std=[0.225, 0.224, 0.229]),
    dict(bgr=True, layout="NHWC", scale=2 / 255, mean=[1.0], std=[0.5]),
])
def test_images_match_numpy_preprocessing(folder, case):
    d, pixels = folder
    layout = case.get("layout", "NCHW")
    shape = [1, 3, H, W] if layout == "NCHW" else [1, H, W, 3]
    pre = Preprocess(scale=case.get("scale"), mean=case.get("mean"), std=case.get("std"),
                     channel_order="BGR" if case.get("bgr") else None)
    samples = load_calibration(d, _ir(shape, layout=case.get("layout"), pre=pre))
    assert len(samples) == 3  # sorted: img_01.bmp, img_02.png, img_10.jpg; the other files ignored
    for got, px in zip(samples, pixels, strict=True):
        assert list(got) == ["x"] and got["x"].dtype == np.float32 and got["x"].shape == tuple(shape)
        assert got["x"].flags.c_contiguous
        want = _expected(px, scale=case.get("scale") or 1 / 255, mean=case.get("mean"), std=case.get("std"),
                         bgr=case.get("bgr", False), layout=layout)
        np.testing.assert_allclose(got["x"], want, rtol=0, atol=_level(case.get("scale") or 1 / 255, case.get("std")))


def test_numpy_reference_agrees_with_pillow_without_resize(tmp_path):
    """Same size in and out: no filtering, so the arrays are exact."""
    d = tmp_path / "imgs"
    d.mkdir()
    px = _random_rgb(np.random.default_rng(1), H, W)
    Image.fromarray(px).save(d / "a.png")
    (got,) = load_calibration(d, _ir([1, 3, H, W]))
    np.testing.assert_allclose(got["x"], px.transpose(2, 0, 1)[None] / 255.0, rtol=1e-6, atol=0)


def _constant(mode, size, colour):
    return Image.new(mode, size, colour)


def test_image_modes_are_expanded_to_rgb(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    _constant("L", (9, 4), 77).save(d / "a_gray.png")
    _constant("RGBA", (13, 6), (10, 200, 30, 0)).save(d / "b_rgba.png")  # alpha dropped, colour kept
    pal = Image.new("P", (5, 5), 1)
    pal.putpalette([0, 0, 0, 40, 90, 250] + [0] * 762)
    pal.save(d / "c_palette.png")
    _constant("LA", (6, 6), (150, 20)).save(d / "d_gray_alpha.png")
    _constant("1", (7, 3), 1).save(d / "e_bilevel.bmp")
    samples = load_calibration(d, _ir([1, 3, H, W]))
    want = [(77, 77, 77), (10, 200, 30), (40, 90, 250), (150, 150, 150), (255, 255, 255)]
    assert len(samples) == len(want)
    for got, rgb in zip(samples, want, strict=True):
        np.testing.assert_allclose(got["x"], np.broadcast_to(np.asarray(rgb, np.float32)[None, :, None, None] / 255,
                                                             (1, 3, H, W)), rtol=1e-6)


def test_one_channel_input_reads_grayscale(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    _constant("RGB", (10, 10), (200, 100, 50)).save(d / "a.png")
    _constant("L", (3, 3), 9).save(d / "b.png")
    a, b = load_calibration(d, _ir([1, 1, H, W], pre=Preprocess(mean=[0.5], channel_order="BGR")))
    assert a["x"].shape == (1, 1, H, W)
    luma = (200 * 299 + 100 * 587 + 50 * 114) / 1000  # ITU-R 601-2, as Pillow's "L" conversion
    np.testing.assert_allclose(a["x"], np.full((1, 1, H, W), luma / 255 - 0.5), atol=_level())
    np.testing.assert_allclose(b["x"], np.full((1, 1, H, W), 9 / 255 - 0.5), rtol=1e-6)


def test_at_most_max_images_in_sorted_order(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    n = MAX_IMAGES + 4
    for i in range(n):  # the colour encodes the index: R = i % 256, G = i // 256
        _constant("RGB", (2, 3), (i % 256, i // 256, 0)).save(d / f"im{i:04d}.png")
    samples = load_calibration(d, _ir([1, 3, 4, 4]))
    assert len(samples) == MAX_IMAGES == 256
    index = [int(round(s["x"][0, 0, 0, 0] * 255 + s["x"][0, 1, 0, 0] * 255 * 256)) for s in samples]
    assert index == list(range(MAX_IMAGES))


def test_fixed_batch_stacks_images_and_dynamic_batch_is_one(folder):
    d, pixels = folder
    (pair,) = load_calibration(d, _ir([2, 3, H, W]))  # three images, batch 2: the third is left out
    assert pair["x"].shape == (2, 3, H, W)
    np.testing.assert_allclose(pair["x"], np.concatenate([_expected(p) for p in pixels[:2]]), atol=_level())
    dyn = load_calibration(d, _ir(["N", 3, H, W], sample_dims={"N": 4}))
    assert [s["x"].shape for s in dyn] == [(1, 3, H, W)] * 3
    with pytest.raises(BadInputError, match="fixed batch of 4") as e:
        load_calibration(d, _ir([4, 3, H, W]))
    assert e.value.path == str(d)


def test_dynamic_height_width_need_sizes(folder):
    d, pixels = folder
    ir = _ir(["N", 3, "height", "width"])
    with pytest.raises(BadInputError, match="dynamic height") as e:
        load_calibration(d, ir)
    assert e.value.path == str(d) and "--dim height=" in e.value.hint
    sized = load_calibration(d, _ir(["N", 3, "height", "width"], sample_dims={"height": 6, "width": 5}))
    assert sized[0]["x"].shape == (1, 3, 6, 5)
    np.testing.assert_allclose(sized[0]["x"], _expected(pixels[0], h=6, w=5), atol=_level())
    nhwc = load_calibration(d, _ir([1, "h", "w", 3], layout="NHWC", sample_dims={"h": 7, "w": 9}))
    assert nhwc[0]["x"].shape == (1, 7, 9, 3)


@pytest.mark.parametrize("dtype, want", [("float16", np.float16), ("float64", np.float64), ("bfloat16", np.float32)])
def test_dtype_follows_the_input(folder, dtype, want):
    d, pixels = folder
    samples = load_calibration(d, _ir([1, 3, H, W], dtype=dtype))
    assert all(s["x"].dtype == want for s in samples)
    np.testing.assert_allclose(samples[0]["x"].astype(np.float64), _expected(pixels[0]), atol=2e-3 + _level())


@pytest.mark.parametrize("ir, match", [
    (_ir([1, 3, H, W], extra_inputs=[TensorSpec("mask", "float32", [1, 3, H, W])]), "one 4-D float input"),
    (_ir([1, 3 * H * W]), "one 4-D float input"),
    (_ir([1, 3, H, W], dtype="int64"), "one 4-D float input"),
    (_ir([1, 3, H, W], layout="NCDHW"), "NCHW or NHWC"),
    (_ir([1, 2, H, W], layout="NCHW"), "1 or 3 channels"),
    (_ir([1, 3, H, W], pre=Preprocess(mean=[0.1, 0.2])), "mean has 2 values"),
    (_ir([1, 3, H, W], pre=Preprocess(std=[1, 2, 3, 4])), "std has 4 values"),
])
def test_unsuitable_models_are_bad_input_naming_the_folder(folder, ir, match):
    d, _ = folder
    with pytest.raises(BadInputError, match=match) as e:
        load_calibration(d, ir)
    assert e.value.path == str(d)


def test_empty_folder_and_missing_source(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "readme.md").write_text("no images here")
    with pytest.raises(BadInputError, match="no images") as e:
        load_calibration(d, _ir([1, 3, H, W]))
    assert e.value.path == str(d)
    with pytest.raises(BadInputError, match="an .npz file or a folder of images") as e:
        load_calibration(tmp_path / "missing", _ir([1, 3, H, W]))
    assert e.value.path == str(tmp_path / "missing")


def _write_truncated(path):
    Image.fromarray(_random_rgb(np.random.default_rng(2), 64, 64)).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("name, write, match", [
    ("b.png", lambda p: p.write_bytes(b"this is not a PNG"), "cannot read calibration image"),
    ("b.jpg", lambda p: p.write_bytes(b""), "cannot read calibration image"),
    ("b.png", _write_truncated, "cannot read calibration image"),
    ("b.png", lambda p: Image.fromarray(np.array([[0, 1000], [65535, 7]], np.uint16)).save(p), "16-bit or float"),
])
def test_unreadable_image_is_bad_input_naming_the_file(tmp_path, name, write, match):
    d = tmp_path / "imgs"
    d.mkdir()
    _constant("RGB", (4, 4), (1, 2, 3)).save(d / "a.png")
    write(d / name)
    with pytest.raises(BadInputError, match=match) as e:
        load_calibration(d, _ir([1, 3, H, W]))
    assert e.value.path == str(d / name)


def test_decompression_bomb_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "imgs"
    d.mkdir()
    _constant("RGB", (40, 40), (1, 2, 3)).save(d / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 1600 pixels is over twice the limit
    with pytest.raises(UnsafeInputError) as e:
        load_calibration(d, _ir([1, 3, H, W]))
    assert e.value.path == str(d / "big.png")


# -- end to end: `modelport optimize --precision int8 --calibration FOLDER` ---------------------------------


def _cnn_onnx(path, *, shape, contract=None):
    """Conv(3->8, 3x3) + Relu + GlobalAveragePool + Flatten + Gemm(8->4), saved to `path`."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "cw"),
             numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "cb"),
             numpy_helper.from_array((rng.standard_normal((4, 8)) * 0.5).astype(np.float32), "gw"),
             numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype(np.float32), "gb")]
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1, name="fc")]
    batch = shape[0]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [batch, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if contract:
        entry = model.metadata_props.add()
        entry.key, entry.value = "modelport.contract", json.dumps(contract)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def calib_images(tmp_path_factory):
    """Twelve images of assorted sizes and formats; the first is half black, half white, so the
    preprocessed calibration range is exactly [(0 - mean) / std, (1 - mean) / std]."""
    d = tmp_path_factory.mktemp("calib") / "imgs"
    d.mkdir()
    rng = np.random.default_rng(11)
    split = np.zeros((40, 50, 3), np.uint8)
    split[20:] = 255
    Image.fromarray(split).save(d / "im00.png")
    for i in range(1, 10):
        h, w = int(rng.integers(10, 60)), int(rng.integers(10, 60))
        # smooth images (like photos) rather than noise
        base = rng.integers(0, 256, (2, 2, 3)).astype(np.uint8)
        img = Image.fromarray(base).resize((w, h), Image.BILINEAR)
        img.save(d / f"im{i:02d}.{['png', 'jpg', 'bmp'][i % 3]}")
    # whole black and white frames: validation judges them (structured samples), so calibration covers them
    for i, value in ((10, 0), (11, 255)):
        Image.fromarray(np.full((24, 24, 3), value, np.uint8)).save(d / f"im{i:02d}.png")
    (d / "labels.csv").write_text("im00,0\n")
    return d


def _input_scale(model_path):
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(model_path))
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    return float(inits[q.input[1]])


def test_cli_int8_static_from_image_folder(cli, calib_images, tmp_path):
    contract = {"inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 16, 16], "layout": "NCHW",
                            "preprocess": {"scale": None, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                                           "channel_order": "BGR"},
                            "value_range": [-1.0, 1.0]}],
                "outputs": [], "sample_dims": {}}
    model = _cnn_onnx(tmp_path / "cnn.onnx", shape=[1, 3, 16, 16], contract=contract)
    out = tmp_path / "out"
    r = cli("optimize", model, "-o", out, "--precision", "int8", "--calibration", calib_images, "--json")
    assert r.exit_code == 0, r
    rep = json.loads((out / "report.json").read_text())
    row = next(s for s in rep["stages"] if s.get("pass") == "int8-static")
    assert row["status"] == "applied"
    assert row["details"]["calibration"] == {"samples": 12, "method": "minmax"}
    assert row["details"]["parity_ok"] is True and row["details"]["kept_fp32"] == []
    assert all(o["cosine"] >= 0.98 for o in row["parity"]["outputs"])
    assert rep["artifacts"][0]["precision"] == "int8"
    import onnx

    ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    # the input was calibrated on the preprocessed images: range [-1, 1] -> scale 2/255
    assert _input_scale(out / "model.onnx") == pytest.approx(2 / 255, rel=1e-5)


def test_cli_preprocessing_flags_reach_image_calibration(cli, calib_images, tmp_path):
    """A plain ONNX file (no contract): --mean/--std/--channel-order on `optimize` are what the
    images are normalised with; without them the range is [0, 1] (scale 1/255)."""
    model = _cnn_onnx(tmp_path / "cnn.onnx", shape=[1, 3, 16, 16])
    out = tmp_path / "flags"
    r = cli("optimize", model, "-o", out, "--precision", "int8", "--calibration", calib_images,
            "--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5", "--channel-order", "BGR", "--json")
    assert r.exit_code == 0, r
    assert _input_scale(out / "model.onnx") == pytest.approx(2 / 255, rel=1e-5)
    plain = tmp_path / "plain"
    assert cli("optimize", model, "-o", plain, "--precision", "int8", "--calibration", calib_images, "--json").exit_code == 0
    assert _input_scale(plain / "model.onnx") == pytest.approx(1 / 255, rel=1e-5)
    # judged on the calibration images (range [0, 1]), not on standard-normal samples it was never
    # calibrated for: every node stays quantised
    row = next(s for s in json.loads((plain / "report.json").read_text())["stages"] if s.get("pass") == "int8-static")
    assert row["status"] == "applied" and row["details"]["kept_fp32"] == []
    assert row["details"]["checked_on"] == "1 calibration row against the FP32 model"


def test_cli_dynamic_height_width_needs_dims(cli, calib_images, tmp_path):
    model = _cnn_onnx(tmp_path / "cnn.onnx", shape=["N", 3, "H", "W"])
    r = cli("optimize", model, "-o", tmp_path / "bad", "--precision", "int8", "--calibration", calib_images, "--json")
    assert r.exit_code == 2, r
    err = r.json()["error"]
    assert err["path"] == str(calib_images) and "dynamic height ('H')" in err["message"]
    assert "--dim H=SIZE" in err["message"] and not (tmp_path / "bad").exists()
    ok = cli("optimize", model, "-o", tmp_path / "ok", "--precision", "int8", "--calibration", calib_images,
             "--dim", "H=12", "--dim", "W=20", "--json")
    assert ok.exit_code == 0, ok
    row = next(s for s in ok.json()["stages"] if s.get("pass") == "int8-static")
    assert row["status"] == "applied" and row["details"]["calibration"]["samples"] == 12


def test_cli_calibration_errors_exit_2_naming_the_path(cli, tmp_path):
    model = _cnn_onnx(tmp_path / "cnn.onnx", shape=[1, 3, 16, 16])
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("optimize", model, "-o", tmp_path / "o1", "--precision", "int8", "--calibration", empty, "--json")
    assert r.exit_code == 2 and r.json()["error"]["path"] == str(empty), r
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated jpeg")
    r = cli("optimize", model, "-o", tmp_path / "o2", "--precision", "int8", "--calibration", broken, "--json")
    assert r.exit_code == 2 and r.json()["error"]["path"] == str(broken / "a.jpg"), r
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
