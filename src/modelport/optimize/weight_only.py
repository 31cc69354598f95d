"""Weight-only quantisation of MatMul weights into onnxruntime's `MatMulNBits` (INT4 or INT8).

Decoder LMs spend decode time reading weights, not computing: storing each MatMul's constant
weight in 4 (or 8) bits with a scale (and, asymmetric, a zero point) per block of `block_size`
input channels cuts the bytes read 8x (4x) while activations stay float. onnxruntime's
`MatMulNBitsQuantizer` does the packing; this module only chooses its settings and counts what
changed. Accuracy is judged by the caller by generation (token agreement, worst logit error).

A model whose output projection is its embedding transposed (`tied`: the config ties them) keeps
one copy of that matrix, the quantised one: the embedding's Gather becomes `GatherBlockQuantized`
over the output projection's packed weight and scales (a Reshape of the same bytes), as
onnxruntime-genai's model builder writes it. Each row it gathers is the dequantised row the
projection multiplies by, exactly; the float table is gone from the artifact (with Qwen2.5-0.5B's
shape it was 544 MB of the int4 folder's 862 MB; 318 MB without it, the builder's 317 MB).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from modelport.deps import require
from modelport.errors import BadInputError
from modelport.onnxfile.external_data_files import DataFile
from modelport.onnxfile.proto_pieces import copy_fields
from modelport.optimize.weight_store import WeightStore
from modelport.run.progress import tick

BITS = {"int4": 4, "int8": 8}
BLOCK_SIZES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class WeightOnlyOptions:
    """`bits` 4 or 8, `block_size` input channels per scale, `symmetric` (no zero points),
    `accuracy_level` MatMulNBits' compute type: 4 (int8 activations, onnxruntime-genai's model
    builder's CPU default; measured 23x faster decode for int8 weights and 1.3x for int4 than
    without it on this CPU), 1 fp32, 0 or None onnxruntime's default."""

    bits: int = 4
    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int | None = 4

    def __post_init__(self):
        if self.bits not in BITS.values():
            raise BadInputError(f"weight-only quantisation takes 4 or 8 bits, not {self.bits}")
        if self.block_size not in BLOCK_SIZES:
            raise BadInputError(f"bad --block-size {self.block_size}; known: {', '.join(map(str, BLOCK_SIZES))}")
        if self.accuracy_level not in (None, 0, 1, 2, 3, 4):
            raise BadInputError(f"bad accuracy level {self.accuracy_level}: 0 to 4 (MatMulNBits' compute type)")


def float_matmuls(graph) -> list:
    """The MatMul nodes whose weight (second input) is a 2-D float initializer: what is quantised."""
    import onnx

    inits = {t.name: t for t in graph.initializer}
    return [n for n in graph.node if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and n.input[1] in inits
            and len(inits[n.input[1]].dims) == 2 and inits[n.input[1]].data_type == onnx.TensorProto.FLOAT]


def shared_embedding(graph, options: WeightOnlyOptions, targets) -> tuple | None:
    """(the embedding's Gather, the output projection's MatMul among `targets`) of a graph whose
    projection is the embedding transposed, or None: a Gather of a float [V, H] initializer at a
    graph input, and one target MatMul whose weight is [H, V] (the one whose output is the graph's
    when several are). Only symmetric blocks that divide H
    (GatherBlockQuantized reads the MatMulNBits layout as [V, H·bits/8] with the default zero point)."""
    import onnx

    if not options.symmetric:
        return None
    inits = {t.name: t for t in graph.initializer}
    inputs = {i.name for i in graph.input}
    gathers = [n for n in graph.node if n.op_type == "Gather" and n.domain in ("", "ai.onnx") and len(n.input) == 2
               and n.input[1] in inputs and n.input[0] in inits and len(inits[n.input[0]].dims) == 2
               and inits[n.input[0]].data_type == onnx.TensorProto.FLOAT
               and all(a.name != "axis" or a.i == 0 for a in n.attribute)]
    if len(gathers) != 1:
        return None
    vocab, hidden = inits[gathers[0].input[0]].dims
    if hidden % options.block_size:
        return None
    heads = [n for n in targets if list(inits[n.input[1]].dims) == [hidden, vocab]]
    if len(heads) > 1:  # a small model's other projections may have its shape: the one giving the logits
        outputs = {o.name for o in graph.output}
        heads = [n for n in heads if n.output[0] in outputs]
    return (gathers[0], heads[0]) if len(heads) == 1 else None


def gather_quantized(gather, packed: str, scales: str, vocab: int, hidden: int, options: WeightOnlyOptions):
    """The nodes and the shape initializer that replace `gather`: its rows read from a MatMulNBits
    weight (`packed` [V, blocks, blob], `scales` [V, blocks]) as GatherBlockQuantized reads them."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    name = gather.name or gather.output[0]
    shape = numpy_helper.from_array(np.array([vocab, hidden * options.bits // 8], np.int64), f"{name}/rows_shape")
    rows = onnx.helper.make_node("Reshape", [packed, shape.name], [f"{name}/rows"], name=f"{name}/rows")
    node = onnx.helper.make_node("GatherBlockQuantized", [rows.output[0], gather.input[1], scales], list(gather.output),
                                 name=name, domain="com.microsoft", bits=options.bits, block_size=options.block_size,
                                 gather_axis=0, quantize_axis=1)
    return [rows, node], shape


def quantize_weight_only(model, options: WeightOnlyOptions, *, in_place: bool = False, tied: bool = False):
    """(quantised ModelProto, details): every MatMul with a constant 2-D weight becomes MatMulNBits.
    The input model is not modified, unless `in_place`: then it is quantised where it is, and the
    caller must drop it (it holds the replaced float weights until it is freed).

    The result is a fresh proto holding only what the quantised graph uses: the quantiser replaces
    weights inside the proto it is given, and with the upb protobuf runtime the float weights it
    removed stay allocated for as long as that proto lives (optimize/weight_store.py), i.e. for as
    long as the quantised model would be kept (through emission and validation). `tied`: the
    embedding is read from the quantised output projection (module docstring)."""
    import onnx

    require("onnxruntime", purpose="weight-only quantisation")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
    if in_place:
        work = model
    else:
        work = onnx.ModelProto()
        work.CopyFrom(model)
    before = sum(1 for n in work.graph.node if n.op_type == "MatMul")
    pair = shared_embedding(work.graph, options, float_matmuls(work.graph)) if tied else None
    quantizer = MatMulNBitsQuantizer(work, bits=options.bits, block_size=options.block_size,
                                     is_symmetric=options.symmetric, accuracy_level=options.accuracy_level)
    quantizer.process()
    shared = _share_in_place(quantizer.model.model.graph, pair, options) if pair else False
    out = onnx.ModelProto()
    out.CopyFrom(quantizer.model.model)
    del quantizer, work
    after = sum(1 for n in out.graph.node if n.op_type == "MatMulNBits")
    if after == 0:
        raise BadInputError("no MatMul with a constant weight to quantise (weight-only quantisation needs them)")
    details = {"bits": options.bits, "block_size": options.block_size, "symmetric": options.symmetric,
               "accuracy_level": options.accuracy_level, "matmuls": before, "quantized": after}
    if shared:
        details["embedding"] = SHARED
    return out, details


SHARED = "read from the quantised output projection (GatherBlockQuantized)"


def _share_in_place(graph, pair, options: WeightOnlyOptions) -> bool:
    """In onnxruntime's quantised `graph`: the embedding Gather of `pair` replaced by its rows read
    from the projection's MatMulNBits, and the float table dropped. False when the projection was not
    quantised (then nothing changes)."""
    gather, matmul = pair
    heads = [n for n in graph.node if n.op_type == "MatMulNBits" and list(n.output) == list(matmul.output)]
    if len(heads) != 1:
        return False
    table = next(t for t in graph.initializer if t.name == gather.input[0])
    vocab, hidden = table.dims
    nodes, shape = gather_quantized(gather, heads[0].input[1], heads[0].input[2], vocab, hidden, options)
    rebuilt = []
    for n in graph.node:
        rebuilt.extend(nodes if n.op_type == "Gather" and list(n.output) == list(gather.output) else [n])
    del graph.node[:]
    graph.node.extend(rebuilt)
    if not any(table.name in n.input for n in graph.node):
        kept = [t for t in graph.initializer if t.name != table.name]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    graph.initializer.append(shape)
    return True


def quantize_stored(model, base_dir, path, options: WeightOnlyOptions, *, tied: bool = False):
    """`quantize_weight_only` for a model whose weights are in files: (the quantised ModelProto, graph
    only, its weights in `path`.data, which the model is also saved as; details). Each MatMul's
    weight is read from `base_dir`, quantised and written before the next is read, and every other
    initializer is copied across, so memory holds one weight at a time, never the model. The graph
    is the one onnxruntime's MatMulNBitsQuantizer writes (same node, initializer and attribute
    names, same packing by the same kernels), so the numbers are the same as the in-memory route's;
    `tied` likewise (the embedding read from the quantised output projection, its table not copied)."""
    from pathlib import Path

    import numpy as np
    import onnx

    require("onnxruntime", purpose="weight-only quantisation")
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits


    base_dir, path = Path(base_dir), Path(path)
    store = WeightStore(base_dir)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    uses: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    targets = float_matmuls(graph)
    if not targets:
        raise BadInputError("no MatMul with a constant weight to quantise (weight-only quantisation needs them)")
    pair = shared_embedding(graph, options, targets) if tied else None
    out = onnx.ModelProto()
    copy_fields(model, out, skip=("graph",))
    copy_fields(graph, out.graph, skip=("initializer", "node"))
    kpack = 8 // options.bits
    replaced: dict[int, list] = {}
    dropped: set[str] = set()
    if pair:
        uses[pair[0].input[0]] -= 1
        if uses[pair[0].input[0]] == 0:
            dropped.add(pair[0].input[0])
    with DataFile(path.parent / (path.name + ".data")) as data:
        new_inits = []
        for index, node in enumerate(targets):
            tensor = inits[node.input[1]]
            tick("quantising", tensor.name, index, len(targets))
            weight = np.ascontiguousarray(store.array(tensor).astype(np.float32, copy=False))
            rows, cols = weight.shape
            k_blocks = (rows + options.block_size - 1) // options.block_size
            if k_blocks * options.block_size > rows:
                weight = np.pad(weight, ((0, k_blocks * options.block_size - rows), (0, 0)))
            blob = (options.block_size + kpack - 1) // kpack
            packed = np.zeros((cols, k_blocks, blob), dtype=np.uint8)
            zero_points = np.zeros((cols, (k_blocks + kpack - 1) // kpack), dtype=np.uint8)
            scales = np.zeros((cols, k_blocks), dtype=np.float32)
            kernel = quantize_matmul_4bits if options.bits == 4 else quantize_matmul_8bits
            kernel(packed, weight, scales, zero_points, options.block_size, cols, rows, options.symmetric)
            del weight
            names = [node.input[0], data_name(new_inits, data, f"{tensor.name}_Q{options.bits}", packed),
                     data_name(new_inits, data, f"{tensor.name}_scales", scales)]
            if not options.symmetric:
                names.append(data_name(new_inits, data, f"{tensor.name}_zero_points", zero_points))
            attrs = {"K": rows, "N": cols, "bits": options.bits, "block_size": options.block_size}
            if options.accuracy_level:
                attrs["accuracy_level"] = options.accuracy_level
            replaced[id(node)] = [onnx.helper.make_node("MatMulNBits", names, list(node.output),
                                                        name=f"{node.name}_Q{options.bits}" if node.name else "",
                                                        domain="com.microsoft", **attrs)]
            if pair and node is pair[1]:
                replaced[id(pair[0])], shape = gather_quantized(pair[0], names[1], names[2], cols, rows, options)
                new_inits.append(shape)
            uses[tensor.name] -= 1
            if uses[tensor.name] == 0:
                dropped.add(tensor.name)
        for tensor in graph.initializer:
            if tensor.name in dropped:
                continue
            kept = data.copy(tensor, base_dir) if tensor.data_location == onnx.TensorProto.EXTERNAL else tensor
            out.graph.initializer.append(kept)
        out.graph.initializer.extend(new_inits)
    out.graph.node.extend(m for n in graph.node for m in replaced.get(id(n), [n]))
    if not any(o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    onnx.save_model(out, str(path))
    details = {"bits": options.bits, "block_size": options.block_size, "symmetric": options.symmetric,
               "accuracy_level": options.accuracy_level, "matmuls": len(targets) + sum(
                   1 for n in graph.node if n.op_type == "MatMul" and id(n) not in replaced), "quantized": len(targets)}
    if pair:
        details["embedding"] = SHARED
    return out, details


def data_name(inits: list, data, name: str, value) -> str:
    inits.append(data.add(name, value))
    return name
