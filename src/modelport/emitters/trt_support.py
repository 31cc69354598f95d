"""What TensorRT's ONNX parser accepts, checked node by node before any GPU is involved.

The table follows the operator support matrix of onnx-tensorrt for TensorRT 10.15 (opset 9 to
24); TensorRT 11 parses the same operator set. Each row names the op, the element types its
inputs may have, and whether it is supported at all. Restrictions the matrix states that can be
decided from the graph alone (pooling rank, TopK `sorted`, LSTM `layout`, constant axes, ...)
are checked per node in `check_node`; what needs shapes at build time is left to the parser.

A node is `ok`, `warn` (accepted with a caveat, e.g. DOUBLE cast down to FLOAT, INT64 weights
clamped by TensorRT < 10) or `unsupported` (the parser rejects it: the build would fail).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

TABLE_VERSION = "10.15"
OPSET_RANGE = (9, 24)

F = "FP32 FP16 BF16"
FI = F + " INT32 INT64"
FIB = FI + " BOOL"

# op -> supported element types ("" = unsupported by the parser)
_SUPPORTED = {
    **{op: F for op in (
        "Acos Acosh Asin Asinh Atan Atanh AveragePool BatchNormalization Ceil Celu Clip Conv "
        "ConvTranspose Cos Cosh CumSum Einsum Elu Erf Exp Floor Gemm GlobalAveragePool GlobalLpPool "
        "GlobalMaxPool GroupNormalization GRU HardSigmoid HardSwish Hardmax ImageScaler "
        "InstanceNormalization IsInf LayerNormalization LeakyRelu Log LogSoftmax LRN LSTM "
        "LpNormalization LpPool MatMul MaxPool MeanVarianceNormalization ParametricSoftplus PRelu "
        "QuantizeLinear RandomNormal RandomNormalLike RandomUniform RandomUniformLike Reciprocal "
        "Resize RMSNormalization RNN RotaryEmbedding Round ScaledTanh Scan Selu Sigmoid Sin Sinh "
        "Softmax Softplus Softsign Sqrt Tan Tanh ThresholdedRelu Upsample Dropout").split()},
    **{op: FI for op in (
        "Abs Add ArgMax ArgMin DepthToSpace Div Equal Gelu Greater GreaterOrEqual IsNaN Less "
        "LessOrEqual Max Mean Min Mod Mul Neg Pad Pow Range ReduceL1 ReduceL2 ReduceLogSum "
        "ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu "
        "Scatter ScatterElements ScatterND Shrink Sign SpaceToDepth Sub Sum TensorScatter TopK").split()},
    **{op: FIB for op in (
        "Cast CastLike Concat Constant ConstantOfShape Expand EyeLike Flatten Gather GatherElements "
        "GatherND Identity If Loop OneHot Reshape ReverseSequence Shape Size Slice Split Squeeze "
        "Tile Transpose Trilu Unsqueeze Where").split()},
    **{op: "BOOL" for op in ("And", "Not", "Or", "Xor")},
    **{op: "FP32 FP16" for op in ("BlackmanWindow", "DeformConv", "GridSample", "HammingWindow",
                                   "HannWindow", "Mish", "NonMaxSuppression", "NonZero", "RoiAlign")},
    "STFT": "FP32",
    "DequantizeLinear": "INT8 FP8 FP4 INT4",
    "Attention": F + " INT8 FP8",
}
_UNSUPPORTED = set(
    "AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Col2Im CenterCropPad "
    "Compress ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear ImageDecoder MatMulInteger "
    "MaxRoiPool MaxUnpool MelWeightMatrix Multinomial NegativeLogLikelihoodLoss Optional "
    "OptionalGetElement OptionalHasElement QLinearConv QLinearMatMul RegexFullMatch SequenceAt "
    "SequenceConstruct SequenceEmpty SequenceErase SequenceInsert SequenceLength SequenceMap "
    "SoftmaxCrossEntropyLoss SplitToSequence StringConcat StringNormalizer StringSplit "
    "TfIdfVectorizer Unique".split()
)

# ONNX elem_type -> the matrix's spelling
_TYPE_NAMES = {1: "FP32", 10: "FP16", 16: "BF16", 6: "INT32", 7: "INT64", 3: "INT8", 2: "UINT8",
               9: "BOOL", 11: "DOUBLE", 8: "STRING", 4: "UINT16", 5: "INT16", 12: "UINT32", 13: "UINT64",
               17: "FP8", 18: "FP8", 19: "FP8", 20: "FP8", 22: "INT4", 21: "UINT4", 23: "FP4"}


def supported_ops() -> dict[str, str]:
    """op -> supported element types, for docs and tests."""
    return dict(_SUPPORTED)


@dataclass
class NodeCheck:
    node: str
    op: str
    status: str  # ok | warn | unsupported
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TRTCheck:
    table_version: str
    opset: int | None
    nodes: list[NodeCheck] = field(default_factory=list)
    model_issues: list[str] = field(default_factory=list)  # opset, I/O types

    @property
    def unsupported(self) -> list[NodeCheck]:
        return [n for n in self.nodes if n.status == "unsupported"]

    @property
    def warnings(self) -> list[NodeCheck]:
        return [n for n in self.nodes if n.status == "warn"]

    @property
    def ok(self) -> bool:
        return not self.unsupported and not self.model_issues

    def summary(self) -> str:
        n = len(self.nodes)
        good = n - len(self.unsupported)
        return f"{good}/{n} nodes supported by TensorRT's ONNX parser ({len(self.warnings)} with caveats)"

    def to_dict(self, *, all_nodes: bool = True) -> dict:
        nodes = self.nodes if all_nodes else [n for n in self.nodes if n.status != "ok"]
        return {"table_version": self.table_version, "opset": self.opset, "opset_range": list(OPSET_RANGE),
                "ok": self.ok, "summary": self.summary(), "model_issues": list(self.model_issues),
                "unsupported": len(self.unsupported), "warnings": len(self.warnings),
                "nodes": [c.to_dict() for c in nodes]}


def _attr(node, name, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _restriction(node, constants: set[str]) -> str | None:
    """The first matrix restriction the node breaks, decidable from the graph alone."""
    op = node.op_type
    if op in ("MaxPool", "AveragePool", "LpPool"):
        ks = _attr(node, "kernel_shape", [])
        if len(ks) not in (2, 3):
            return f"{len(ks)}D pooling; TensorRT pools in 2D or 3D only"
        dil = _attr(node, "dilations", [])
        if dil and any(d != 1 for d in dil):
            return "pooling dilations other than 1"
        if op == "MaxPool" and len([o for o in node.output if o]) > 1:
            return "MaxPool's Indices output is not supported"
    if op == "TopK":
        if _attr(node, "sorted", 1) != 1:
            return "TopK with sorted=0"
        if len(node.input) > 1 and node.input[1] not in constants:
            return "TopK's K must be a build-time constant"
    if op == "LSTM" and (_attr(node, "input_forget", 0) != 0 or _attr(node, "layout", 0) != 0):
        return "LSTM with input_forget or layout other than 0"
    if op == "LayerNormalization" and len([o for o in node.output if o]) > 1:
        return "only LayerNormalization's first output (Y) is supported"
    if op == "ScatterND" and _attr(node, "reduction", b"none") not in (b"none", "none"):
        return "ScatterND with a reduction"
    if op == "Resize":
        mode = _attr(node, "mode", b"nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode not in ("nearest", "linear"):
            return f"Resize mode '{mode}' (nearest and linear only)"
        if _attr(node, "antialias", 0):
            return "Resize with antialias"
    if op == "Dropout" and len(node.input) > 2 and node.input[2] and node.input[2] not in constants:
        return "Dropout's training_mode must be a constant False"
    if op == "CumSum" and len(node.input) > 1 and node.input[1] not in constants:
        return "CumSum's axis must be a build-time constant"
    if op in ("Squeeze", "Unsqueeze") and len(node.input) > 1 and node.input[1] and node.input[1] not in constants:
        return f"{op}'s axes must resolve to a constant"
    if op.startswith("Reduce") and len(node.input) > 1 and node.input[1] and node.input[1] not in constants:
        return f"{op}'s axes must be an initializer"
    if op == "Constant" and any(a.name in ("sparse_value", "value_string", "value_strings") for a in node.attribute):
        return "Constant with a sparse or string value"
    return None


def check_model(model) -> TRTCheck:
    """Check every node of an ONNX model against the parser's support matrix."""
    import onnx

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    result = TRTCheck(TABLE_VERSION, opset)
    lo, hi = OPSET_RANGE
    if opset is not None and not lo <= opset <= hi:
        result.model_issues.append(f"opset {opset} outside TensorRT's range {lo}..{hi}")
    types: dict[str, int] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model
    g = inferred.graph
    for v in (*g.input, *g.output, *g.value_info):
        types[v.name] = v.type.tensor_type.elem_type
    constants = {t.name for t in g.initializer}
    for t in g.initializer:
        types[t.name] = t.data_type
    for n in g.node:
        if n.op_type == "Constant":
            constants.update(n.output)
    for v in (*g.input, *g.output):
        t = types.get(v.name)
        if t in (8,):
            result.model_issues.append(f"graph I/O '{v.name}' is a STRING tensor")
    int64_big = _int64_weights_beyond_int32(g)
    for i, node in enumerate(g.node):
        name = node.name or f"{node.op_type}_{i}"
        result.nodes.append(_check_node(node, name, types, constants, int64_big))
    return result


def _int64_weights_beyond_int32(graph) -> set[str]:
    from onnx import numpy_helper

    big = set()
    for t in graph.initializer:
        if t.data_type == 7 and t.data_location != 1:
            arr = numpy_helper.to_array(t)
            if arr.size and (arr.max() > 2**31 - 1 or arr.min() < -(2**31)):
                big.add(t.name)
    return big


def _check_node(node, name: str, types: dict[str, int], constants: set[str], int64_big: set[str]) -> NodeCheck:
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return NodeCheck(name, f"{node.domain}::{op}", "unsupported",
                         f"custom domain '{node.domain}': TensorRT needs a plugin registered for it")
    if op in _UNSUPPORTED:
        return NodeCheck(name, op, "unsupported", f"{op} is not supported by TensorRT's ONNX parser")
    allowed = _SUPPORTED.get(op)
    if allowed is None:
        return NodeCheck(name, op, "unsupported", f"{op} is not in TensorRT's ONNX operator matrix")
    broken = _restriction(node, constants)
    if broken:
        return NodeCheck(name, op, "unsupported", broken)
    allowed_set = set(allowed.split())
    warns = []
    for t in (x for x in node.input if x):
        et = types.get(t)
        tname = _TYPE_NAMES.get(et) if et else None
        if tname is None:
            continue
        if tname == "DOUBLE":
            warns.append(f"input '{t}' is DOUBLE: TensorRT casts it to FLOAT, clamping to ±FLT_MAX")
        elif tname == "STRING":
            return NodeCheck(name, op, "unsupported", f"input '{t}' is a STRING tensor")
        elif tname in ("INT8", "UINT8") and op not in ("DequantizeLinear", "Cast", "CastLike"):
            warns.append(f"input '{t}' is {tname}: TensorRT takes it only through quantization (Q/DQ) or as network I/O")
        elif tname not in allowed_set and tname in ("FP32", "FP16", "BF16", "INT32", "INT64", "BOOL"):
            # shape-like int tensors (Reshape's shape, Slice's starts) are allowed beyond the data types listed
            if not (tname in ("INT32", "INT64") and t != node.input[0]):
                return NodeCheck(name, op, "unsupported", f"input '{t}' is {tname}; {op} supports {allowed}")
        if t in int64_big:
            warns.append(f"INT64 weight '{t}' holds values beyond INT32: TensorRT < 10 clamps them")
    if warns:
        return NodeCheck(name, op, "warn", "; ".join(warns))
    return NodeCheck(name, op, "ok")
