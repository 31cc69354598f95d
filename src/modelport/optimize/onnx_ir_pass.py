"""Running onnx-ir / onnxscript machinery as a modelport Pass.

Subclasses implement `transform(model: onnx_ir.Model) -> (modified, details)` in place on a
deserialised copy; the IRModel they were given is never touched (the copy is serialised back
into a new ModelProto).

A parked IR (`IRModel.park`: its large initializers refer to data files in `ir.stored`) is read as
it is: onnx-ir reads those tensors from their files when a rule needs their values (memory-mapped),
and writes the references back unchanged, so the result holds only the tensors the pass created.
"""

from __future__ import annotations

from typing import Any

from modelport.deps import require
from modelport.ir import IRModel
from modelport.optimize import Pass, PassResult
from modelport.optimize.model_tools import from_onnx_ir, to_onnx_ir, with_model
from modelport.optimize.weight_store import forget_onnxscript_matches


class OnnxIRPass(Pass):
    reads_stored = True

    def transform(self, model) -> tuple[bool, dict[str, Any]]:
        raise NotImplementedError

    def apply(self, ir: IRModel) -> PassResult:

        require("onnx_ir", purpose=f"the '{self.name}' pass")
        model = to_onnx_ir(ir.model)
        stored = []
        if ir.stored is not None:
            import onnx_ir
            from onnx_ir.external_data import set_base_dir

            set_base_dir(model.graph, ir.stored)
            stored = [v.const_value for v in model.graph.initializers.values() if isinstance(v.const_value, onnx_ir.ExternalTensor)]
        try:
            modified, details = self.transform(model)
            if not modified:
                return PassResult(ir, False, details)
            out = with_model(ir, from_onnx_ir(model))
        finally:
            if ir.stored is not None:
                _let_go(stored)
        out.stored = ir.stored
        return PassResult(out, True, details)


def _let_go(tensors) -> None:
    """Close the files onnx-ir mapped to read these stored tensors (their pages count in this
    process's memory while mapped; those a pass took out of the graph too), and let go of the graphs
    onnxscript's matchers still hold."""

    for tensor in tensors:
        tensor.release()
    forget_onnxscript_matches()


# each round can expose new matches; rules still matching after this many rounds are reported
MAX_REWRITE_ROUNDS = 4


def apply_rules(model, rules, *, max_rounds: int = MAX_REWRITE_ROUNDS) -> tuple[int, dict[str, Any]]:
    """Apply onnxscript rewrite rules to a fixed point, at most `max_rounds` rounds.

    Returns (rewrites, details for the pass row): `rounds` run, and `round_limit_reached` (the
    cap) when the last round still rewrote something, i.e. the loop stopped before the fixed point.
    """
    import onnx_ir.passes.common as common
    from onnxscript.rewriter import RewriteRuleSet

    total, rounds, count = 0, 0, 0
    while rounds < max_rounds:
        count = RewriteRuleSet(list(rules)).apply_to_model(model)
        rounds += 1
        total += count
        if not count:
            break
    if total:
        common.RemoveUnusedNodesPass()(model)
    details: dict[str, Any] = {"rounds": rounds}
    if count:
        details["round_limit_reached"] = max_rounds
    return total, details
