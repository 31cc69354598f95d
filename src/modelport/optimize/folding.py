"""Constant folding and dead-code elimination.

Folding evaluates nodes whose inputs are all constants (onnxscript's optimizer, with its size
limits so a fold never materialises a huge tensor). Elimination removes what no output needs:
unused nodes, functions and opsets, Identity nodes, duplicated subexpressions and duplicated
initializers (onnx-ir's common passes).
"""

from __future__ import annotations

from modelport.optimize.onnx_ir_pass import OnnxIRPass


class ConstantFoldingPass(OnnxIRPass):
    name = "fold"
    description = "evaluate nodes whose inputs are all constants"

    def transform(self, model):
        import onnx_ir.passes.common as common
        from onnxscript.optimizer import fold_constants_ir

        before = model.graph.num_nodes()
        result = fold_constants_ir(model)
        if result.modified:
            common.RemoveUnusedNodesPass()(model)
        return bool(result.modified), {"folded": before - model.graph.num_nodes()}


class DeadCodeEliminationPass(OnnxIRPass):
    name = "dce"
    description = "remove unused nodes/initializers/functions, Identity nodes, common subexpressions"

    def transform(self, model):
        import onnx_ir.passes.common as common

        before = model.graph.num_nodes()
        modified = False
        for p in (common.IdentityEliminationPass(), common.CommonSubexpressionEliminationPass(),
                  common.DeduplicateInitializersPass(), common.RemoveUnusedNodesPass(),
                  common.RemoveUnusedFunctionsPass(), common.RemoveUnusedOpsetsPass()):
            modified |= bool(p(model).modified)
        return modified, {"removed": before - model.graph.num_nodes()}
