"""The ort-genai target's config and preflight (generation through onnxruntime-genai is tested end to
end in tests/orchestration/test_text_generation.py)."""

from __future__ import annotations

import json

from modelport.emitters import EMITTERS, EmitOptions
from modelport.emitters.ort_genai import genai_config, preflight
from modelport.ir import IRModel, specs_from_onnx

DECODER = {"architecture": "Qwen2ForCausalLM", "family": "qwen2", "num_layers": 2, "num_heads": 4, "kv_heads": 2,
           "head_dim": 16, "hidden_size": 64, "vocab_size": 128, "tied_embeddings": True, "context_length": 256,
           "bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": None}


def test_config_names_our_inputs_and_outputs():
    c = genai_config(DECODER)
    dec = c["model"]["decoder"]
    assert dec["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert dec["outputs"]["present_value_names"] == "present.%d.value"
    assert (dec["num_hidden_layers"], dec["num_key_value_heads"], dec["head_size"]) == (2, 2, 16)
    assert c["model"]["type"] == "qwen2" and c["model"]["pad_token_id"] == 2 and c["model"]["eos_token_id"] == [2, 3]
    assert c["search"]["past_present_share_buffer"] is False and c["search"]["max_length"] == 256


def test_preflight_refuses_a_model_that_is_not_a_decoder(tiny_onnx):
    import onnx

    assert "ort-genai" in EMITTERS
    model = onnx.load(str(tiny_onnx))
    ir = IRModel(model, specs_from_onnx(model.graph.input), specs_from_onnx(model.graph.output), provenance={})
    p = preflight(ir, EmitOptions())
    assert not p.ok and "--task text-generation" in p.unsupported[0]["reason"]
    ir.provenance["decoder"] = DECODER
    assert preflight(ir, EmitOptions()).ok


def test_past_and_present_share_a_buffer_only_for_group_query_attention(tmp_path):
    """GroupQueryAttention writes the new tokens into the buffer it is given, so onnxruntime-genai may hand it
    one max-length buffer as past and present; the unfused export's Concat needs separate ones."""
    import onnx
    from onnx import TensorProto, helper

    def model(op, domain):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
        return helper.make_model(helper.make_graph([helper.make_node(op, ["x"], ["y"], domain=domain)], "g", [x], [y]))

    from modelport.emitters.ort_genai import write_folder

    for op, domain, shared in (("GroupQueryAttention", "com.microsoft", True), ("Identity", "", False)):
        folder = tmp_path / op
        write_folder(model(op, domain), DECODER, None, folder)
        config = json.loads((folder / "genai_config.json").read_text())
        assert config["search"]["past_present_share_buffer"] is shared
        assert onnx.load(str(folder / "model.onnx")).graph.node[0].op_type == op
