from modelport.optimize import get_pass
from tests.optimize.conftest import assert_same_outputs


def test_bert_layernorm_fusions_into_contrib_ops(bert_ir):
    simplified = get_pass("simplify").apply(bert_ir).model
    result = get_pass("transformer").apply(simplified)
    assert result.modified
    domains = {(n.domain, n.op_type) for n in result.model.model.graph.node}
    assert ("com.microsoft", "SkipLayerNormalization") in domains
    assert result.details["fusions"]["skip_layer_normalization"] >= 1
    assert len(result.model.model.graph.node) < len(simplified.model.graph.node)
    assert_same_outputs(bert_ir, result.model, atol=1e-4)
