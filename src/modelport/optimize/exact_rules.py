"""Arithmetic no-op rules that hold exactly: `x + 0`, `0 + x`, `x - 0`, `x * 1`, `1 * x` and `x / 1`
become `x` only when the scalar constant is exactly 0 (or 1).

onnxscript's own versions (`rules.common.add_0_rule`, `sub_0_rule`, `mul_by_1_rule`,
`div_by_1_rule`, which its `optimizer.optimize` also applies among its default rules) compare the
constant with `math.isclose(c, 0, rel_tol=1e-5, abs_tol=1e-8)`: every |c| ≤ 1e-8 counts as 0, and
every c within 1e-5 of 1 as 1. An epsilon is such a constant. basic-pitch's log-magnitude
`10·log10(x² + 1e-10)` lost its `+ 1e-10`; on digital silence (x = 0) the model then took
log(0) = -inf, and its min-max normalisation (-inf) - (-inf) = NaN: every output value was NaN where
the source's are finite. The variance epsilon of a decomposed LayerNorm (1e-12 in BERT) is the same
case: a constant row gives 0 / 0. On random inputs the missing epsilon is invisible (x² is far above
it), so a parity check on random samples lets the rewrite through.

Signed zero is the one value these rules still change: `-0.0 + 0.0` is `+0.0`, which only a later
division by it could tell apart.
"""

from __future__ import annotations

import contextlib


def _exact(value: float):
    from onnxscript.rewriter.pattern import Constant

    return Constant(value, rel_tol=0.0, abs_tol=0.0)


def _add_0(op, x):
    return op.Add(x, _exact(0))


def _sub_0(op, x):
    return op.Sub(x, _exact(0))


def _mul_by_1(op, x):
    return op.Mul(x, _exact(1))


def _div_by_1(op, x):
    return op.Div(x, _exact(1))


def _identity(op, x, **_):
    return op.Identity(x)


def rules() -> list:
    """The exact rules, with the commuted forms of Add and Mul."""
    from onnxscript.rewriter.pattern import RewriteRule

    return [*RewriteRule(_add_0, _identity).commute(), RewriteRule(_sub_0, _identity),
            *RewriteRule(_mul_by_1, _identity).commute(), RewriteRule(_div_by_1, _identity)]


def _tolerant_rules() -> list:
    """onnxscript's approximate no-op rules as they appear in its default rule list (Dropout's
    two no-op rules, in the same set, compare attributes exactly and stay)."""
    from onnxscript.rewriter.rules.common import _no_op

    return [r for r in _no_op.rules if r not in (_no_op.dropout_zero_rule, _no_op.dropout_inference_rule)]


@contextlib.contextmanager
def exact_default_rules():
    """While the block runs, onnxscript's default rewrite rules (what `onnxscript.optimizer.optimize`
    and `ort_fusions.optimize_for_ort` apply) have its approximate no-op rules replaced by `rules()`."""
    from onnxscript import rewriter

    saved = rewriter._DEFAULT_REWRITE_RULES
    tolerant = {id(r) for r in _tolerant_rules()}
    rewriter._DEFAULT_REWRITE_RULES = (*rules(), *(r for r in saved if id(r) not in tolerant))
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = saved
