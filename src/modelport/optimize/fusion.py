"""Operator fusions that hold for any runtime: BatchNorm folded into Conv/ConvTranspose/Gemm
(W' = W·γ/√(σ²+ε), b' = (b−μ)·γ/√(σ²+ε)+β), 2-D MatMul+Add into Gemm, Pad into Conv,
affine ops around Conv, chains of Relu/Clip, and HardSwish (onnxscript's rewrite rules).
"""

from __future__ import annotations

from modelport.optimize.onnx_ir_pass import OnnxIRPass, apply_rules


def rules():
    from onnxscript.rewriter.rules import common as r

    return [r.fuse_batchnorm_into_conv_rule, r.fuse_batchnorm_into_conv_transpose_rule,
            r.fuse_batchnorm_into_gemm_rule, r.matmul_add_to_gemm_rule,
            r.transpose_a_matmul_add_to_gemm_rule, r.transpose_b_matmul_add_to_gemm_rule,
            r.transpose_ab_matmul_add_to_gemm_rule, r.fuse_pad_into_conv_rule,
            r.normalize_pad_format_conv_rule, r.affine_conv_fusion_rule, r.conv_affine_fusion_rule,
            r.successive_relu_rule, r.successive_clip_rule, r.successive_clip_relu_rule,
            r.successive_relu_clip_rule, *r.fuse_hardswish_rules().rules]


class FusionPass(OnnxIRPass):
    name = "fuse"
    description = "Conv+BatchNorm, MatMul+Add→Gemm, Pad+Conv, Relu/Clip chains, HardSwish"

    def transform(self, model):
        n, rounds = apply_rules(model, rules())
        return n > 0, {"rewrites": n, **rounds}
