"""Dequantised weights: a quantised graph's integer weights folded to float initializers.

A dynamic-range quantised source (a TFLite file converted with Optimize.DEFAULT and no
representative dataset) stores its weights in int8 and widens them at run time; its IR holds each
one as `DequantizeLinear(x, scale, zero_point)` on initializers, and tf2onnx writes the hybrid
kernels' run-time quantisation of a fully connected layer's activations as
`DynamicQuantizeLinear → DequantizeLinear`. onnxruntime runs that graph as it is, and an ONNX
artifact keeps the int8 weights (a quarter of the bytes). What takes float weights does not: the
PyTorch code generator (and the targets reached through it), the FP16 converter (it would give the
weights' DequantizeLinear an fp16 scale, which no runtime loads) and onnxruntime's INT8 quantiser
(it expects each MatMul/Conv weight to be an initializer). For those this pass writes the float
graph the quantised one stands for:

    y = (x - zero_point) * scale          ONNX DequantizeLinear, computed as onnxruntime does

with `scale` and `zero_point` a scalar (per tensor), a 1-D tensor along `axis` (per channel) or,
with `block_size`, blocks along `axis`; a missing zero point is 0. The float initializer takes the
DequantizeLinear's output name and the scale's type. A `DynamicQuantizeLinear → DequantizeLinear`
pair on an activation is dropped (its consumer reads the float value): a float target computes in
float, and the source's outputs carry that rounding anyway (they are judged with the int8
tolerances of a dynamic-range source). A DequantizeLinear whose output is a graph output is left.

Targets declare that they take float weights (`Target.float_weights`), passes that they start
from a float graph (`Pass.float_weights`); `before_float_passes` puts this pass before the first
such pass, and the convert pipeline's optimisation stage runs it for such targets only, so an ONNX
artifact at fp32 keeps the int8 weights.
"""

from __future__ import annotations

from modelport.optimize import Pass, get_pass
from modelport.optimize.onnx_ir_pass import OnnxIRPass

_DOMAINS = ("", "ai.onnx")


def quantised(model) -> bool:
    """Whether a ModelProto's graph has what this pass folds: a DequantizeLinear of an initializer,
    or a DynamicQuantizeLinear (read from the graph's structure, no tensor data)."""
    initializers = {t.name for t in model.graph.initializer}
    return any(n.domain in _DOMAINS and ((n.op_type == "DequantizeLinear" and n.input and n.input[0] in initializers)
                                         or n.op_type == "DynamicQuantizeLinear")
               for n in model.graph.node)


def before_float_passes(passes: list[Pass], model) -> list[Pass]:
    """`passes` with this pass before the first one that takes a float graph (`Pass.float_weights`),
    when `model` has quantised weights; else `passes` as they are."""
    first = next((i for i, p in enumerate(passes) if p.float_weights), None)
    if first is None or not quantised(model):
        return passes
    return [*passes[:first], get_pass("dequantize"), *passes[first:]]


def dequantized(x, scale, zero_point=None, *, axis: int = 1, block_size: int = 0):
    """DequantizeLinear's output on numpy arrays, in `scale`'s dtype."""
    import numpy as np

    def along(t):  # a scale or zero point broadcast against x
        t = np.asarray(t)
        if t.ndim == 0 or (t.size == 1 and t.ndim == 1):
            return t.reshape(())
        if block_size:
            return np.take(np.repeat(t, block_size, axis=axis), np.arange(x.shape[axis]), axis=axis)
        shape = [1] * x.ndim
        shape[axis] = t.size
        return t.reshape(shape)

    if np.issubdtype(x.dtype, np.integer):
        shifted = x.astype(np.int64) - (along(zero_point).astype(np.int64) if zero_point is not None else 0)
    else:  # float8 and the like: no zero point but 0
        shifted = x.astype(np.float32) - (along(zero_point).astype(np.float32) if zero_point is not None else 0)
    return (shifted.astype(np.float32) * along(scale).astype(np.float32)).astype(np.asarray(scale).dtype)


class DequantizeWeightsPass(OnnxIRPass):
    name = "dequantize"
    description = "integer weights (DequantizeLinear of initializers) folded to float; run-time activation quantisation dropped"

    def transform(self, model):
        import onnx_ir as ir
        import onnx_ir.passes.common as common

        graph = model.graph
        outputs = {id(v) for v in graph.outputs}
        weights = per_channel = activations = 0
        for node in list(graph):
            if node.op_type != "DequantizeLinear" or node.domain not in _DOMAINS or id(node.outputs[0]) in outputs:
                continue
            inputs = [v for v in node.inputs if v is not None]
            out = node.outputs[0]
            if _round_trip(inputs):
                out.replace_all_uses_with(inputs[0].producer().inputs[0])
                graph.remove(node, safe=True)
                activations += 1
                continue
            if not all(v.is_initializer() and not v.is_graph_input() and v.const_value is not None for v in inputs):
                continue
            arrays = [v.const_value.numpy() for v in inputs]
            axis = node.attributes.get_int("axis", 1)
            values = dequantized(*arrays, axis=axis % max(arrays[0].ndim, 1), block_size=node.attributes.get_int("block_size", 0))
            folded = ir.Value(name=out.name, shape=ir.Shape(values.shape), type=ir.TensorType(ir.DataType.from_numpy(values.dtype)),
                              const_value=ir.tensor(values, name=out.name))
            out.replace_all_uses_with(folded)
            graph.remove(node, safe=True)
            graph.register_initializer(folded)
            weights += 1
            per_channel += int(arrays[1].size > 1)
        if weights or activations:
            common.RemoveUnusedNodesPass()(model)
        return bool(weights or activations), {"initializers": weights, "per_channel": per_channel,
                                              "activation_round_trips": activations}


def _round_trip(inputs) -> bool:
    """Whether a DequantizeLinear's inputs are the three outputs of one DynamicQuantizeLinear, in order."""
    producer = inputs[0].producer() if inputs else None
    return (len(inputs) == 3 and producer is not None and producer.op_type == "DynamicQuantizeLinear"
            and producer.domain in _DOMAINS and list(producer.outputs) == inputs)
