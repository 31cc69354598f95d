"""The PyTorch code target on real models: generated source with parity (CNN, transformer encoder,
LSTM, Keras and TFLite sources), readable and ruff-clean, trainable, exportable again, and the
unsupported-op error that lists every missing op before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelport.emitters.op_registry import OpEntry, OpRegistry
from modelport.emitters.pytorch_code.registry import default_table
from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes.torch_source import import_generated, load_generated
from tests.conftest import tree

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def zoo_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pytorch_code")
    runs = {}
    for name in ("cnn_small", "bert_tiny", "lstm_small"):
        out = root / name
        runs[name] = (out, convert(f"zoo:{name}", out, ConvertOptions(targets=["onnx", "pytorch"])))
    return runs


def _end_to_end(report: dict) -> dict:
    (p,) = [p for p in report["parity"] if p["hop"].endswith("→pytorch (end to end)")]
    return p


@pytest.mark.parametrize("name,modules", [
    ("cnn_small", ["nn.Conv2d(", "nn.Linear("]),
    ("bert_tiny", ["nn.Embedding(", "nn.LayerNorm(", "nn.Linear("]),
    ("lstm_small", ["nn.LSTM(", "nn.Linear("]),
])
def test_zoo_models_become_code_with_parity(zoo_runs, name, modules):
    out, report = zoo_runs[name]
    parity = _end_to_end(report)
    assert parity["ok"], parity
    assert all(o["max_abs"] < 1e-4 for o in parity["outputs"])
    code = (out / "pytorch" / "model.py").read_text()
    for m in modules:
        assert m in code
    assert "class Model(nn.Module):" in code and "def load_model(" in code
    assert {"pytorch/model.py", "pytorch/model.safetensors", "pytorch/README.md"} <= set(tree(out))


@pytest.mark.parametrize("name", ["cnn_small", "bert_tiny", "lstm_small"])
def test_generated_code_passes_ruff(zoo_runs, name):
    out, _ = zoo_runs[name]
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(out / "pytorch" / "model.py")],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readable_names(zoo_runs):
    code = (zoo_runs["cnn_small"][0] / "pytorch" / "model.py").read_text()
    assert "self.layer1_conv1 = nn.Conv2d(16, 16, kernel_size=3, padding=1)" in code
    assert "layer1_conv1 = self.layer1_conv1(relu)" in code
    bert = (zoo_runs["bert_tiny"][0] / "pytorch" / "model.py").read_text()
    assert "def forward(self, input_ids, attention_mask):" in bert
    # the reshape targets stay symbolic: built from the input's shape, not baked from the sample
    assert "list(attention_mask.shape" in bert


def test_import_load_state_dict_reproduces_reference(zoo_runs):
    import torch
    from safetensors.torch import load_file

    out, _ = zoo_runs["cnn_small"]
    module = import_generated(out / "pytorch")
    m = module.Model()
    m.load_state_dict(load_file(str(out / "pytorch" / "model.safetensors")))
    m.eval()
    params = dict(m.named_parameters())
    assert params and all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in params.values())
    from modelport.ir import IRModel  # noqa: F401
    from modelport.reference.samples import make_inputs
    from modelport.zoo import source_spec
    from modelport.zoo_builders.pytorch import cnn_small

    spec = source_spec("cnn_small")
    x = make_inputs(spec.inputs, spec.sample_dims)["input"]
    with torch.no_grad():
        want = cnn_small().eval()(torch.from_numpy(x)).numpy()
        got = m(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    # trainable: one optimiser step changes the weights
    m.train()
    loss = m(torch.from_numpy(x)).square().mean()
    loss.backward()
    assert m.layer1_conv1.weight.grad is not None and m.layer1_conv1.weight.grad.abs().sum() > 0


def test_round_trip_back_to_onnx(zoo_runs, tmp_path):
    import torch

    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    out, _ = zoo_runs["lstm_small"]
    m = load_generated(out / "pytorch")
    x = torch.randn(3, 7, 16)
    ep = torch.export.export(m, (x,))
    path = tmp_path / "again.onnx"
    torch.onnx.export(ep, (x,), str(path), input_names=["x"], external_data=False, verbose=False)
    got = OnnxRuntimeRunner(path).run({"x": x.numpy()})
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(next(iter(got.values())), want, atol=1e-5, rtol=1e-4)


def _onnx_with(tmp_path, ops: list[str]) -> Path:
    nodes, prev = [], "x"
    for i, op in enumerate(ops):
        nodes.append(helper.make_node(op, [prev], [f"v{i}"], domain="" if op != "Mystery" else "custom.domain"))
        prev = f"v{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.domain", 1)])
    path = tmp_path / "src" / "m.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path))
    return path


def test_unsupported_ops_listed_with_counts_exit_2(cli, tmp_path):
    from modelport.emitters.pytorch_code import generate_source
    from modelport.errors import UnsupportedError

    path = _onnx_with(tmp_path, ["Relu", "Mystery", "Mystery", "Relu"])
    with pytest.raises(UnsupportedError) as e:
        generate_source(onnx.load(str(path)))
    assert "custom.domain.Mystery x2" in str(e.value)
    # through the CLI: the ONNX parser cannot run the custom op either, so that stage refuses it; the
    # emitter's own listing is what `emit` reports for a model onnxruntime can run (next test).
    r = cli("convert", path, "--to", "pytorch", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert not (tmp_path / "out").exists()


def test_unsupported_op_in_a_runnable_model_exit_2_no_output(cli, tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Det", ["a"], ["y"]),
             helper.make_node("Det", ["a"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "src" / "det.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path))
    r = cli("convert", path, "--to", "pytorch", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "unsupported ops: Det x2" in r.stderr
    assert not (tmp_path / "out").exists()


def test_registry_rejects_duplicates_and_names_missing_ops():
    reg = OpRegistry("converter")
    reg.add(OpEntry("Foo", print, since=1, until=10, origin="a"))
    reg.add(OpEntry("Foo", print, since=11, origin="b"))
    with pytest.raises(ValueError, match="duplicate converter for ai.onnx::Foo"):
        reg.add(OpEntry("Foo", print, since=5, origin="c"))
    with pytest.raises(KeyError, match="no converter for custom::Bar at opset 3"):
        reg.lookup("Bar", 3, "custom")
    assert reg.lookup("Foo", 12).origin == "b"


def test_default_registry_covers_cnn_transformer_recurrent():
    reg = default_table()
    for op in ("Conv", "ConvTranspose", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "Relu",
               "Gemm", "MatMul", "LayerNormalization", "Softmax", "Gelu", "Erf", "Gather", "Reshape", "Transpose",
               "Concat", "Slice", "Shape", "Unsqueeze", "Squeeze", "Expand", "Where", "Cast", "LSTM", "GRU", "RNN"):
        assert reg.find(op, 20) is not None, op


@pytest.fixture(scope="module")
def keras_files(tmp_path_factory):
    import tensorflow as tf

    from modelport.zoo_builders import keras as builders

    d = tmp_path_factory.mktemp("keras_to_torch")
    builders.keras_cnn().save(d / "cnn.keras")
    builders.keras_transformer().save(d / "transformer.keras")
    cnn = builders.keras_cnn()
    cnn.export(str(d / "cnn_sm"), verbose=False)
    (d / "cnn.tflite").write_bytes(tf.lite.TFLiteConverter.from_saved_model(str(d / "cnn_sm")).convert())
    return d


@pytest.mark.tf
@pytest.mark.parametrize("name", ["cnn.keras", "transformer.keras", "cnn.tflite"])
def test_keras_and_tflite_become_pytorch_code(cli, keras_files, tmp_path, name):
    out = tmp_path / "out"
    r = cli("convert", keras_files / name, "--to", "pytorch", "-o", out, "--json")
    assert r.exit_code == 0, r
    parity = _end_to_end(r.json())
    assert parity["ok"], parity
    code = out / "pytorch" / "model.py"
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(code)], capture_output=True, text=True, cwd=REPO)
    assert lint.returncode == 0, lint.stdout


@pytest.fixture(scope="module")
def keras_recurrent(tmp_path_factory):
    import keras

    d = tmp_path_factory.mktemp("keras_recurrent")
    for name, layer in (("lstm", keras.layers.LSTM(6)), ("gru", keras.layers.GRU(6))):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((7, 4)), layer, keras.layers.Dense(3)])
        model.save(d / f"{name}.keras")
    return d


@pytest.mark.tf
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_keras_recurrent_becomes_pytorch_code(cli, keras_recurrent, tmp_path, name):
    """tf2onnx writes a Keras LSTM as an LSTM node and a Keras GRU as a `Loop`: the loop becomes a
    Python `for` over a body method."""
    out = tmp_path / "out"
    r = cli("convert", keras_recurrent / f"{name}.keras", "--to", "pytorch", "-o", out, "--json")
    assert r.exit_code == 0, r
    parity = _end_to_end(r.json())
    assert parity["ok"], parity
    code = (out / "pytorch" / "model.py").read_text()
    if name == "gru":
        assert "for step in range(7):" in code and "_body(self, " in code
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(out / "pytorch" / "model.py")],
                          capture_output=True, text=True, cwd=REPO)
    assert lint.returncode == 0, lint.stdout


def _upsampling_cnn(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = helper.make_tensor("conv.weight", TensorProto.FLOAT, [4, 3, 3, 3], rng.standard_normal(108).astype(np.float32).tolist())
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["c", "", "scales"], ["up"], mode="nearest", coordinate_transformation_mode="asymmetric",
                         nearest_mode="floor"),
        helper.make_node("Resize", ["up", "", "scales"], ["smooth"], mode="linear"),
        helper.make_node("MaxPool", ["smooth"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w, scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def test_emit_onnx_to_pytorch_cli(cli, tmp_path):
    src = _upsampling_cnn(tmp_path / "src" / "up.onnx")
    out = tmp_path / "out"
    r = cli("emit", src, "--to", "pytorch", "-o", out, "--json")
    assert r.exit_code == 0, r
    parity = _end_to_end(r.json())
    assert parity["ok"], parity
    code = (out / "pytorch" / "model.py").read_text()
    assert 'up = F.interpolate(c, scale_factor=2.0, mode="nearest")' in code
    assert 'mode="bilinear", align_corners=False' in code
    assert {"pytorch/model.py", "pytorch/model.safetensors", "pytorch/README.md", "report.json"} <= set(tree(out))
    again = cli("emit", src, "--to", "pytorch", "-o", out)
    assert again.exit_code == 2  # an existing output needs --force


def test_unsupported_op_inside_a_loop_body_is_listed():
    from modelport.emitters.pytorch_code import generate_source
    from modelport.errors import UnsupportedError

    body = helper.make_graph(
        [helper.make_node("Det", ["s_in"], ["d"]), helper.make_node("Add", ["s_in", "d"], ["s_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2, 2])])
    loop = helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)
    graph = helper.make_graph([loop], "g", [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    with pytest.raises(UnsupportedError, match="unsupported ops: Det x1"):
        generate_source(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_reshape_zero_keeps_the_input_dim_for_constant_and_computed_shapes(tmp_path):
    """ONNX Reshape's 0 copies the input's size (allowzero=0); torch's reshape would take it literally."""
    from onnx import numpy_helper

    def const(name, values):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64), name))

    nodes = [
        const("keep_flat", [0, -1]),
        helper.make_node("Reshape", ["x", "keep_flat"], ["flat"]),
        helper.make_node("Shape", ["x"], ["sh"]),
        const("two", [2]), const("three", [3]), const("zero_one", [0, -1]),
        helper.make_node("Slice", ["sh", "two", "three"], ["last"]),
        helper.make_node("Concat", ["zero_one", "last"], ["target"], axis=0),
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("Reshape", ["sq", "target"], ["back"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6, 4])],
                              [helper.make_tensor_value_info("flat", TensorProto.FLOAT, ["batch", 24]),
                               helper.make_tensor_value_info("back", TensorProto.FLOAT, ["batch", 6, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "src" / "reshape0.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path))
    report = convert(path, tmp_path / "out", ConvertOptions(targets=["pytorch"]))
    assert _end_to_end(report)["ok"]
    module = load_generated(tmp_path / "out" / "pytorch")
    import torch

    x = torch.randn(3, 6, 4)
    flat, back = module(x)
    assert tuple(flat.shape) == (3, 24) and tuple(back.shape) == (3, 6, 4)
    torch.testing.assert_close(back, x * x)


def _unknown_rank_model(nodes, inputs, opset: int = 17):
    """One float input `x` of no declared shape, so shape inference leaves every rank unknown; the
    other inputs are initializers (`inputs`: name -> an array, or a list of int64 values)."""
    from onnx import numpy_helper

    inits = [numpy_helper.from_array(v if isinstance(v, np.ndarray) else np.array(v, np.int64), k) for k, v in inputs.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _generated_matches_reference(model, x: np.ndarray) -> str:
    """Runs the generated code on `x`; returns its source after checking it against ONNX's reference."""
    import torch
    from onnx.reference import ReferenceEvaluator

    from modelport.emitters.pytorch_code import generate_source
    from modelport.emitters.pytorch_code.conformance import load_source

    text, state, _ = generate_source(model)
    module = load_source(text)
    m = module.Model()
    m.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    with torch.no_grad():
        got = m(torch.from_numpy(x)).numpy()
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert got.shape == want.shape, (got.shape, want.shape, text)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=text)
    return text


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1], [2], [0], [1]),             # the PP-OCR recogniser's q/k/v split: x[1:2] on axis 0
    ([0, 1], [2, 3], [1, 2], [1, 1]),
    ([1], [3], [-1], [1]),            # from the end, after an ellipsis
    ([1, 0], [2, -1], [0, -1], [1, 1]),  # both ends: the run-time helper
    ([-1], [-4], [1], [-1]),          # a negative step on an axis of unknown size: the run-time helper
])
def test_slice_on_a_value_of_unknown_rank(starts, ends, axes, steps):
    """A Slice whose input has no inferred rank (a Reshape to a computed shape in Paddle exports) was
    written as a no-op when its axes were non-negative: `x[...]` with nothing after the ellipsis."""
    model = _unknown_rank_model([helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])],
                                {"starts": starts, "ends": ends, "axes": axes, "steps": steps})
    x = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    _generated_matches_reference(model, x)


@pytest.mark.parametrize("axes", [[-1], [0, -1], [-3, -1]])
def test_unsqueeze_negative_axes_on_a_value_of_unknown_rank(axes):
    """Negative Unsqueeze axes count from the output's end; with the rank unknown until run time the
    code normalises them there (silero-vad's scripted LSTM squeezes a dim only when it is 1, so the
    rank after its If depends on the input)."""
    model = _unknown_rank_model([helper.make_node("Unsqueeze", ["x", "axes"], ["y"])], {"axes": axes})
    text = _generated_matches_reference(model, np.ones((2, 3), np.float32))
    assert ("onnx_unsqueeze(" in text) == (len(axes) > 1)


_SCALE, _BIAS = np.linspace(0.5, 1.5, 5, dtype=np.float32), np.linspace(-1, 1, 5, dtype=np.float32)


@pytest.mark.parametrize("node,inputs,opset", [
    (helper.make_node("Gather", ["x", "i"], ["y"], axis=-2), {"i": [2, 0]}, 17),
    (helper.make_node("Gather", ["x", "i"], ["y"], axis=-1), {"i": np.array(1, np.int64)}, 17),
    (helper.make_node("Flatten", ["x"], ["y"], axis=-1), {}, 17),
    (helper.make_node("Flatten", ["x"], ["y"], axis=-2), {}, 17),
    (helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"]), {"pads": [1, 2], "axes": [-1]}, 18),
    (helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"]), {"pads": [1, 1], "axes": [0]}, 18),
    (helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"], mode="reflect"), {"pads": [2, 1], "axes": [-2]}, 18),
    (helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1), {"scale": _SCALE, "bias": _BIAS}, 17),
    (helper.make_node("LayerNormalization", ["x", "scale"], ["y"], axis=1), {"scale": np.ones((4, 5), np.float32)}, 17),
    (helper.make_node("GlobalAveragePool", ["x"], ["y"]), {}, 17),
    (helper.make_node("ReduceMean", ["x"], ["y"], keepdims=1), {}, 18),
    (helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0), {}, 18),
], ids=["gather-neg", "gather-scalar-neg", "flatten-1", "flatten-2", "pad-neg", "pad-axis0", "pad-reflect-neg",
        "layernorm-neg", "layernorm-pos", "global-avg-pool", "reduce-mean-all", "reduce-sum-all"])
def test_axes_on_a_value_of_unknown_rank_are_resolved_at_run_time(node, inputs, opset):
    """Where the rank is known only at run time, the code counts a negative axis from the back (an
    ellipsis, a negative dim) or computes the dims from `x.dim()`, instead of refusing the node; a Pad
    with explicit axes on such a value padded the last dims whatever the axes said."""
    model = _unknown_rank_model([node], inputs, opset)
    _generated_matches_reference(model, np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32))


def test_a_node_a_converter_cannot_express_is_not_called_an_op_without_converter():
    from modelport.emitters.pytorch_code import generate_source
    from modelport.errors import UnsupportedError

    model = _unknown_rank_model([helper.make_node("ReduceProd", ["x"], ["y"], keepdims=1)], {}, 18)
    with pytest.raises(UnsupportedError) as e:
        generate_source(model)
    assert "ReduceProd over all axes of an input of unknown rank" in str(e.value)
    assert "not for this configuration of the node" in str(e.value) and "no converter yet" not in str(e.value)


def test_rank_of_a_reshape_to_a_computed_target_is_inferred():
    """Before opset 18, ONNX shape inference gives `Reshape(x, [*x.shape[:2], -1])` no shape, and
    every value after it an unknown rank (125 values of the PP-OCRv4 recogniser); the target's length
    is the rank, so the emitter records it and infers again. Here a ReduceProd over every axis, which
    needs the rank, then converts."""
    from onnx import numpy_helper

    from modelport.emitters.pytorch_code.generator import Generator

    def const(name, values):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64), name))

    nodes = [helper.make_node("Shape", ["x"], ["sh"]), const("s0", [0]), const("s2", [2]),
             helper.make_node("Slice", ["sh", "s0", "s2"], ["lead"]), const("m1", [-1]),
             helper.make_node("Concat", ["lead", "m1"], ["target"], axis=0), helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("ReduceProd", ["r"], ["p"], keepdims=1), helper.make_node("Mul", ["r", "p"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "c", "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert Generator(model).shapes["r"] == [None, None, None]
    _generated_matches_reference(model, np.random.default_rng(0).uniform(0.9, 1.1, (2, 3, 4, 5)).astype(np.float32))


def test_module_from_ir_runs_like_the_onnx_model(tiny_onnx, tmp_path):
    import torch

    from modelport.emitters.pytorch_code import module_from_ir
    from modelport.parsers import parse
    from modelport.resolve.specs import SourceSpec

    ir = parse(tiny_onnx, SourceSpec(path=tiny_onnx))
    module = module_from_ir(ir, tmp_path / "work")
    assert isinstance(module, torch.nn.Module) and not module.training
    assert (tmp_path / "work" / "pytorch" / "model.py").is_file()
    feeds = ir.reference.inputs
    with torch.no_grad():
        got = module(*(torch.from_numpy(feeds[s.name]) for s in ir.inputs))
    got = got if isinstance(got, (tuple, list)) else (got,)
    for spec, value in zip(ir.outputs, got, strict=True):
        np.testing.assert_allclose(value.numpy(), ir.reference.outputs[spec.name], atol=1e-5)


@pytest.mark.parametrize("mode,pads,shape", [("reflect", [0, 2, 0, 0, 3, 0], (1, 6, 1)), ("edge", [0, 1, 0, 2], (3, 5)),
                                             ("reflect", [0, 2, 0, 1], (3, 6))],
                         ids=["reflect-3d-dims-1-2", "edge-2d-dim-1", "reflect-2d-dim-1"])
def test_an_unbatched_pad_is_written_on_the_batched_form(mode, pads, shape):
    """A reflect/replicate pad on every dim but the first of a tensor (basic-pitch pads [b, 171, 1]
    along its time axis) is `F.pad(x.unsqueeze(0), …).squeeze(0)`: the same numbers, and the form
    litert-torch lowers (its unbatched reflection pad fails with "perm tensor elements size is not
    equal to input tensor rank")."""
    from onnx import TensorProto, numpy_helper

    graph = helper.make_graph([helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)], "pad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.array(pads, np.int64), "pads")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    text = _generated_matches_reference(model, np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    assert ".unsqueeze(0), (" in text and ".squeeze(0)" in text
