"""Caffe sources: a prototxt and a caffemodel written here with modelport's own schema, translated
to ONNX and validated on every target against OpenCV DNN; the weights found beside the network;
and the refusals (a layer with no translation, a truncated or mismatched caffemodel: exit 2; a
Python layer, a data layer's source path: exit 3, unsafe), each with the files left as they were."""

from __future__ import annotations

import json

import numpy as np
import pytest

from modelport.errors import BadInputError
from modelport.parsers import SourceSpec, detect, parse
from modelport.parsers.caffe_files import truncation
from modelport.parsers.caffe_layers import caffe_pool_size
from modelport.parsers.caffe_schema import NetParameter
from modelport.resolve.specs import parse_input_spec
from tests.conftest import tree

# conv+BN+Scale+ReLU (in place), a ceil-rounded max pooling, a padded ceil-rounded AVE pooling, a
# residual SUM with coefficients, a PROD and a MAX, a Concat, a PReLU, an LRN, a Permute round trip,
# a Power, a Dropout, an InnerProduct and a Softmax; and a TRAIN-only layer left out
CNN = """name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 17 dim: 17 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 1
  weight_filler { type: "xavier" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" batch_norm_param { use_global_stats: true } }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv2a" type: "Convolution" bottom: "pool1" top: "conv2a"
  convolution_param { num_output: 8 kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 group: 2 } }
layer { name: "conv2b" type: "Convolution" bottom: "pool1" top: "conv2b"
  convolution_param { num_output: 8 kernel_size: 3 pad: 2 dilation: 2 bias_term: false } }
layer { name: "sum" type: "Eltwise" bottom: "conv2a" bottom: "conv2b" bottom: "pool1" top: "sum"
  eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 } }
layer { name: "prod" type: "Eltwise" bottom: "conv2a" bottom: "conv2b" top: "prod" eltwise_param { operation: PROD } }
layer { name: "max" type: "Eltwise" bottom: "sum" bottom: "prod" top: "max" eltwise_param { operation: MAX } }
layer { name: "prelu" type: "PReLU" bottom: "max" top: "max" }
layer { name: "lrn" type: "LRN" bottom: "sum" top: "lrn" lrn_param { local_size: 3 alpha: 0.1 beta: 0.75 } }
layer { name: "cat" type: "Concat" bottom: "max" bottom: "lrn" top: "cat" concat_param { axis: 1 } }
layer { name: "perm" type: "Permute" bottom: "cat" top: "perm" permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "back" type: "Permute" bottom: "perm" top: "back" permute_param { order: 0 order: 3 order: 1 order: 2 } }
layer { name: "pow" type: "Power" bottom: "back" top: "back" power_param { power: 2 scale: 0.5 shift: 1 } }
layer { name: "pool2" type: "Pooling" bottom: "back" top: "pool2"
  pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "drop" type: "Dropout" bottom: "pool2" top: "pool2" dropout_param { dropout_ratio: 0.5 } }
layer { name: "train_only" type: "Dropout" bottom: "pool2" top: "pool2" include { phase: TRAIN } }
layer { name: "fc" type: "InnerProduct" bottom: "pool2" top: "fc" inner_product_param { num_output: 10 } }
layer { name: "sig" type: "Sigmoid" bottom: "fc" top: "sig" }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def weights_for(rng) -> dict[str, list[np.ndarray]]:
    def r(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {
        "conv1": [r(8, 3, 3, 3), r(8)],
        "bn1": [r(8), (rng.random(8) + 0.5).astype(np.float32) * 4, np.array([4.0], np.float32)],
        "scale1": [(rng.random(8) + 0.5).astype(np.float32), r(8)],
        "conv2a": [r(8, 4, 3, 1), r(8)],
        "conv2b": [r(8, 8, 3, 3)],
        "prelu": [(rng.random(8) * 0.3).astype(np.float32)],
        "fc": [r(10, 16 * 5 * 5, scale=0.05), r(10)],
    }


def write_caffemodel(path, prototxt: str, blobs: dict[str, list[np.ndarray]]) -> None:
    """A caffemodel as Caffe writes one: the net's layers with their blobs (shape + float data)."""
    from google.protobuf import text_format

    net = NetParameter()
    text_format.Parse(prototxt, net, allow_unknown_field=True)
    for layer in net.layer:
        for value in blobs.get(layer.name, []):
            blob = layer.blobs.add()
            blob.shape.dim.extend(value.shape)
            blob.data.extend(value.ravel().tolist())
    path.write_bytes(net.SerializeToString())


def write_net(folder, prototxt: str = CNN, blobs=None, *, stem: str = "deploy", weights_stem: str | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.prototxt").write_text(prototxt)
    write_caffemodel(folder / f"{weights_stem or stem}.caffemodel", prototxt,
                     weights_for(np.random.default_rng(0)) if blobs is None else blobs)
    return folder / f"{stem}.prototxt", folder / f"{weights_stem or stem}.caffemodel"


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    return write_net(tmp_path_factory.mktemp("caffe") / "cnn")


def test_every_target_validates_against_opencv(cli, cnn, tmp_path):
    net, weights = cnn
    before = net.read_bytes(), weights.read_bytes()
    out = tmp_path / "out"
    r = cli("convert", "-in", net, "-iw", weights, "--to", "onnx,tflite,openvino,executorch", "-o", out, "--json")
    assert r.exit_code == 0, r
    assert (net.read_bytes(), weights.read_bytes()) == before
    report = json.loads((out / "report.json").read_text())
    assert report["source"]["framework"] == "caffe"
    (spec,) = report["contract"]["inputs"]
    assert spec["name"] == "data" and spec["shape"] == ["batch", 3, 17, 17] and spec["layout"] == "NCHW"
    assert sorted(o["name"] for o in report["contract"]["outputs"]) == ["prob", "sig"]
    arts = {a["target"]: a for a in report["artifacts"]}
    assert sorted(arts) == ["executorch", "onnx", "openvino", "tflite"]
    assert all(a.get("validated", True) and a["validated_with"] and not a.get("not_validated")
               for a in arts.values()), arts
    assert report["status"] == "ok" and report["reference"]["outputs"] == ["prob", "sig"]
    ended = {p["hop"]: p["ok"] for p in report["parity"] if p["hop"].endswith("(end to end)")}
    assert ended == {f"caffe→{t} (end to end)": True for t in arts}, ended
    assert all(p["ok"] for p in report["parity"])


def test_plain_form_finds_the_weights_beside_the_network(cnn, tmp_path):
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    net, _ = cnn
    ir = parse(net, SourceSpec(path=net))
    assert ir.reference.producer.startswith("opencv ")
    assert [o.name for o in ir.outputs] == ["sig", "prob"]
    assert ir.reference.inputs["data"].shape == (2, 3, 17, 17)  # the batch dim stays dynamic
    got = OnnxRuntimeRunner(ir.model).run(ir.reference.inputs)
    for name, ref in ir.reference.outputs.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)
    assert ir.provenance["weights"].endswith("deploy.caffemodel")
    by_weights = parse(cnn[1], SourceSpec(path=cnn[1]))  # the caffemodel named: its prototxt found beside it
    assert by_weights.provenance["path"] == str(net)


def test_legacy_v1_weights_are_read(tmp_path):
    """An old caffemodel keeps its weights in V1 `layers` (name and blobs at other field numbers)."""
    net, weights = write_net(tmp_path / "v1")
    model = NetParameter.FromString(weights.read_bytes())
    old = NetParameter()
    for layer in model.layer:
        if len(layer.blobs):
            v1 = old.layers.add(name=layer.name)
            v1.blobs.extend(layer.blobs)
    weights.write_bytes(old.SerializeToString())
    ir = parse(net, SourceSpec(path=net))
    assert sorted(ir.reference.outputs) == ["prob", "sig"]


def test_plain_cli_and_forced_framework(cli, tmp_path):
    net, weights = write_net(tmp_path / "src", weights_stem="trained")  # the one .caffemodel in the folder
    assert detect(net) == "caffe"
    r = cli("convert", net, "-sf", "caffe", "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    assert all(p["ok"] for p in r.json()["parity"])
    (weights.parent / "other.caffemodel").write_bytes(weights.read_bytes())
    r = cli("convert", net, "--to", "onnx", "-o", tmp_path / "out2")
    assert r.exit_code == 2, r
    assert "deploy.caffemodel" in r.stderr and "-iw" in r.stderr


def test_input_override_and_fixed_batch(tmp_path):
    text = CNN.replace('layer { name: "fc"', 'layer { name: "flat" type: "Reshape" bottom: "pool2" top: "pool2" '
                       'reshape_param { shape { dim: 1 dim: -1 } } }\nlayer { name: "fc"')
    net, _ = write_net(tmp_path / "fixed", text)
    ir = parse(net, SourceSpec(path=net))
    assert ir.inputs[0].shape == [1, 3, 17, 17]  # the Reshape fixes the batch
    assert any("batch" in w for w in ir.provenance["warnings"])
    with pytest.raises(BadInputError, match=r"unknown input 'image'.*\['data'\]"):
        parse(net, SourceSpec(path=net, inputs=[parse_input_spec("image:1x3x17x17")]))


@pytest.mark.parametrize("size,kernel,stride,pad,ceil,want", [
    (7, 3, 2, 0, True, 3), (8, 3, 2, 0, True, 4), (8, 3, 2, 0, False, 3), (6, 3, 2, 1, True, 4), (5, 2, 2, 1, True, 3),
    (13, 3, 2, 0, True, 6), (14, 3, 2, 1, True, 8),
])
def test_pooled_sizes_round_as_caffe(size, kernel, stride, pad, ceil, want):
    assert caffe_pool_size(size, kernel, stride, pad, ceil=ceil, padded=bool(pad)) == want


def test_padded_ceil_pooling_matches_opencv(tmp_path):
    """Every kind of window at once: AVE and MAX with padding, the last window past the padding."""
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    text = """layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 dim: 6 dim: 9 } } }
layer { name: "ave" type: "Pooling" bottom: "x" top: "ave" pooling_param { pool: AVE kernel_h: 3 kernel_w: 2 stride: 2 pad_h: 1 pad_w: 1 } }
layer { name: "mx" type: "Pooling" bottom: "x" top: "mx" pooling_param { pool: MAX kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "g" type: "Pooling" bottom: "x" top: "g" pooling_param { pool: AVE global_pooling: true } }
layer { name: "fl" type: "Pooling" bottom: "x" top: "fl" pooling_param { pool: AVE kernel_size: 2 stride: 2 ceil_mode: false } }
"""
    (tmp_path / "p.prototxt").write_text(text)
    write_caffemodel(tmp_path / "p.caffemodel", text, {})
    net = tmp_path / "p.prototxt"
    ir = parse(net, SourceSpec(path=net))
    got = OnnxRuntimeRunner(ir.model).run(ir.reference.inputs)
    assert {k: v.shape for k, v in ir.reference.outputs.items()} == {
        "ave": (2, 2, 4, 5), "mx": (2, 2, 4, 5), "g": (2, 2, 1, 1), "fl": (2, 2, 3, 4)}
    for name, ref in ir.reference.outputs.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6, err_msg=name)


# the other translated layers, each checked against OpenCV: a Deconvolution, a Crop, a Flatten, a
# Reshape, a Slice into two tops, a Scale by a second bottom, an InnerProduct over axis 2,
# TanH, ELU, AbsVal, a BatchNorm with the input's own statistics, a repeated layer name, and an output written in place by a layer of another name
MORE = """name: "more"
input: "x"
input_shape { dim: 1 dim: 4 dim: 6 dim: 6 }
layer { name: "up" type: "Deconvolution" bottom: "x" top: "up" convolution_param { num_output: 4 kernel_size: 4 stride: 2 pad: 1 group: 2 } }
layer { name: "crop" type: "Crop" bottom: "up" bottom: "x" top: "crop" crop_param { axis: 2 offset: 1 offset: 2 } }
layer { name: "t" type: "TanH" bottom: "crop" top: "crop" }
layer { name: "t" type: "ELU" bottom: "crop" top: "crop" elu_param { alpha: 0.5 } }
layer { name: "sl" type: "Slice" bottom: "crop" top: "a" top: "b" slice_param { axis: 1 slice_point: 1 } }
layer { name: "gap" type: "Pooling" bottom: "a" top: "gap" pooling_param { pool: MAX global_pooling: true } }
layer { name: "flat_gap" type: "Flatten" bottom: "gap" top: "flat_gap" }
layer { name: "sc" type: "Scale" bottom: "b" bottom: "flat_gap" top: "sc" scale_param { axis: 0 } }
layer { name: "pw" type: "Power" bottom: "sc" top: "sc" power_param { shift: -0.5 } }
layer { name: "abs" type: "AbsVal" bottom: "sc" top: "abs" }
layer { name: "rs" type: "Reshape" bottom: "abs" top: "rs" reshape_param { shape { dim: 0 dim: 3 dim: -1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "rs" top: "ip" inner_product_param { num_output: 5 axis: 2 } }
layer { name: "out_relu" type: "ReLU" bottom: "ip" top: "ip" relu_param { negative_slope: 0.1 } }
layer { name: "own_stats" type: "BatchNorm" bottom: "x" top: "own_stats" batch_norm_param { use_global_stats: false } }
"""


def test_more_layers_match_opencv(tmp_path):
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    rng = np.random.default_rng(1)
    blobs = {"up": [rng.standard_normal((4, 2, 4, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)],
             "ip": [rng.standard_normal((5, 36)).astype(np.float32), rng.standard_normal(5).astype(np.float32)],
             "own_stats": [np.zeros(4, np.float32), np.ones(4, np.float32), np.ones(1, np.float32)]}
    net, _ = write_net(tmp_path / "more", MORE, blobs)
    ir = parse(net, SourceSpec(path=net))
    assert [o.name for o in ir.outputs] == ["ip", "own_stats"]
    assert ir.inputs[0].shape == [1, 4, 6, 6]  # the Scale over axis 0 fixes the batch
    got = OnnxRuntimeRunner(ir.model).run(ir.reference.inputs)
    assert got["ip"].shape == ir.reference.outputs["ip"].shape == (1, 3, 5)
    for s in ir.reference.sets():
        got = OnnxRuntimeRunner(ir.model).run(s.inputs)
        # a channel of constant values has no variance: OpenCV's rounding of its mean, over sqrt(eps), is all it returns
        for name in ("ip", "own_stats") if s.inputs["x"].std(axis=(2, 3)).min() > 1e-3 else ("ip",):
            np.testing.assert_allclose(got[name], s.outputs[name], rtol=1e-4, atol=1e-4, err_msg=f"{s.kind} {name}")


def _refused(cli, tmp_path, net, exit_code: int = 2) -> str:
    before = tree(tmp_path)
    r = cli("convert", net, "--to", "onnx", "-o", tmp_path / "out")
    assert r.exit_code == exit_code, r
    assert tree(tmp_path) == before  # nothing written (the cli fixture also checks the inputs are unchanged)
    return r.stderr.replace("\n", " ")


def test_untranslated_layer_names_its_type_and_name(cli, tmp_path):
    text = CNN + 'layer { name: "detection_out" type: "DetectionOutput" bottom: "prob" top: "det" }\n'
    net, _ = write_net(tmp_path / "src", text)
    err = _refused(cli, tmp_path, net)
    assert "layer 'detection_out' of type DetectionOutput has no translation" in err


def test_truncated_caffemodel_names_the_layer_and_blob(cli, tmp_path):
    net, weights = write_net(tmp_path / "src")
    raw = weights.read_bytes()
    weights.write_bytes(raw[: len(raw) - 200])  # inside the last layer with weights: fc's bias... or weights
    assert "layer 'fc' (InnerProduct)" in truncation(weights.read_bytes())
    err = _refused(cli, tmp_path, net)
    assert "truncated" in err and "layer 'fc' (InnerProduct), in its blob" in err


def test_mismatched_blobs_name_the_layer_and_blob(tmp_path):
    blobs = weights_for(np.random.default_rng(0))
    blobs["conv2a"] = [blobs["conv2a"][0][:4], blobs["conv2a"][1]]  # 4 filters where 8 are needed
    net, _ = write_net(tmp_path / "a", blobs=blobs)
    with pytest.raises(BadInputError, match=r"layer 'conv2a' of type Convolution: blob 0 \(weights\) has the shape "
                                            r"\[4, 4, 3, 1\], its parameters need \[8, 4, 3, 1\]"):
        parse(net, SourceSpec(path=net))
    blobs = weights_for(np.random.default_rng(0))
    del blobs["bn1"][2]
    net, _ = write_net(tmp_path / "b", blobs=blobs)
    with pytest.raises(BadInputError, match=r"layer 'bn1' of type BatchNorm: 2 blobs in the weights, its parameters "
                                            r"need 3"):
        parse(net, SourceSpec(path=net))
    # a blob whose data does not fill its declared shape
    net, weights = write_net(tmp_path / "c")
    model = NetParameter.FromString(weights.read_bytes())
    fc = next(layer for layer in model.layer if layer.name == "fc")
    fc.blobs[1].shape.dim[0] = 11
    weights.write_bytes(model.SerializeToString())
    with pytest.raises(BadInputError, match=r"layer 'fc' blob 1 holds 10 values, its shape \[11\] needs 11"):
        parse(net, SourceSpec(path=net))


def test_python_layer_is_refused(cli, tmp_path):
    text = CNN + ('layer { name: "py" type: "Python" bottom: "prob" top: "py" '
                  'python_param { module: "evil" layer: "Run" } }\n')
    net, _ = write_net(tmp_path / "src", text)
    err = _refused(cli, tmp_path, net, exit_code=3)
    assert "layer 'py' of type Python runs Python code (module 'evil')" in err


@pytest.mark.parametrize("layer", [
    'layer { name: "d" type: "Data" top: "data" data_param { source: "/etc/passwd" batch_size: 1 } }',
    'layer { name: "d" type: "ImageData" top: "data" image_data_param { source: "list.txt" } }',
    'layer { name: "d" type: "Input" top: "z" transform_param { mean_file: "mean.binaryproto" } }',
])
def test_file_paths_are_refused(cli, tmp_path, layer):
    text = CNN.replace('layer { name: "data"', layer + '\nlayer { name: "data0"', 1) if "Input" not in layer else CNN + layer
    net, _ = write_net(tmp_path / "src", text)
    err = _refused(cli, tmp_path, net, exit_code=3)
    assert "names a file" in err and "deploy.prototxt" in err


def test_legacy_v1_and_garbage_are_refused(tmp_path):
    net = tmp_path / "v1.prototxt"
    net.write_text('input: "data"\ninput_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8\n'
                   'layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv" }\n')
    (tmp_path / "v1.caffemodel").write_bytes(b"\x0a\x01x")
    with pytest.raises(BadInputError, match="legacy V1 Caffe format"):
        parse(net, SourceSpec(path=net))
    net.write_text("layer { name: ")
    with pytest.raises(BadInputError, match="not a valid Caffe prototxt"):
        parse(net, SourceSpec(path=net))


def _head(f: str, size: int, step: int) -> str:
    """An SSD head on the feature map f: loc and conf convolutions (4 boxes a position, 3 classes), each
    Permuted to NHWC and Flattened, and its PriorBox (min, sqrt(min*max), aspect ratios 2 and 1/2)."""
    return "".join(
        f'layer {{ name: "{f}_{k}" type: "Convolution" bottom: "{f}" top: "{f}_{k}" convolution_param {{ num_output: {n} '
        f'kernel_size: 3 pad: 1 }} }}\nlayer {{ name: "{f}_{k}_perm" type: "Permute" bottom: "{f}_{k}" top: "{f}_{k}_perm" '
        f'permute_param {{ order: 0 order: 2 order: 3 order: 1 }} }}\nlayer {{ name: "{f}_{k}_flat" type: "Flatten" '
        f'bottom: "{f}_{k}_perm" top: "{f}_{k}_flat" }}\n' for k, n in (("loc", 16), ("conf", 12))) + (
        f'layer {{ name: "{f}_pb" type: "PriorBox" bottom: "{f}" bottom: "data" top: "{f}_pb" prior_box_param {{ min_size: '
        f'{size} max_size: {2 * size} aspect_ratio: 2 flip: true clip: false variance: 0.1 variance: 0.1 variance: 0.2 '
        f'variance: 0.2 step: {step} offset: 0.5 }} }}\n')


# a tiny SSD without its DetectionOutput: a Normalize over the channels with a scale per channel (conv4_3's),
# one over the whole sample with one scale, two heads, their Concats, a Softmax per box over the classes
SSD = """layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 32 dim: 32 } } }
layer { name: "c1" type: "Convolution" bottom: "data" top: "c1" convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "n1" type: "Normalize" bottom: "c1" top: "n1" norm_param { across_spatial: false channel_shared: false } }
layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2" convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2 } }
layer { name: "n2" type: "Normalize" bottom: "c2" top: "n2" norm_param { across_spatial: true eps: 1e-6 } }
""" + _head("n1", 6, 2) + _head("n2", 12, 4) + "".join(
    f'layer {{ name: "{top}" type: "Concat" bottom: "n1_{k}" bottom: "n2_{k}" top: "{top}" concat_param {{ axis: {a} }} }}\n'
    for top, k, a in (("mbox_loc", "loc_flat", 1), ("mbox_conf", "conf_flat", 1), ("mbox_priorbox", "pb", 2))) + """\
layer { name: "conf_reshape" type: "Reshape" bottom: "mbox_conf" top: "conf_reshape" reshape_param { shape { dim: 0 dim: -1 dim: 3 } } }
layer { name: "conf_softmax" type: "Softmax" bottom: "conf_reshape" top: "conf_softmax" softmax_param { axis: 2 } }
layer { name: "mbox_conf_flatten" type: "Flatten" bottom: "conf_softmax" top: "mbox_conf_flatten" }
"""
SSD_BLOBS = {"c1": [(8, 3, 3, 3), (8,)], "c2": [(8, 8, 3, 3), (8,)], "n1": [(8,)], "n2": [(1,)],
             **{f"n{i}_{k}": [(n, 8, 3, 3), (n,)] for i in (1, 2) for k, n in (("loc", 16), ("conf", 12))}}


def test_ssd_heads_validate_against_opencv_on_every_target(cli, tmp_path):
    rng = np.random.default_rng(2)
    blobs = {name: [(rng.standard_normal(s) * 0.2 + (20 if name == "n1" else 0)).astype(np.float32) for s in shapes]
             for name, shapes in SSD_BLOBS.items()}
    net, weights = write_net(tmp_path / "ssd", SSD, blobs)
    r = cli("convert", "-in", net, "-iw", weights, "--to", "onnx,tflite,openvino", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["contract"]["inputs"][0]["shape"] == ["batch", 3, 32, 32]  # one set of boxes for every sample
    n = (16 * 16 + 8 * 8) * 4
    assert {o["name"]: o["shape"] for o in report["contract"]["outputs"]} == {
        "mbox_loc": ["batch", n * 4], "mbox_conf_flatten": ["batch", n * 3], "mbox_priorbox": [1, 2, n * 4]}
    assert all(a["validated_with"] and not a.get("not_validated") for a in report["artifacts"])
    assert report["status"] == "ok" and all(p["ok"] for p in report["parity"]), report["parity"]
    ended = {p["hop"] for p in report["parity"] if p["hop"].endswith("(end to end)")}
    assert ended == {f"caffe→{t} (end to end)" for t in ("onnx", "openvino", "tflite")}, ended
    ir = parse(net, SourceSpec(path=net, inputs=[parse_input_spec("data:n,3,h,w")]))  # the boxes fix h and w
    assert ir.inputs[0].shape == ["n", 3, 32, 32] and any("PriorBox" in w for w in ir.provenance["warnings"])


@pytest.mark.parametrize("param,feature,image", [
    ("min_size: 30 max_size: 60 aspect_ratio: 2 clip: false variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 step: 8",
     (5, 7), (40, 56)),  # flip and offset 0.5 by default
    # no max_size, no flip (3 kept, 1 and the repeat left out), clipped (the default), steps from the sizes
    ("min_size: 11 aspect_ratio: 3 aspect_ratio: 1 aspect_ratio: 3 flip: false variance: 0.2 offset: 0.25", (6, 4), (37, 61)),
    ("min_size: 10 min_size: 20 max_size: 15 max_size: 30 aspect_ratio: 2 step_h: 7 step_w: 9 variance: 0.5", (3, 4), (30, 30)),
    ("min_size: 10 max_size: 5 variance: 0.1", (3, 3), (30, 30)),  # refused, as OpenCV refuses it
])
def test_prior_box_constant_equals_opencv(tmp_path, param, feature, image):
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    shape = 'layer {{ name: "{0}" type: "Input" top: "{0}" input_param {{ shape {{ dim: 1 dim: 3 dim: {1} dim: {2} }} }} }}\n'
    text = (shape.format("f", *feature) + shape.format("im", *image)
            + f'layer {{ name: "pb" type: "PriorBox" bottom: "f" bottom: "im" top: "pb" prior_box_param {{ {param} }} }}\n')
    net, _ = write_net(tmp_path / "pb", text, {})
    if "max_size: 5 " in param:
        with pytest.raises(BadInputError, match=r"layer 'pb' of type PriorBox: max_size \[5.0\] needs one value above"):
            parse(net, SourceSpec(path=net))
        return
    ir = parse(net, SourceSpec(path=net))
    np.testing.assert_array_equal(OnnxRuntimeRunner(ir.model).run(ir.reference.inputs)["pb"], ir.reference.outputs["pb"])
