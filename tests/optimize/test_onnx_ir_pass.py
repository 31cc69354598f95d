"""The rewrite-rule loop: capped, and a pass that stops at the cap says so in its row and in the report."""

from __future__ import annotations

import pytest
from onnx import helper

from modelport.optimize import PassResult
from modelport.optimize.onnx_ir_pass import MAX_REWRITE_ROUNDS, OnnxIRPass, apply_rules
from tests.optimize.conftest import make_ir


def _fuse_relus():
    from onnxscript.rewriter.rules import common as r

    return r.successive_relu_rule


@pytest.fixture
def relu_ir():
    return make_ir([helper.make_node("Relu", ["x"], ["r1"]), helper.make_node("Relu", ["r1"], ["y"])],
                   [("x", [2, 4])], [("y", [2, 4])])


class OneRoundPass(OnnxIRPass):
    """Relu fusion allowed a single round: it cannot tell that it reached the fixed point."""

    name = "relu-one-round"

    def transform(self, model):
        n, rounds = apply_rules(model, [_fuse_relus()], max_rounds=1)
        return n > 0, {"rewrites": n, **rounds}


def test_rules_still_matching_at_the_cap_say_so(relu_ir):
    from modelport.optimize.model_tools import to_onnx_ir

    n, details = apply_rules(to_onnx_ir(relu_ir.model), [_fuse_relus()], max_rounds=1)
    assert n == 1 and details == {"rounds": 1, "round_limit_reached": 1}


def test_rules_that_converge_report_no_limit(relu_ir):
    from modelport.optimize.model_tools import to_onnx_ir

    n, details = apply_rules(to_onnx_ir(relu_ir.model), [_fuse_relus()])
    assert n == 1 and details == {"rounds": 2} and MAX_REWRITE_ROUNDS > 2  # the second round found nothing: a fixed point


def test_capped_pass_row_and_report_warning(relu_ir):
    """The row's details carry the cap, and the optimisation stage turns it into a report warning."""
    from modelport.optimize.pipeline import run_passes
    from modelport.orchestration.optimize_stage import warn_round_limits
    from modelport.validation.report import Findings, Report

    result = OneRoundPass().apply(relu_ir)
    assert isinstance(result, PassResult) and result.details["round_limit_reached"] == 1
    _, rows = run_passes(relu_ir, [OneRoundPass()])
    assert rows[0].status == "applied" and rows[0].details["round_limit_reached"] == 1
    found, report = Findings(), Report("optimize")
    warn_round_limits(found, [r.to_dict() for r in rows])
    report.record(found)
    assert report.data["warnings"] == ["pass 'relu-one-round' still rewrote the model in its last round: it stopped at its round "
                                       "limit (1), short of a fixed point"]
