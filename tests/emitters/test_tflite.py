"""TFLite target: PyTorch CNN and Keras models reach TFLite with parity checked in the LiteRT interpreter."""

from __future__ import annotations

import json

import numpy as np
import pytest

from modelport.emitters.tflite_options import TFLiteOptions
from modelport.errors import UnsupportedError
from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes.tflite import load_interpreter
from tests.conftest import check_options_class, tree
from tests.emitters.models import bitwise_model, save_onnx


@pytest.fixture(scope="module")
def cnn():
    from modelport.zoo_builders.pytorch import cnn_small

    return cnn_small()


def _torch_out(module, x):
    import torch

    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


@pytest.fixture(scope="module")
def conv_only():
    """A model whose output is 4-D (NCHW): the case where onnx2tf's own output is channels-last."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1)).eval()


def _signature(path):
    it = load_interpreter(path)
    return it, it.get_signature_runner("serving_default")


def _tflite_out(path, x):
    it = load_interpreter(path)
    d = it.get_input_details()[0]
    it.resize_tensor_input(d["index"], list(x.shape), strict=False)
    it.allocate_tensors()
    it.set_tensor(d["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


@pytest.mark.parametrize("precision,atol", [("fp32", 1e-4), ("fp16", 1e-2), ("int8", 5e-2)])
def test_pytorch_cnn_to_tflite(cnn, tmp_path, precision, atol):
    out = tmp_path / "out"
    report = convert(cnn, out, ConvertOptions(targets=["tflite"], inputs=["x:batch,3,32,32"], precision=precision))
    hop = next(p for p in report["parity"] if "tflite" in p["hop"])
    assert hop["ok"]
    art = report["artifacts"][0]
    assert art["precision"] == precision and art["inputs_layout"] == {"x": "NCHW (as source)"}
    assert json.loads((out / "report.json").read_text())["status"] == "ok"
    # independent check: the file takes NCHW like the source, any batch size, and matches torch
    x = np.random.default_rng(7).standard_normal((3, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(_tflite_out(out / "model.tflite", x), _torch_out(cnn, x), atol=atol, rtol=0.05)


def test_nhwc_layout_option(cnn, tmp_path):
    out = tmp_path / "out"
    report = convert(cnn, out, ConvertOptions(targets=["tflite"], inputs=["x:batch,3,32,32"],
                                              target_options={"tflite": TFLiteOptions(layout="nhwc")}))
    art = report["artifacts"][0]
    assert art["inputs_layout"]["x"].startswith("NHWC")
    assert report["parity"][-1]["ok"]
    it = load_interpreter(out / "model.tflite")
    assert list(it.get_input_details()[0]["shape_signature"][1:]) == [32, 32, 3]
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    got = _tflite_out(out / "model.tflite", np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
    np.testing.assert_allclose(got, _torch_out(cnn, x), atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("precision,atol", [("fp32", 1e-4), ("fp16", 1e-2)])
def test_4d_output_keeps_the_contract_layout_names_and_signature(conv_only, tmp_path, precision, atol):
    """The file a user loads returns the source's NCHW output under the contract's name, read through
    its signature with no transpose anywhere, and validation read it the same way."""
    out = tmp_path / "out"
    report = convert(conv_only, out, ConvertOptions(targets=["tflite"], inputs=["x:batch,3,8,6"], output_names=["heatmap"],
                                                    precision=precision))
    assert report["contract"]["outputs"][0]["shape"] == ["batch", 2, 8, 6]
    art = report["artifacts"][0]
    assert art["inputs_layout"] == {"x": "NCHW (as source)"} and art["outputs_layout"] == {"heatmap": "as source"}
    assert art["layout_changes"] == {} and "no transpose" in art["validation"]
    assert next(p for p in report["parity"] if "tflite" in p["hop"])["ok"]
    it, run = _signature(out / "model.tflite")
    assert it.get_signature_list() == {"serving_default": {"inputs": ["x"], "outputs": ["heatmap"]}}
    assert [d["name"] for d in it.get_input_details()] == ["x"]
    assert [(d["name"], list(d["shape_signature"])) for d in it.get_output_details()] == [("heatmap", [-1, 2, 8, 6])]
    x = np.random.default_rng(7).standard_normal((3, 3, 8, 6)).astype(np.float32)
    got = run(x=x)
    assert list(got) == ["heatmap"] and got["heatmap"].shape == (3, 2, 8, 6)
    np.testing.assert_allclose(got["heatmap"], _torch_out(conv_only, x), atol=atol, rtol=0.05)


def test_nhwc_changes_layouts_only_when_asked_and_says_so_per_tensor(conv_only, tmp_path):
    out = tmp_path / "out"
    report = convert(conv_only, out, ConvertOptions(targets=["tflite"], inputs=["x:batch,3,8,6"], output_names=["heatmap"],
                                                    target_options={"tflite": TFLiteOptions(layout="nhwc")}))
    art = report["artifacts"][0]
    assert art["inputs_layout"]["x"].startswith("NHWC") and art["outputs_layout"]["heatmap"].startswith("NHWC")
    assert art["layout_changes"] == {"x": [0, 2, 3, 1], "heatmap": [0, 2, 3, 1]}
    assert "reference was transposed into the file's layout for x, heatmap" in art["validation"]
    assert next(p for p in report["parity"] if "tflite" in p["hop"])["ok"]
    it, run = _signature(out / "model.tflite")
    assert list(it.get_input_details()[0]["shape_signature"]) == [-1, 8, 6, 3]
    assert list(it.get_output_details()[0]["shape_signature"]) == [-1, 8, 6, 2]
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 6)).astype(np.float32)
    got = run(x=np.ascontiguousarray(x.transpose(0, 2, 3, 1)))["heatmap"]
    np.testing.assert_allclose(got, _torch_out(conv_only, x).transpose(0, 2, 3, 1), atol=1e-4, rtol=1e-3)


def test_two_inputs_two_outputs_in_contract_order_with_square_dims(tmp_path):
    """Inputs and outputs keep the contract's names and order; a [batch, 8, 8, 8] output (NCHW and
    NHWC have the same shape) is still returned NCHW."""
    import torch

    class TwoIO(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.lin = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(5, 8)

        def forward(self, image, extra):
            fmap = self.conv(image)
            return fmap, fmap.mean(dim=(2, 3)) + self.lin(extra)

    torch.manual_seed(1)
    model = TwoIO().eval()
    out = tmp_path / "out"
    report = convert(model, out, ConvertOptions(targets=["tflite"], inputs=["image:batch,3,8,8", "extra:batch,5"],
                                                output_names=["fmap", "logits"]))
    assert next(p for p in report["parity"] if "tflite" in p["hop"])["ok"]
    it, run = _signature(out / "model.tflite")
    ((key, io),) = it.get_signature_list().items()  # the interpreter lists a signature's keys sorted
    assert key == "serving_default" and io == {"inputs": ["extra", "image"], "outputs": ["fmap", "logits"]}
    assert [d["name"] for d in it.get_input_details()] == ["image", "extra"]
    assert [d["name"] for d in it.get_output_details()] == ["fmap", "logits"]
    rng = np.random.default_rng(4)
    image, extra = rng.standard_normal((2, 3, 8, 8)).astype(np.float32), rng.standard_normal((2, 5)).astype(np.float32)
    got = run(image=image, extra=extra)
    with torch.no_grad():
        want = [t.numpy() for t in model(torch.from_numpy(image), torch.from_numpy(extra))]
    np.testing.assert_allclose(got["fmap"], want[0], atol=1e-4, rtol=1e-3)
    np.testing.assert_allclose(got["logits"], want[1], atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("io_dtype", ["float32", "int8"])
def test_full_integer_4d_output_keeps_the_contract_layout(conv_only, tmp_path, io_dtype):
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((8, 3, 8, 6)).astype(np.float32))
    out = tmp_path / "out"
    report = convert(conv_only, out, ConvertOptions(targets=["tflite"], inputs=["x:batch,3,8,6"], output_names=["heatmap"],
                                                    precision="int8",
                                                    calibration=str(calib), target_options={"tflite": TFLiteOptions(io_dtype=io_dtype)}))
    art = report["artifacts"][0]
    assert art["io_dtype"] == io_dtype and "calibrated" in art["quantization"]
    assert next(p for p in report["parity"] if "tflite" in p["hop"])["ok"]
    it, run = _signature(out / "model.tflite")
    assert it.get_signature_list() == {"serving_default": {"inputs": ["x"], "outputs": ["heatmap"]}}
    (o,) = it.get_output_details()
    assert list(o["shape_signature"]) == [-1, 2, 8, 6] and np.dtype(o["dtype"]).name == io_dtype
    x = np.random.default_rng(7).standard_normal((1, 3, 8, 6)).astype(np.float32)
    if io_dtype == "int8":
        (s_in, z_in), (s_out, z_out) = it.get_input_details()[0]["quantization"], o["quantization"]
        got = run(x=np.clip(np.round(x / s_in) + z_in, -128, 127).astype(np.int8))["heatmap"]
        got = (got.astype(np.float32) - z_out) * s_out
    else:
        got = run(x=x)["heatmap"]
    want = _torch_out(conv_only, x)
    assert got.shape == want.shape
    assert float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want))) > 0.98


def test_int8_full_integer_with_calibration(cnn, tmp_path):
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "out"
    report = convert(cnn, out, ConvertOptions(targets=["tflite"], inputs=["x:batch,3,32,32"], precision="int8",
                                              calibration=str(calib)))
    assert report["artifacts"][0]["quantization"].startswith("integer")
    assert report["parity"][-1]["ok"]
    it = load_interpreter(out / "model.tflite")
    kinds = {np.dtype(d["dtype"]).name for d in it.get_tensor_details()}
    assert "int8" in kinds  # activations are int8, not just weights


@pytest.mark.parametrize("io_dtype", ["int8"])
def test_int8_io_full_integer(cli, cnn, tmp_path, io_dtype):
    """Integer inputs/outputs: the file's I/O tensors are int8, validation quantises the float
    reference inputs and dequantises the outputs, and parity holds under the int8 tolerance."""
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32))
    out = tmp_path / "out"
    report = convert(cnn, out, ConvertOptions(targets=["onnx", "tflite"], inputs=["x:batch,3,32,32"], precision="int8",
                                              calibration=str(calib), target_options={"tflite": TFLiteOptions(io_dtype=io_dtype)}))
    art = next(a for a in report["artifacts"] if a["target"] == "tflite")
    assert art["io_dtype"] == io_dtype and f"{io_dtype} I/O" in art["quantization"]
    hop = next(p for p in report["parity"] if "tflite" in p["hop"])
    assert hop["ok"]
    it = load_interpreter(out / "model.tflite")
    for d in it.get_input_details() + it.get_output_details():
        assert np.dtype(d["dtype"]).name == io_dtype and d["quantization"][0] > 0
    # an independent check: quantise by hand, run, dequantise, compare with torch
    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)
    di, do = it.get_input_details()[0], it.get_output_details()[0]
    (s_in, z_in), (s_out, z_out) = di["quantization"], do["quantization"]
    it.allocate_tensors()
    it.set_tensor(di["index"], np.clip(np.round(x / s_in) + z_in, -128, 127).astype(np.int8))
    it.invoke()
    got = (it.get_tensor(do["index"]).astype(np.float32) - z_out) * s_out
    want = _torch_out(cnn, x)
    cos = float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cos > 0.98
    # `validate` on the pair says how the int8 side was fed
    r = cli("validate", out / "model.onnx", out / "model.tflite", "--precision", "int8", "--json")
    assert r.exit_code == 0, r
    assert "int8 I/O" in r.json()["b"]["io"]


def test_int8_io_needs_calibration(cnn, tmp_path):
    from modelport.errors import BadInputError

    with pytest.raises(BadInputError, match="needs a full-integer model"):
        convert(cnn, tmp_path / "out", ConvertOptions(targets=["tflite"], inputs=["x:batch,3,32,32"], precision="int8",
                                                      target_options={"tflite": TFLiteOptions(io_dtype="int8")}))
    assert not (tmp_path / "out").exists()


def _keras_to_tflite(model, tmp_path):
    """The model saved as `.keras` and converted to TFLite: (output folder, report)."""
    path = tmp_path / "src" / "m.keras"
    path.parent.mkdir()
    model.save(path)
    out = tmp_path / "out"
    return out, convert(path, out, ConvertOptions(targets=["tflite"], route="onnx"))


def test_keras_model_to_tflite(tmp_path):
    import keras
    inp = keras.Input((16, 16, 3), name="image")
    y = keras.layers.Conv2D(8, 3, activation="relu")(inp)
    y = keras.layers.GlobalAveragePooling2D()(y)
    y = keras.layers.Dense(4, name="logits")(y)
    model = keras.Model(inp, y)
    out, report = _keras_to_tflite(model, tmp_path)
    assert report["source"]["framework"] == "keras"
    assert report["parity"][-1]["ok"] and "tflite" in report["parity"][-1]["hop"]
    x = np.random.default_rng(5).standard_normal((2, 16, 16, 3)).astype(np.float32)
    got = _tflite_out(out / "model.tflite", x)  # NHWC in, as in Keras
    np.testing.assert_allclose(got, model.predict(x, verbose=0), atol=1e-4, rtol=1e-3)


def test_keras_nhwc_model_keeps_nhwc_inputs_and_outputs(tmp_path):
    import keras

    inp = keras.Input((8, 6, 3), name="image")
    y = keras.layers.Conv2D(4, 3, padding="same", name="features")(inp)
    model = keras.Model(inp, y)
    out, report = _keras_to_tflite(model, tmp_path)
    (spec_out,) = report["contract"]["outputs"]
    assert report["contract"]["inputs"][0]["shape"][1:] == [8, 6, 3]
    art = report["artifacts"][0]
    assert art["inputs_layout"] == {"image": "NHWC (as source)"} and art["layout_changes"] == {}
    assert report["parity"][-1]["ok"]
    it, run = _signature(out / "model.tflite")
    assert it.get_signature_list() == {"serving_default": {"inputs": ["image"], "outputs": [spec_out["name"]]}}
    assert list(it.get_output_details()[0]["shape_signature"])[1:] == spec_out["shape"][1:] == [8, 6, 4]
    x = np.random.default_rng(5).standard_normal((2, 8, 6, 3)).astype(np.float32)
    got = run(image=x)[spec_out["name"]]
    np.testing.assert_allclose(got, model.predict(x, verbose=0), atol=1e-4, rtol=1e-3)


def test_keras_mobilenet_v2_file_carries_its_signature(tmp_path):
    """onnx2tf captures some of MobileNetV2's kernels in variables no layer tracks; they are saved
    with the wrapper all the same, so the file still has its signature (TensorFlow's converter
    would otherwise fall back, silently, to a file without one)."""
    out = tmp_path / "out"
    report = convert("zoo:keras_mobilenet_v2", out, ConvertOptions(targets=["tflite"], route="onnx"))
    assert report["parity"][-1]["ok"]
    (spec_in,), (spec_out,) = report["contract"]["inputs"], report["contract"]["outputs"]
    it = load_interpreter(out / "model.tflite")
    assert it.get_signature_list() == {"serving_default": {"inputs": [spec_in["name"]], "outputs": [spec_out["name"]]}}


def test_unsupported_op_names_the_node_and_leaves_nothing(tmp_path):
    src = save_onnx(bitwise_model(), tmp_path / "src", "bits.onnx")
    out = tmp_path / "out"
    with pytest.raises(UnsupportedError) as e:
        convert(src, out, ConvertOptions(targets=["tflite"], route="onnx"))
    assert "band (BitwiseAnd)" in e.value.message and e.value.exit_code == 2
    assert not out.exists() and tree(tmp_path) == ["src", "src/bits.onnx"]


def _gridsample_neck_model():
    """onnx2tf stops (sys.exit) on GridSample mode='nearest' after printing its coloured `ERROR:`
    lines; before that, its own onnxruntime session of the graph (dynamic dims set to 1) fails on
    the Concat of a strided path and logs `[E:onnxruntime:...]` to file descriptor 2."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("AveragePool", ["x"], ["d"], kernel_shape=[32, 32], strides=[32, 32]),
             helper.make_node("Resize", ["d", "", "scales"], ["u"], mode="nearest"),
             helper.make_node("Concat", ["x", "u"], ["y"], axis=1),
             helper.make_node("GridSample", ["x", "grid"], ["g"], mode="nearest")]
    init = [numpy_helper.from_array(np.array([1, 1, 32, 32], np.float32), "scales"),
            numpy_helper.from_array(rng.uniform(-1, 1, (1, 4, 4, 2)).astype(np.float32), "grid")]
    graph = helper.make_graph(nodes, "neck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "height", "width"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, "height", "width"]),
                               helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 3, 4, 4])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_failing_route_is_one_stderr_line_and_its_library_log_is_in_the_report(cli_proc, tmp_path):
    """A real process: the libraries' own lines (onnxruntime's C++ logger, onnx2tf's coloured
    ERROR lines) never reach the terminal, not even quoted in the error; the failed stages keep them."""
    src = save_onnx(_gridsample_neck_model(), tmp_path / "src", "neck.onnx")
    r = cli_proc("convert", src, "--dim", "height=64", "--dim", "width=64", "--to", "tflite,savedmodel", "--route", "onnx",
                 "-o", tmp_path / "o", "--json")
    assert r.exit_code == 4, r  # both targets failed: exit 4 naming each
    (line,) = r.stderr.strip().splitlines()
    assert "[E:onnxruntime" not in line and "ERROR:" not in line and "\x1b" not in line
    assert line.count("onnx2tf could not convert the model (exit 1): The current implementation of GridSample") == 2
    report = r.json()
    for target in ("tflite", "savedmodel"):
        (stage,) = [s for s in report["stages"] if s["name"] == f"emit:{target}"]
        assert any("[E:onnxruntime:" in ln and "Concat node" in ln for ln in stage["log"]), stage
        assert any(ln.startswith("ERROR: The current implementation of GridSample") for ln in stage["log"])
        assert not any("\x1b[" in ln for ln in stage["log"])  # colour codes stripped
    assert [s for s in report["stages"] if s["name"] == "parse"][0].get("log") is None  # only failed stages carry one
    assert not (tmp_path / "o").exists()


def test_a_transformer_onnx2tf_cannot_convert_takes_modelports_onnx_lowering(cli, tmp_path):
    """onnx2tf cannot convert a PyTorch BERT export (docs/emitters.md); the ONNX route goes on by
    modelport's own lowering, which keeps the contract's batch and sequence dynamic (-1 in the
    signature), and the report names it with onnx2tf's reason."""
    from ai_edge_litert.interpreter import Interpreter

    r = cli("convert", "zoo:bert_tiny", "--to", "tflite", "-o", tmp_path / "o", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    (art,) = report["artifacts"]
    assert art["route"] == "onnx"
    assert art["converter"].startswith("modelport ONNX lowering (onnx2tf 1.28.8 failed: onnx2tf could not convert the model: ")
    assert "Cannot take the length of shape" in art["converter"]
    assert all(p["ok"] for p in report["parity"])
    details = Interpreter(str(tmp_path / "o" / "model.tflite")).get_input_details()
    assert sorted((d["name"], d["shape_signature"].tolist()) for d in details) == [("attention_mask", [-1, -1]), ("input_ids", [-1, -1])]


def test_options_are_checked_once_here():
    """The Python API gets the CLI's exit-2 messages: both build this class."""
    check_options_class(TFLiteOptions, [({"layout": "nchw"}, "unknown --tflite-layout 'nchw'; known: source, nhwc"),
                                        ({"io_dtype": "int4"}, "unknown --tflite-io-dtype 'int4'; known: float32, int8, uint8")],
                        given={"layout": "NHWC", "io_dtype": "UINT8"}, normalised={"layout": "nhwc", "io_dtype": "uint8"})


def test_scalar_inputs_float_and_int64_convert_and_validate(tmp_path):
    """Rank-0 inputs (a float scale, an int64 count) keep rank 0 through onnx2tf and the TFLite runner."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Mul", ["x", "s"], ["xs"]), helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["xs", "nf"], ["y"])]
    graph = helper.make_graph(nodes, "scalars", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5]),
                                                 helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                                                 helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    src = tmp_path / "scalars.onnx"
    onnx.save(model, src)
    out = tmp_path / "out"
    report = convert(src, out, ConvertOptions(targets=["tflite"]))
    assert all(p["ok"] for p in report["parity"])
    it = load_interpreter(out / "model.tflite")
    ranks = {d["name"].split(":")[0].split("serving_default_")[-1]: len(d["shape"]) for d in it.get_input_details()}
    assert sorted(ranks.values()) == [0, 0, 2], ranks
    # the file as a source: its references come from the TFLite runner fed rank-0 arrays
    back = convert(out / "model.tflite", tmp_path / "back", ConvertOptions(targets=["onnx"]))
    assert all(p["ok"] for p in back["parity"])
    assert {s["name"]: s["shape"] for s in back["contract"]["inputs"]} == {"x": [2, 5], "s": [], "n": []}


def test_keras_inception_blocks_at_1x1_concat_in_tflite(tmp_path):
    """Inception blocks whose maps are 1x1 (InceptionV3's last blocks at 75x75): tf2onnx leaves
    Reshapes there that onnx2tf took for channels-last, so it concatenated along the wrong axis."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((5, 5, 3), name="image")
    x = keras.layers.Conv2D(8, 5, activation="relu")(inp)
    x = keras.layers.BatchNormalization()(x)
    branches = [keras.layers.Conv2D(c, 1, activation="relu")(keras.layers.BatchNormalization()(x)) for c in (4, 6)]
    x = keras.layers.Concatenate()([*branches, keras.layers.AveragePooling2D(3, 1, "same")(x)])
    x = keras.layers.Concatenate()([keras.layers.Conv2D(5, 1)(x), x])
    model = keras.Model(inp, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x)))
    out, report = _keras_to_tflite(model, tmp_path)
    assert report["parity"][-1]["ok"] and "tflite" in report["parity"][-1]["hop"]


@pytest.mark.slow
def test_ocr_detector_with_dynamic_height_and_width_keeps_them(cli, tmp_path):
    """PP-OCRv4's detector takes x[N,3,H,W] with N, H and W dynamic; onnx2tf's model fails on it,
    and modelport's ONNX lowering (its upsampling Resize and ConvTranspose included) converts it
    with all three kept (-1 in the signature), as the report says. (Where neither converts, the
    error names each dynamic dim: tests/orchestration/test_artifact_faults.py.)"""
    from ai_edge_litert.interpreter import Interpreter

    from tests.wheel_models import wheel_model

    path = wheel_model("rapidocr/det", tmp_path / "src")
    r = cli("convert", path, "--to", "tflite", "--route", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.stderr
    (art,) = r.json()["artifacts"]
    assert art["converter"].startswith("modelport ONNX lowering (onnx2tf 1.28.8 failed: "), art["converter"]
    assert all(p["ok"] for p in r.json()["parity"])
    (x,) = Interpreter(str(tmp_path / "out" / "model.tflite")).get_input_details()
    assert x["shape_signature"].tolist() == [-1, 3, -1, -1]


def test_image_models_reach_tflite_without_the_network(cli, tmp_path):
    """onnx2tf fetches sample images from github.com when every input is a small-batch 3-channel
    NHWC image (mediapipe's face detector: 1x128x128x3); it gets local ones, and the suite's
    network guard fails the test on any attempt."""
    from tests.wheel_models import wheel_model

    model = wheel_model("mediapipe/face_detection_short_range", tmp_path / "src")
    r = cli("convert", model, "--to", "tflite", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    assert [a["target"] for a in r.json()["artifacts"]] == ["tflite"]
