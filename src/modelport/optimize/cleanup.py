"""Removal of redundant data-movement and no-op nodes: Cast to the same type, Cast chains,
identity Transposes and Transpose pairs, Reshape chains, no-op Expand, Unsqueeze chains,
Dropout at inference (onnxscript's rewrite rules), and x+0, x-0, x*1, x/1 when the constant is
exactly 0 or 1 (optimize/exact_rules.py: onnxscript's own versions also drop an epsilon like 1e-10).
"""

from __future__ import annotations

from modelport.optimize import exact_rules
from modelport.optimize.onnx_ir_pass import OnnxIRPass, apply_rules


def rules():
    from onnxscript.rewriter.rules import common as r


    return [r.no_op_cast_rule, r.cast_cast_rule, r.no_op_transpose_rule, r.transpose_transpose_rule,
            r.reshape_reshape_rule, r.no_op_expand_rule, r.unsqueeze_unsqueeze_rule,
            r.squeeze_reshape_1d_rule, r.dropout_inference_rule, r.dropout_zero_rule,
            *exact_rules.rules(), r.collapse_slice_rule, r.collapse_slice2_rule]


class RedundantOpsPass(OnnxIRPass):
    name = "cleanup"
    description = "drop redundant Cast/Transpose/Reshape/Expand/Dropout and arithmetic no-ops"

    def transform(self, model):
        import onnx_ir.passes.common as common

        # No-op Cast detection needs value types; inference leaves the model as is on failure.
        common.ShapeInferencePass(strict_mode=False)(model)
        n, rounds = apply_rules(model, rules())
        n += int(common.IdentityEliminationPass()(model).modified)
        return n > 0, {"rewrites": n, **rounds}
