"""The PyTorch code generator's converters: one `OpRegistry` (`emitters/op_registry.py`, the
convention the ONNX → TensorFlow lowering follows too), keyed by (domain, op type, opset range).

A converter is a function taking a `NodeView` (which carries the model's opset) and writing the
node's code through it. One module per op family registers its own with
`@CONVERTERS.register("Conv")` (optionally `since=`/`until=` opset bounds, `domain=`);
`default_table()` loads the families named in `FAMILIES`, so every entry can be found from here.
A duplicate (same op, overlapping opsets) is refused when it registers, and a failed lookup names
the domain, op and opset.
"""

from __future__ import annotations

import importlib

from modelport.emitters.op_registry import OpRegistry

FAMILIES = (
    "activation", "elementwise", "linear", "conv", "pooling", "normalization", "shape", "indexing",
    "reduce", "rnn", "resize", "control", "contrib",
)

CONVERTERS = OpRegistry("converter")


def default_table() -> OpRegistry:
    """`CONVERTERS` with every family in `FAMILIES` loaded (a family registers when imported)."""
    for family in FAMILIES:
        importlib.import_module(f"modelport.emitters.pytorch_code.{family}")
    return CONVERTERS
