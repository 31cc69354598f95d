"""Shape inference: types and shapes of intermediate values, written into `value_info`.

onnx-ir's pass leaves the model unchanged when inference fails, and strips initializers before
calling onnx, so models over 2 GB go through it too.
"""

from __future__ import annotations

from modelport.optimize.onnx_ir_pass import OnnxIRPass


class ShapeInferencePass(OnnxIRPass):
    name = "shape"
    description = "ONNX shape and type inference (value_info)"

    def transform(self, model):
        import onnx_ir.passes.common as common

        known = sum(1 for v in _values(model) if v.shape is not None)
        result = common.ShapeInferencePass(strict_mode=False)(model)
        after = sum(1 for v in _values(result.model) if v.shape is not None)
        return after != known, {"shaped_values": after}


def _values(model):
    for node in model.graph.all_nodes() if hasattr(model.graph, "all_nodes") else model.graph:
        yield from node.outputs
