"""Activations and softmax-like ops, written as the torch / torch.nn.functional calls a person would use."""

from __future__ import annotations

from modelport.emitters.pytorch_code.registry import CONVERTERS

SIMPLE = {"Relu": "torch.relu", "Sigmoid": "torch.sigmoid", "Tanh": "torch.tanh", "Softsign": "F.softsign",
          "Softplus": "F.softplus", "HardSwish": "F.hardswish", "Mish": "F.mish"}
SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


@CONVERTERS.register(tuple(SIMPLE))
def simple(n):
    fn = SIMPLE[n.op_type]
    if fn.startswith("F."):
        n.use("F")
    n.emit(f"{fn}({n.t(0)})")


@CONVERTERS.register("LeakyRelu")
def leaky_relu(n):
    n.use("F")
    n.emit(f"F.leaky_relu({n.t(0)}, {n.gen.literal(n.attr('alpha', 0.01))})")


@CONVERTERS.register("Elu")
def elu(n):
    n.use("F")
    alpha = n.attr("alpha", 1.0)
    n.emit(f"F.elu({n.t(0)})" if alpha == 1.0 else f"F.elu({n.t(0)}, alpha={n.gen.literal(alpha)})")


@CONVERTERS.register("Celu")
def celu(n):
    n.use("F")
    n.emit(f"F.celu({n.t(0)}, alpha={n.gen.literal(n.attr('alpha', 1.0))})")


@CONVERTERS.register("Selu")
def selu(n):
    alpha, gamma = n.attr("alpha", SELU_ALPHA), n.attr("gamma", SELU_GAMMA)
    x = n.t(0)
    if abs(alpha - SELU_ALPHA) < 1e-6 and abs(gamma - SELU_GAMMA) < 1e-6:
        n.use("F")
        n.emit(f"F.selu({x})")
    else:
        a, g = n.gen.literal(alpha), n.gen.literal(gamma)
        n.emit(f"{g} * torch.where({x} > 0, {x}, {a} * (torch.exp({x}) - 1))")


@CONVERTERS.register("Gelu")
def gelu(n):
    n.use("F")
    approx = n.attr("approximate", "none")
    n.emit(f"F.gelu({n.t(0)})" if approx == "none" else f'F.gelu({n.t(0)}, approximate="tanh")')


@CONVERTERS.register("HardSigmoid")
def hard_sigmoid(n):
    alpha, beta = n.attr("alpha", 0.2), n.attr("beta", 0.5)
    n.emit(f"torch.clamp({n.t(0)} * {n.gen.literal(alpha)} + {n.gen.literal(beta)}, 0, 1)")


@CONVERTERS.register("PRelu")
def prelu(n):
    x = n.t(0)
    n.emit(f"torch.where({x} < 0, {x} * {n.t(1)}, {x})")


@CONVERTERS.register("ThresholdedRelu")
def thresholded_relu(n):
    x = n.t(0)
    n.emit(f"torch.where({x} > {n.gen.literal(n.attr('alpha', 1.0))}, {x}, 0)")


@CONVERTERS.register("Shrink")
def shrink(n):
    x = n.t(0)
    lambd, bias = n.gen.literal(n.attr("lambd", 0.5)), n.gen.literal(n.attr("bias", 0.0))
    n.emit(f"torch.where({x} < -{lambd}, {x} + {bias}, torch.where({x} > {lambd}, {x} - {bias}, 0)).to({x}.dtype)")


@CONVERTERS.register("Swish")
def swish(n):
    x = n.t(0)
    alpha = n.attr("alpha", 1.0)
    n.emit(f"{x} * torch.sigmoid({x})" if alpha == 1.0 else f"{x} * torch.sigmoid({n.gen.literal(alpha)} * {x})")


def _softmax(n, fn: str):
    x = n.t(0)
    rank = n.rank(0)
    if n.opset >= 13:
        axis = n.attr("axis", -1)
        n.emit(f"torch.{fn}({x}, dim={axis})")
        return
    # Before opset 13 the input is flattened to 2-D at `axis` and normalised over the second part.
    axis = n.attr("axis", 1)
    if rank is not None and n.axis(axis, rank) == rank - 1:
        n.emit(f"torch.{fn}({x}, dim=-1)")
        return
    n.emit(f"torch.{fn}({x}.flatten({axis}), dim=-1).reshape({x}.shape)" if axis not in (0,) else
           f"torch.{fn}({x}.reshape(1, -1), dim=-1).reshape({x}.shape)")


@CONVERTERS.register("Softmax")
def softmax(n):
    _softmax(n, "softmax")


@CONVERTERS.register("LogSoftmax")
def log_softmax(n):
    _softmax(n, "log_softmax")


@CONVERTERS.register("Hardmax")
def hardmax(n):
    x = n.t(0)
    if n.opset < 13:
        axis = n.attr("axis", 1)
        rank = n.rank(0)
        if rank is None or n.axis(axis, rank) != rank - 1:
            n.fail("Hardmax before opset 13 on an axis other than the last")
        axis = -1
    else:
        axis = n.attr("axis", -1)
    n.emit(f"torch.zeros_like({x}).scatter({axis}, {x}.argmax({axis}, keepdim=True), 1)")
