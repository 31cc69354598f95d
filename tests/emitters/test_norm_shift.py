"""Shifted normalisation, the rewrite itself (`emitters/norm_shift.py` in the ONNX IR,
`emitters/norm_shift_torch.py` in a PyTorch module): each norm fed x - x₀ computes what it did on
any input, and on a constant frame its normalised values are exact zeros, so the output is the
norm's bias whatever the kernel. One-node ONNX models built here, run by ONNX Runtime; PyTorch
modules eager, as a `.pt2`'s graph module, and decomposed to the ATen norms ExecuTorch lowers."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.emitters.norm_shift import normalisations, shift
from modelport.ir import IRModel
from modelport.reference.sample_sets import DB_FLOOR, LOG_FLOOR

RNG = np.random.default_rng(0)


def _model(nodes, shape, inits=(), opset=21, outputs=("y",)):
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _run(model, x):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _layer_norm(axis, shape, mean_output=False):
    from onnx import helper

    scale = RNG.uniform(0.5, 1.5, shape[axis:]).astype(np.float32)
    bias = RNG.standard_normal(shape[axis:]).astype(np.float32)
    outputs = ["y", "mean"] if mean_output else ["y"]
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"], outputs, name="ln", axis=axis)
    return _model([node], shape, [("scale", scale), ("bias", bias)], outputs=outputs), "LayerNormalization ln"


def _group_norm(shape):
    from onnx import helper

    channels = shape[1]
    inits = [("scale", RNG.uniform(0.5, 1.5, channels).astype(np.float32)), ("bias", RNG.standard_normal(channels).astype(np.float32))]
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], name="gn", num_groups=2, epsilon=1e-5)
    return _model([node], shape, inits), "GroupNormalization gn"


def _instance_norm(shape):
    from onnx import helper

    channels = shape[1]
    inits = [("scale", RNG.uniform(0.5, 1.5, channels).astype(np.float32)), ("bias", RNG.standard_normal(channels).astype(np.float32))]
    node = helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"], name="inorm")
    return _model([node], shape, inits), "InstanceNormalization inorm"


def _decomposed(shape, *, mean_read_elsewhere=False):
    """The exported form of a LayerNorm before opset 17: x - mean(x), mean of its square, rsqrt."""
    from onnx import helper

    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=[-1]),
             helper.make_node("Sub", ["x", "m"], ["d"], name="centre"),
             helper.make_node("Mul", ["d", "d"], ["d2"]), helper.make_node("ReduceMean", ["d2"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["y0"])]
    nodes.append(helper.make_node("Add", ["y0", "m"], ["y"]) if mean_read_elsewhere else helper.make_node("Identity", ["y0"], ["y"]))
    return _model(nodes, shape, [("eps", np.array(1e-5, np.float32))], opset=17), "Sub centre"


CASES = {
    "layer norm, last axis": lambda: _layer_norm(-1, (2, 4, 192)),
    "layer norm, two axes named from the front": lambda: _layer_norm(1, (2, 6, 32)),
    "layer norm with its Mean output": lambda: _layer_norm(-1, (2, 4, 80), mean_output=True),
    "group norm": lambda: _group_norm((2, 8, 6, 6)),
    "instance norm": lambda: _instance_norm((2, 4, 6, 6)),
    "decomposed layer norm (x - mean(x))": lambda: _decomposed((2, 4, 192)),
}


@pytest.mark.parametrize("case", CASES)
def test_the_shifted_norm_computes_what_the_norm_did(case):
    model, label = CASES[case]()
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    rewritten = shift(IRModel(model, [], []))
    assert rewritten.nodes == [label] and rewritten.skipped == []
    assert normalisations(model) == [label] and len(model.graph.node) < len(rewritten.ir.model.graph.node)
    x = (RNG.standard_normal(shape) * 3 + 40).astype(np.float32)
    for before, after in zip(_run(model, x), _run(rewritten.ir.model, x), strict=True):
        np.testing.assert_allclose(after, before, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("case", [c for c in CASES if "Mean" not in c])
@pytest.mark.parametrize("value", [DB_FLOOR, LOG_FLOOR, 777.7771])
def test_a_constant_frame_reaches_the_norm_as_exact_zeros(case, value):
    """Each group of the frame is one value: x - x₀ is exactly 0, so the normalised values are 0 in
    ONNX Runtime's kernels, and the output what the norm's bias makes of zeros."""
    model, _ = CASES[case]()
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    zeros = _run(shift(IRModel(model, [], [])).ir.model, np.zeros(shape, np.float32))[0]
    got = _run(shift(IRModel(model, [], [])).ir.model, np.full(shape, value, np.float32))[0]
    assert np.array_equal(got, zeros)


def test_a_mean_read_elsewhere_is_left_alone_with_the_reason():
    model, _ = _decomposed((2, 4, 16), mean_read_elsewhere=True)
    rewritten = shift(IRModel(model, [], []))
    assert rewritten.nodes == [] and rewritten.ir.model is model
    assert rewritten.skipped == ["Sub centre: its mean is read elsewhere than by x - mean"]


def test_a_graph_without_a_norm_is_not_copied():
    from onnx import helper

    model = _model([helper.make_node("Relu", ["x"], ["y"])], (2, 3))
    assert normalisations(model) == [] and shift(IRModel(model, [], [])).ir.model is model


# --- the PyTorch modules the ExecuTorch and litert-torch routes convert --------------------------

def _torch_norms():
    import torch

    class Instance(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.InstanceNorm2d(4, affine=True)

        def forward(self, x):
            return self.norm(x)

    torch.manual_seed(0)
    return {"layer": (torch.nn.LayerNorm(192), (2, 16, 192), lambda m: m.bias),
            "group": (torch.nn.GroupNorm(2, 8), (2, 8, 6, 6), lambda m: m.bias.view(1, 8, 1, 1)),
            "instance": (Instance(), (2, 4, 6, 6), lambda m: m.norm.bias.view(1, 4, 1, 1))}


@pytest.mark.parametrize("norm", ["layer", "group", "instance"])
@pytest.mark.parametrize("form", ["eager", "pt2 graph module", "decomposed"])
def test_the_shifted_module_exports_the_shift_and_gives_the_bias_on_a_constant_frame(norm, form):
    """`Shifted` catches the norm as the module calls it (F.layer_norm, aten.layer_norm, or the
    aten.native_* ops of a decomposed program), and torch.export traces the subtraction in."""
    import torch

    from modelport.emitters.norm_shift_torch import Shifted

    module, shape, bias = _torch_norms()[norm]
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(0.5, 1.5)
    inner = module.eval()
    if form != "eager":
        program = torch.export.export(module, (torch.randn(*shape),))
        inner = (program.run_decompositions() if form == "decomposed" else program).module()
    wrapped = Shifted(inner)
    exported = torch.export.export(wrapped, (torch.randn(*shape),))
    if form == "decomposed" and norm == "instance":  # decomposed to plain reductions: no norm op left to catch
        assert wrapped.shifted() == []
        return
    assert wrapped.shifted() and "aten.sub.Tensor" in {str(n.target) for n in exported.graph.nodes}
    x = torch.randn(*shape) * 3 + 40
    torch.testing.assert_close(exported.module()(x), module(x), atol=2e-5, rtol=1e-5)
    frame = torch.full(shape, DB_FLOOR)
    assert torch.equal(exported.module()(frame), bias(module).expand(shape).detach())
