"""onnxruntime contrib ops in PyTorch code: real transformers optimised with `--optimize all` (fused
Attention, MultiHeadAttention, Gelu, FusedMatMul) become code with parity, and one-node models of
each contrib op match onnxruntime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.runtimes.torch_source import load_generated
from tests.transformers_models import export_pt2

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pt2s(tmp_path_factory):
    d = tmp_path_factory.mktemp("contrib_pt2")
    return {name: export_pt2(name, d) for name in ("bert", "segformer")}


@pytest.mark.parametrize("name,ops", [
    ("bert", ["ort_attention(", "F.gelu("]),  # com.microsoft Attention (+ attention bias) and Gelu
    ("segformer", ["ort_attention(", ".transpose(-1, -2)"]),  # MultiHeadAttention, Attention and FusedMatMul(transA)
])
def test_optimized_transformer_becomes_pytorch_code(cli, pt2s, tmp_path, name, ops):
    out = tmp_path / "out"
    r = cli("convert", pt2s[name], "--to", "pytorch", "--optimize", "all", "-o", out, "--json")
    assert r.exit_code == 0, r
    (parity,) = [p for p in r.json()["parity"] if p["hop"].endswith("→pytorch (end to end)")]
    assert parity["ok"]
    code = (out / "pytorch" / "model.py").read_text()
    for op in ops:
        assert op in code
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(out / "pytorch" / "model.py")],
                          capture_output=True, text=True, cwd=REPO)
    assert ruff.returncode == 0, ruff.stdout


def _f(name, shape, dtype=TensorProto.FLOAT):
    """A value whose leading 2 is a dynamic `batch`."""
    return helper.make_tensor_value_info(name, dtype, ["batch", *shape[1:]] if shape[0] == 2 else shape)


def _ms(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, domain="com.microsoft", **attrs)


rng = np.random.default_rng(0)
W = numpy_helper.from_array(rng.standard_normal((8, 24)).astype(np.float32) * 0.3, "w")
B = numpy_helper.from_array(rng.standard_normal(24).astype(np.float32) * 0.1, "b")
G = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "gamma")
BETA = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "beta")
CASES = {
    "Attention_mask_causal": ([_ms("Attention", ["x", "w", "b", "mask"], ["y"], num_heads=2, unidirectional=1)],
                              [_f("x", [2, 5, 8]), _f("mask", [2, 5], TensorProto.INT32)],
                              [_f("y", [2, 5, 8])], [W, B]),
    "MultiHeadAttention_bias_scale": ([_ms("MultiHeadAttention", ["q", "k", "v", "b", "", "ab"], ["y"], num_heads=2, scale=0.5)],
                                      [_f("q", [2, 5, 8]), _f("k", [2, 3, 8]), _f("v", [2, 3, 8]), _f("ab", [2, 1, 5, 3])],
                                      [_f("y", [2, 5, 8])], [B]),
    "FastGelu_bias": ([_ms("FastGelu", ["x", "gamma"], ["y"])], [_f("x", [2, 8])], [_f("y", [2, 8])], [G]),
    "BiasGelu": ([_ms("BiasGelu", ["x", "gamma"], ["y"])], [_f("x", [2, 8])], [_f("y", [2, 8])], [G]),
    "FusedMatMul_transB_alpha": ([_ms("FusedMatMul", ["x", "z"], ["y"], transB=1, alpha=0.5)],
                                 [_f("x", [2, 3, 8]), _f("z", [2, 4, 8])], [_f("y", [2, 3, 4])], []),
    "SkipLayerNormalization_sum": ([_ms("SkipLayerNormalization", ["x", "s", "gamma", "beta"], ["y", "", "", "sum"], epsilon=1e-5)],
                                   [_f("x", [2, 3, 8]), _f("s", [2, 3, 8])], [_f("y", [2, 3, 8]), _f("sum", [2, 3, 8])], [G, BETA]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_contrib_op_matches_onnxruntime(tmp_path, name):
    """The reference of an ONNX source is onnxruntime's run; the generated module must match it."""

    nodes, inputs, outputs, inits = CASES[name]
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    path = tmp_path / "src" / f"{name}.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path))
    report = convert(path, tmp_path / "out", ConvertOptions(targets=["pytorch"]))
    (parity,) = [p for p in report["parity"] if p["hop"].endswith("→pytorch (end to end)")]
    # float rounding only, at the scale of the worst set's outputs (the large constants' reach ~100)
    assert parity["ok"] and all(o["max_abs"] < 1e-5 * o["tolerance"]["scale"] for o in parity["outputs"]), parity
    # and on inputs of other sizes than the sample's (no size was baked into the code)
    module = load_generated(tmp_path / "out" / "pytorch")
    feeds = {i.name: (np.ones if i.type.tensor_type.elem_type == TensorProto.INT32 else rng.standard_normal)(
        [3 if d.dim_param else d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
        np.int32 if i.type.tensor_type.elem_type == TensorProto.INT32 else np.float32) for i in graph.input}
    want = OnnxRuntimeRunner(path).run(feeds)
    import torch

    with torch.no_grad():
        got = module(*[torch.from_numpy(feeds[i.name]) for i in graph.input])
    got = got if isinstance(got, (tuple, list)) else (got,)
    for o, g in zip(graph.output, got, strict=True):
        np.testing.assert_allclose(g.numpy(), want[o.name], atol=1e-5)
