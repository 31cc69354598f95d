"""Weight-only quantisation of MatMul weights into onnxruntime's `MatMulNBits` (INT4 or INT8).

Decoder LMs spend decode time reading weights, not computing: storing each MatMul's constant
weight in 4 (or 8) bits with a scale (and, asymmetric, a zero point) per block of `block_size`
input channels cuts the bytes read 8x (4x) while activations stay float. onnxruntime's
`MatMulNBitsQuantizer` does the packing; this module only chooses its settings and counts what
changed. Accuracy is judged by the caller by generation (token agreement, worst logit error).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from modelport.deps import require
from modelport.errors import BadInputError

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


def quantize_weight_only(model, options: WeightOnlyOptions, *, in_place: bool = False):
    """(quantised ModelProto, details): every MatMul with a constant 2-D weight becomes MatMulNBits.
    The input model is not modified, unless `in_place`: then it is quantised where it is, and the
    caller must drop it (it holds the replaced float weights until it is freed).

    The result is a fresh proto holding only what the quantised graph uses: the quantiser replaces
    weights inside the proto it is given, and with the upb protobuf runtime the float weights it
    removed stay allocated for as long as that proto lives (optimize/weight_store.py), i.e. for as
    long as the quantised model would be kept (through emission and validation)."""
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
    quantizer = MatMulNBitsQuantizer(work, bits=options.bits, block_size=options.block_size,
                                     is_symmetric=options.symmetric, accuracy_level=options.accuracy_level)
    quantizer.process()
    out = onnx.ModelProto()
    out.CopyFrom(quantizer.model.model)
    del quantizer, work
    after = sum(1 for n in out.graph.node if n.op_type == "MatMulNBits")
    if after == 0:
        raise BadInputError("no MatMul with a constant weight to quantise (weight-only quantisation needs them)")
    details = {"bits": options.bits, "block_size": options.block_size, "symmetric": options.symmetric,
               "accuracy_level": options.accuracy_level, "matmuls": before, "quantized": after}
    return out, details
