from collections import Counter

from modelport.optimize import get_pass
from tests.optimize.conftest import assert_same_outputs
from tests.optimize.test_cpu_kernels import ort_loaded_ops


def _ops(ir) -> Counter:
    return Counter((n.domain, n.op_type) for n in ir.model.graph.node)


def test_transformer_pass_on_bert_leaves_no_slow_kernels(bert_ir):
    result = get_pass("transformer").apply(bert_ir)
    assert result.modified
    fusions = result.details["fusions"]
    ops = _ops(result.model)
    assert ops[("com.microsoft", "Attention")] == 2
    assert ops[("com.microsoft", "BiasGelu")] == 0 and fusions["bias_gelu_split"] == 2
    # every LayerNormalization of zoo:bert_tiny (embeddings + 2 per layer) follows a Sum
    assert ops[("", "Sum")] == fusions["residual_sum"] == ops[("", "LayerNormalization")] == 5
    assert ort_loaded_ops(result.model.model)["SkipLayerNormalization"] == 0
    assert ort_loaded_ops(bert_ir.model)["SkipLayerNormalization"] > 0
    assert_same_outputs(bert_ir, result.model, atol=1e-4)


def test_transformer_sln_pass_keeps_both_fusions(bert_ir):
    result = get_pass("transformer-sln").apply(bert_ir)
    ops = _ops(result.model)
    assert ops[("com.microsoft", "SkipLayerNormalization")] >= 4
    assert ops[("", "Sum")] == 0
    assert "residual_sum" not in result.details["fusions"]
