from collections import Counter

from modelport.optimize import get_pass
from tests.optimize.conftest import assert_same_outputs


def _ops(ir) -> Counter:
    return Counter((n.domain, n.op_type) for n in ir.model.graph.node)


def test_bert_tiny_attention_fuses_without_skip_layer_norm(bert_ir):
    result = get_pass("transformer").apply(bert_ir)
    assert result.modified
    ops = _ops(result.model)
    assert ops[("com.microsoft", "Attention")] == 2  # zoo:bert_tiny has two layers
    assert ops[("com.microsoft", "SkipLayerNormalization")] == 0
    assert len(result.model.model.graph.node) < len(bert_ir.model.graph.node)
    assert_same_outputs(bert_ir, result.model, atol=1e-4)


def test_bert_tiny_transformer_sln_fuses_skip_layer_norm(bert_ir):
    result = get_pass("transformer-sln").apply(bert_ir)
    ops = _ops(result.model)
    assert ops[("com.microsoft", "SkipLayerNormalization")] >= 4
    assert result.details["fusions"]["skip_layer_normalization"] >= 4
    assert_same_outputs(bert_ir, result.model, atol=1e-4)
