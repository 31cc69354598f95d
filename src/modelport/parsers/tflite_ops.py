"""What tf2onnx needs beyond its own TFLite reader: dense weights and a few TFLite-only ops.

Runs inside the TFLite parser's child process (parsers/tflite.py), on the user's file read as data.

- **Sparse weights** (mediapipe's `*_sparse.tflite`): a constant stored in TFLite's sparse format
  (per-dimension DENSE / SPARSE_CSR metadata, optional blocks) feeding a `DENSIFY` op. tf2onnx
  reads the compressed buffer as if it were dense ("cannot reshape array of size 77 into shape
  (8,1,1,32)"). `readable_copy` writes a copy of the file whose sparse constants are expanded to
  dense buffers and whose `DENSIFY` ops are bypassed; the user's file is never changed.
- **Recurrent state** (Keras' `LSTM` as the fused `UNIDIRECTIONAL_SEQUENCE_LSTM`): its initial
  hidden and cell states are variable tensors with no data, which tf2onnx cannot find a producer
  for ("Cannot find node with output 'arith.constant14'"). One inference starts from zeros, so
  the copy holds them as zero constants.
- **`Convolution2DTransposeBias`** (mediapipe's custom op: transposed convolution plus bias, its
  options a raw `{padding, stride_w, stride_h}` int32 struct) becomes ONNX `ConvTranspose`.
- **`UNIDIRECTIONAL_SEQUENCE_LSTM`** (a Keras LSTM through TFLite's converter), which tf2onnx
  1.17 lacks, becomes ONNX `LSTM` (the plain form; peepholes, projection, layer norm are named).
- **`GELU`** (a TFLite builtin tf2onnx 1.17 lacks) becomes ONNX `Gelu` from opset 20, else its
  formula (erf, or tanh when the op's `approximate` flag is set).

Other ops tf2onnx cannot convert stay unconverted and are named, with their count, by
`tf_common.check_converted` (exit 2).
"""

from __future__ import annotations

import struct
from functools import partial
from pathlib import Path

import numpy as np

DENSIFY = 124  # BuiltinOperator.DENSIFY
TENSOR_DTYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 7: np.int16, 9: np.int8,
                 10: np.float64}
TRANSPOSE_CONV_BIAS = "Convolution2DTransposeBias"
PADDING = {1: "SAME", 2: "VALID"}  # TfLitePadding


def _index_vector(vector) -> np.ndarray:
    """The values of a SparseIndexVector union (Int32Vector, Uint16Vector, Uint8Vector)."""
    return np.asarray(getattr(vector, "values", None) if vector is not None else [], dtype=np.int64)


def densify(values: np.ndarray, shape: list[int], sparsity) -> np.ndarray:
    """The dense array a sparse TFLite constant stands for.

    The levels follow `traversalOrder` over the tensor's dims followed by its block dims; a DENSE
    level of size n multiplies the running position by n, a SPARSE_CSR level walks
    `arraySegments[pos]:arraySegments[pos+1]` of `arrayIndices`. At the last level the running
    position indexes `values`. A block dim k is the inner part of dim `blockMap[k]`.
    """
    order = [int(x) for x in sparsity.traversalOrder]
    block_map = [int(x) for x in (sparsity.blockMap if sparsity.blockMap is not None else [])]
    levels = sparsity.dimMetadata
    rank = len(shape)
    block_size = {}
    for level, dim in enumerate(order):
        if dim >= rank:
            block_size[block_map[dim - rank]] = int(levels[level].denseSize)
    dense = np.zeros(shape, dtype=values.dtype)
    expanded = [0] * len(order)

    def visit(level: int, pos: int) -> None:
        meta = levels[level]
        if meta.format == 0:  # DENSE
            entries = ((i, pos * int(meta.denseSize) + i) for i in range(int(meta.denseSize)))
        else:  # SPARSE_CSR
            segments, indices = _index_vector(meta.arraySegments), _index_vector(meta.arrayIndices)
            entries = ((int(indices[j]), j) for j in range(int(segments[pos]), int(segments[pos + 1])))
        for index, nxt in entries:
            expanded[order[level]] = index
            if level + 1 < len(order):
                visit(level + 1, nxt)
            else:
                coord = [expanded[d] * block_size[d] + expanded[rank + block_map.index(d)] if d in block_size else expanded[d]
                         for d in range(rank)]
                dense[tuple(coord)] = values[nxt]

    visit(0, 0)
    return dense


def readable_copy(path: Path, work: Path) -> Path:
    """`path` itself when tf2onnx reads it as it is, else a copy in `work` with sparse constants made
    dense and the zero initial state of stateful ops (variable tensors without data) made constant."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(path))
    changed = False
    for graph in model.subgraphs:
        for tensor in graph.tensors:
            if tensor.sparsity is None:
                continue
            buffer = model.buffers[tensor.buffer]
            dtype = TENSOR_DTYPES[int(tensor.type)]
            values = np.frombuffer(bytes(np.asarray(buffer.data, dtype=np.uint8)), dtype=dtype)
            dense = densify(values, [int(d) for d in tensor.shape], tensor.sparsity)
            buffer.data = np.frombuffer(dense.tobytes(), dtype=np.uint8)
            tensor.sparsity = None
            changed = True
        produced = {int(o) for op in graph.operators for o in op.outputs}
        for tensor_index, tensor in enumerate(graph.tensors):
            data = model.buffers[tensor.buffer].data if tensor.buffer < len(model.buffers) else None
            if tensor.isVariable and tensor_index not in produced and (data is None or len(data) == 0):
                buffer = type(model.buffers[0])()
                zeros = np.zeros([int(d) for d in tensor.shape], dtype=TENSOR_DTYPES[int(tensor.type)])
                buffer.data = np.frombuffer(zeros.tobytes(), dtype=np.uint8)
                model.buffers.append(buffer)
                tensor.buffer = len(model.buffers) - 1
                tensor.isVariable = False
                changed = True
        bypass = {}
        kept = []
        for op in graph.operators:
            code = model.operatorCodes[op.opcodeIndex]
            if max(int(code.builtinCode), int(code.deprecatedBuiltinCode)) == DENSIFY:
                bypass[int(op.outputs[0])] = int(op.inputs[0])
            else:
                kept.append(op)
        if bypass:
            for op in kept:
                op.inputs = [bypass.get(int(i), int(i)) for i in op.inputs]
            graph.outputs = [bypass.get(int(i), int(i)) for i in graph.outputs]
            graph.operators = kept
            changed = True
    if not changed:
        return path
    out = work / "dense.tflite"
    flatbuffer_utils.write_model(model, str(out))
    return out


def custom_op_params(path: Path) -> dict[str, dict]:
    """{output tensor name: options} of each `Convolution2DTransposeBias` in the file."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(path))
    found = {}
    for graph in model.subgraphs:
        for op in graph.operators:
            code = model.operatorCodes[op.opcodeIndex]
            if (code.customCode or b"").decode(errors="replace") != TRANSPOSE_CONV_BIAS or op.customOptions is None:
                continue
            raw = bytes(np.asarray(op.customOptions, dtype=np.uint8))
            if len(raw) < 12:
                continue
            padding, stride_w, stride_h = struct.unpack("<iii", raw[:12])
            name = graph.tensors[int(op.outputs[0])].name.decode(errors="replace")
            found[name] = {"padding": PADDING.get(padding, "SAME"), "strides": [stride_h, stride_w]}
    return found


def _transpose_conv_bias(params: dict, ctx, node, name, args):
    """NHWC input, OHWI weights, bias -> ONNX ConvTranspose between NHWC<->NCHW transposes."""
    from tf2onnx.onnx_opset.nn import conv_convert_inputs

    options = params.get(node.output[0])
    if options is None:
        raise ValueError(f"{TRANSPOSE_CONV_BIAS} '{node.output[0]}' without readable options")
    kernel = ctx.get_shape(node.input[1])
    if kernel is None or len(kernel) != 4 or any(d is None or d < 0 for d in kernel[1:3]):
        raise ValueError(f"{TRANSPOSE_CONV_BIAS} '{node.output[0]}': unknown kernel shape {kernel}")
    kh, kw = int(kernel[1]), int(kernel[2])
    sh, sw = options["strides"]
    # OHWI -> HWOI, TensorFlow's Conv2DBackpropInput kernel layout, which conv_convert_inputs turns into ONNX's IOHW
    perm = ctx.insert_new_node_on_input(node, "Transpose", node.input[1], perm=[1, 2, 0, 3])
    perm.skip_conversion = True
    node.type = "ConvTranspose"
    node.set_attr("data_format", "NHWC")
    conv_convert_inputs(ctx, node, with_kernel=True)
    node.attr.pop("data_format", None)
    pads = [0, 0, 0, 0]
    if options["padding"] == "SAME":
        # output = input * stride; TFLite puts the smaller half of the padding first
        th, tw = max(kh - sh, 0), max(kw - sw, 0)
        pads = [th // 2, tw // 2, th - th // 2, tw - tw // 2]
    node.set_attr("kernel_shape", [kh, kw])
    node.set_attr("strides", [sh, sw])
    node.set_attr("pads", pads)


def _gelu(ctx, node, name, args):
    """GELU(x) = x/2 (1 + erf(x/sqrt 2)); with `approximate`, x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    from tf2onnx import utils

    approximate = bool(node.get_attr_value("approximate", 0))
    x = node.input[0]
    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(x))
    if ctx.opset >= 20:
        node.type = "Gelu"
        node.attr.clear()
        node.set_attr("approximate", "tanh" if approximate else "none")
        return

    def const(value):
        return ctx.make_const(utils.make_name(f"{name}_c"), np.array(value, dtype=dtype)).output[0]

    def op(kind, *inputs):
        return ctx.make_node(kind, list(inputs), op_name_scope=name).output[0]

    if approximate:
        inner = op("Mul", const(np.sqrt(2 / np.pi)), op("Add", x, op("Mul", const(0.044715), op("Mul", x, op("Mul", x, x)))))
        core = op("Tanh", inner)
    else:
        core = op("Erf", op("Mul", x, const(1 / np.sqrt(2))))
    half = op("Mul", x, const(0.5))
    node.type = "Mul"
    node.attr.clear()
    ctx.replace_inputs(node, [half, op("Add", core, const(1.0))])


def _sequence_lstm(ctx, node, name, args):
    """TFLite's fused `UNIDIRECTIONAL_SEQUENCE_LSTM` (Keras' LSTM) -> ONNX `LSTM`.

    tf2onnx drops the op's absent optional inputs, so the plain LSTM (no CIFG, peepholes,
    projection or layer norm) arrives with 15: x, 4 input weights (i, f, c, o), 4 recurrent
    weights, 4 biases, h0, c0. ONNX stacks the gates as i, o, f, c in W [1,4H,I], R [1,4H,H] and
    B [1,8H] (input biases, then recurrent ones: zero), and runs time-major: Y [T,1,B,H].
    """
    from tf2onnx import utils
    from tf2onnx.graph_builder import GraphBuilder

    if len(node.input) != 15:
        raise ValueError(f"UNIDIRECTIONAL_SEQUENCE_LSTM '{node.output[0]}' with {len(node.input)} inputs (peepholes, CIFG, "
                         "projection or layer norm) has no ONNX translation here")
    if node.get_attr_value("fused_activation_function", "TANH") not in ("TANH", b"TANH"):
        raise ValueError(f"UNIDIRECTIONAL_SEQUENCE_LSTM '{node.output[0]}' with a non-tanh activation")

    def value(k):
        producer = ctx.get_node_by_output(node.input[k])
        if producer is None or not producer.is_const():
            raise ValueError(f"UNIDIRECTIONAL_SEQUENCE_LSTM '{node.output[0]}': input {k} is not a constant")
        return producer.get_tensor_value(as_list=False)

    order = [0, 3, 1, 2]  # TFLite i, f, c, o -> ONNX i, o, f, c
    w = np.concatenate([value(1 + g) for g in order])[None]
    r = np.concatenate([value(5 + g) for g in order])[None]
    b = np.concatenate([np.concatenate([value(9 + g) for g in order]), np.zeros(4 * r.shape[2], w.dtype)])[None]
    hidden = int(r.shape[2])
    states = [np.asarray(value(k))[None] for k in (13, 14)]  # [B,H] -> [1,B,H]
    time_major = bool(node.get_attr_value("time_major", 0))
    x = node.input[0]
    if not time_major:
        x = ctx.make_node("Transpose", [x], attr={"perm": [1, 0, 2]}, op_name_scope=name).output[0]

    def const(array):
        return ctx.make_const(utils.make_name(f"{name}_c"), np.ascontiguousarray(array)).output[0]

    attr = {"hidden_size": hidden}
    clip = float(node.get_attr_value("cell_clip", 0.0) or 0.0)
    if clip > 0:
        attr["clip"] = clip
    lstm = ctx.make_node("LSTM", [x, const(w), const(r), const(b), "", const(states[0]), const(states[1])],
                         attr=attr, output_count=3, op_name_scope=name)
    y = GraphBuilder(ctx).make_squeeze({"data": lstm.output[0], "axes": [1]}, op_name_scope=name)
    node.type = "Transpose" if not time_major else "Identity"
    node.attr.clear()
    if not time_major:
        node.set_attr("perm", [1, 0, 2])
    ctx.replace_inputs(node, [y])


def handlers(path: Path) -> dict:
    """tf2onnx custom op handlers for the file: {TFLite op as tf2onnx names it: (handler, args)}."""
    return {f"TFL_{TRANSPOSE_CONV_BIAS}": (partial(_transpose_conv_bias, custom_op_params(path)), []),
            "TFL_GELU": (_gelu, []), "TFL_UNIDIRECTIONAL_SEQUENCE_LSTM": (_sequence_lstm, [])}
