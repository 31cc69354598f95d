"""Fusions for KV-cache decoder exports (`parsers/hf_decoder.py`) into onnxruntime's ops.

onnxscript's `ort_fusions.optimize_for_ort` is written against `torch.onnx` dynamo exports of
Llama-like decoders. On ours it turns RMSNorm (Pow → ReduceMean → Add → Sqrt → Reciprocal → Mul)
into `SimplifiedLayerNormalization`, a residual Add followed by RMSNorm into
`SkipSimplifiedLayerNormalization`, and scaled-dot-product attention with the cache concat into
`com.microsoft.MultiHeadAttention` over keys and values expanded by repeat_kv. Our own rewrite
(optimize/gqa_fusion.py) then turns each layer's attention into `com.microsoft.GroupQueryAttention`
on the un-expanded cache, with the rotary embedding in `com.microsoft.RotaryEmbedding` nodes and the
q/k/v projections packed into one MatMul. The result runs in onnxruntime only (contrib ops); the
caller keeps it only when generation still matches the source (see orchestration/text_generation.py).
"""

from __future__ import annotations

from collections import Counter

from modelport.deps import require

FUSED_OPS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "MultiHeadAttention",
             "GroupQueryAttention", "RotaryEmbedding")


DEFAULT_CONTEXT = 4096  # rotary cache rows when the caller does not know the model's context length


def fuse_decoder(model, *, context_length: int | None = None, group_query_attention: bool = True):
    """(fused ModelProto, details with node counts before/after and fused ops); the input is not modified.
    `context_length` bounds the positions the rotary caches hold (the config's max_position_embeddings).
    details["group_query_attention"] says which layers were fused and why any other was not."""
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
    rules = {k: v for k, v in stats.items() if v}
    gqa = None
    if group_query_attention:
        from modelport.optimize.gqa_fusion import fuse_group_query_attention

        out, gqa = fuse_group_query_attention(out, context_length=context_length or DEFAULT_CONTEXT)
        if gqa["fused"]:
            rules["group_query_attention"] = len(gqa["fused"])
    ops = Counter(n.op_type for n in out.graph.node)
    details = {"nodes_before": len(model.graph.node), "nodes": len(out.graph.node),
               "fused": {op: ops[op] for op in FUSED_OPS if ops[op]}, "rules": rules}
    if gqa is not None:
        details["group_query_attention"] = gqa
    return out, details
