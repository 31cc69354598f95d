"""Transformer fusions into onnxruntime's contrib ops: attention (SDPA → MultiHeadAttention /
Attention), LayerNorm + residual → SkipLayerNormalization, GELU / BiasGelu, RMSNorm, rotary
embeddings.

This uses onnxscript's `ort_fusions`, which is written against `torch.onnx`'s dynamo exports
(where onnxruntime's own `transformers.optimizer` crashes or writes an unloadable model). The
result needs onnxruntime (contrib ops, domain `com.microsoft`): it belongs in the `all` level,
which targets onnxruntime.
"""

from __future__ import annotations

from modelport.optimize.onnx_ir_pass import OnnxIRPass


class TransformerFusionPass(OnnxIRPass):
    name = "transformer"
    description = "attention/LayerNorm/GELU fusions into onnxruntime contrib ops"

    def transform(self, model):
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        before = _op_counts(model)
        model_out, counts = optimize_for_ort(model)
        after = _op_counts(model_out)
        fused = {k: v for k, v in counts.items() if v}
        return before != after, {"fusions": fused}


def _op_counts(model) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in model.graph:
        key = f"{n.domain}:{n.op_type}"
        out[key] = out.get(key, 0) + 1
    return out
