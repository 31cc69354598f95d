"""Fusions for KV-cache decoder exports (`parsers/hf_decoder.py`) into onnxruntime's ops.

onnxscript's `ort_fusions.optimize_for_ort` is written against `torch.onnx` dynamo exports of
Llama-like decoders. On ours it turns RMSNorm (Pow → ReduceMean → Add → Sqrt → Reciprocal → Mul)
into `SimplifiedLayerNormalization`, a residual Add followed by RMSNorm into
`SkipSimplifiedLayerNormalization`, and scaled-dot-product attention with the cache concat into
`com.microsoft.MultiHeadAttention`. The result runs in onnxruntime only (contrib ops); the caller
keeps it only when generation still matches the source (see orchestration/text_generation.py).
"""

from __future__ import annotations

from collections import Counter

from modelport.deps import require

FUSED_OPS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "MultiHeadAttention",
             "GroupQueryAttention", "RotaryEmbedding")


def fuse_decoder(model):
    """(fused ModelProto, details with node counts before/after and fused ops); the input is not modified."""
    import logging

    import onnx

    require("onnxscript", purpose="decoder fusions")
    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    fused, stats = optimize_for_ort(onnx_ir.from_proto(copy))
    out = onnx_ir.to_proto(fused)
    ops = Counter(n.op_type for n in out.graph.node)
    return out, {"nodes_before": len(model.graph.node), "nodes": len(out.graph.node),
                 "fused": {op: ops[op] for op in FUSED_OPS if ops[op]},
                 "rules": {k: v for k, v in stats.items() if v}}
