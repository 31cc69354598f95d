"""modelport's own ONNX → TensorFlow lowering: the IR's graph run node by node as TensorFlow ops
(`emitters/onnx_tf_ops.py`, `emitters/onnx_tf_math.py`), behind the same interface as onnx2tf's
model (`tf_model.build`), so the SavedModel, TFLite and TF.js targets can take it where onnx2tf
cannot convert a model.

Why: onnx2tf 1.28.8 converts a graph op by op while moving it to channels-last, and its layout
inference needs each tensor's rank and often its sizes; a transformer encoder exported from
PyTorch computes its attention reshapes from `Shape` at run time, and onnx2tf stops there
("Cannot take the length of shape with unknown rank"), with dynamic dims or without. This lowering
keeps the ONNX layout and computes shapes as the graph does, so dims declared dynamic stay dynamic
(`None` in the signature, -1 in a TF.js graph model's). It converts nothing to channels-last:
its model takes and returns the contract's layouts.

Weights: initializers of more than `VARIABLE_FROM` elements become `tf.Variable`s tracked by the
model (a SavedModel stores them as variables; the TF.js writer freezes them into its shards),
smaller ones numpy constants that fold into the graph.
"""

from __future__ import annotations

import numpy as np

from modelport.emitters import onnx_tf_math, onnx_tf_ops  # noqa: F401 (each registers its ops into OPS when imported)
from modelport.emitters.onnx_tf_common import ONNX_DTYPES, OPS
from modelport.emitters.op_registry import OpRegistry
from modelport.errors import UnsupportedError, one_line
from modelport.ir import IRModel

NAME = "modelport ONNX lowering"
VARIABLE_FROM = 64


def ops() -> OpRegistry:
    """The lowering's registry (`onnx_tf_common.OPS`: ONNX op type and opset range -> its TensorFlow
    form), with every op loaded (`onnx_tf_ops.py`: tensor and shape ops; `onnx_tf_math.py`: math,
    normalisation and window ops; each registers when imported)."""

    return OPS


def _opset(model) -> int:
    """The model's ai.onnx opset, the one its nodes' functions are looked up at (13 when it names none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)


def missing_ops(model) -> list[str]:
    """The op types of `model`'s graph the lowering has no function for at its opset, sorted (custom domains too)."""
    known, opset = ops(), _opset(model)
    return sorted({n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                   for n in model.graph.node if known.find(n.op_type, opset, n.domain) is None})


def converter_name(model) -> str:
    """The converter that made a TensorFlow model from `tf_model.build`, as the report names it."""
    from modelport.deps import version_of

    failure = getattr(model, "onnx2tf_failure", None)
    if failure is None:
        return f"onnx2tf {version_of('onnx2tf')}"
    return f"{NAME} (onnx2tf {version_of('onnx2tf')} failed: {one_line(failure, 200)})"


def _attributes(node) -> dict:
    from onnx import helper, numpy_helper

    at = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if a.type == a.TENSOR:
            v = numpy_helper.to_array(v)
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        at[a.name] = v
    return at


def lowered_model(tf, ir: IRModel, input_perms: dict[str, list[int]] | None = None):
    """A tf.Module standing where onnx2tf's Keras model stands: `inputs` and `outputs` (TensorSpecs
    in the contract's order; dynamic dims None), called with a list of input tensors (each in the
    file's layout; `input_perms` maps a name to the permutation that takes it back to the
    source's) and returning the list of outputs. Raises UnsupportedError naming the ops it lacks."""
    from onnx import numpy_helper


    table = ops()
    model = ir.model
    lacking = missing_ops(model)
    if lacking:
        raise UnsupportedError(f"the {NAME} has no TensorFlow form for {', '.join(lacking)}")
    opset = _opset(model)
    input_perms = input_perms or {}
    graph = model.graph
    nodes = [(n, _attributes(n), table.lookup(n.op_type, opset, n.domain).fn) for n in graph.node]
    by_name = {v.name: v for v in graph.input}

    class Lowered(tf.Module):
        def __init__(self):
            super().__init__(name="onnx_lowered")
            consts, variables = {}, {}
            for t in graph.initializer:
                a = numpy_helper.to_array(t)
                if a.size > VARIABLE_FROM and a.dtype.kind == "f":
                    variables[t.name] = tf.Variable(a, trainable=False, name=f"w{len(variables)}")
                else:
                    consts[t.name] = a
            self._consts = consts
            self._variables = variables
            self.weights = list(variables.values())
            self.inputs = []
            for spec in ir.inputs:
                shape = [d if isinstance(d, int) else None for d in spec.shape]
                perm = input_perms.get(spec.name)
                if perm:
                    shape = [shape[k] for k in perm]
                self.inputs.append(tf.TensorSpec(shape, tf.as_dtype(spec.dtype), name=spec.name))
            self.outputs = [tf.TensorSpec([d if isinstance(d, int) else None for d in s.shape], tf.as_dtype(s.dtype), name=s.name)
                            for s in ir.outputs]

        def __call__(self, xs, training=False):
            return tf.autograph.experimental.do_not_convert(self._run)(xs)

        def _run(self, xs):
            vals = dict(self._consts)
            vals.update(self._variables)
            for spec, x in zip(ir.inputs, xs, strict=True):
                x = tf.convert_to_tensor(x)
                perm = input_perms.get(spec.name)
                if perm:
                    x = tf.transpose(x, list(np.argsort(perm)))
                declared = by_name.get(spec.name)
                want = ONNX_DTYPES.get(declared.type.tensor_type.elem_type) if declared is not None else None
                vals[spec.name] = tf.cast(x, want) if want and x.dtype.name != want else x
            for node, at, fn in nodes:
                ins = [None if name == "" else _value(tf, vals, name, node) for name in node.input]
                try:
                    outs = fn(tf, node, ins, at, opset)
                except UnsupportedError:
                    raise
                except Exception as e:
                    raise UnsupportedError(f"the {NAME} failed at {node.op_type} node '{node.name}': "
                                           f"{one_line(e, 300, typed=True)}", detail=str(e)[:4000]) from None
                for name, v in zip(node.output, outs, strict=False):
                    if name:
                        vals[name] = v
            return [tf.convert_to_tensor(_value(tf, vals, o.name, None)) for o in graph.output]

    return Lowered()


def _value(tf, vals: dict, name: str, node):
    try:
        v = vals[name]
    except KeyError:
        where = f" (input of {node.op_type} node '{node.name}')" if node is not None else ""
        raise UnsupportedError(f"the graph's tensor '{name}'{where} is produced by no node before it") from None
    if isinstance(v, tf.Variable):
        return tf.convert_to_tensor(v)
    return v
