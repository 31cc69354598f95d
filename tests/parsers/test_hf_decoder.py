"""KV-cache export of decoder LM folders (Llama, Qwen2, Phi-3, Mistral, Gemma, Gemma2, Qwen3 layouts;
Llama with tied embeddings and with llama3 rope scaling), checked against transformers: prefill with
an empty past and decode at several past lengths, a left-padded batch, greedy generation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from modelport.errors import BadInputError, UnsupportedError
from modelport.parsers import hf_decoder, hf_decoder_step
from modelport.resolve.specs import SourceSpec
from modelport.validation import generation
from tests.hf_folders import FAMILIES, build


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """family -> (folder, transformers model, IR, onnxruntime session), each family exported once."""
    import onnxruntime as ort

    done = {}

    def export(family: str):
        if family not in done:
            folder = build(family, tmp_path_factory.mktemp(family) / "model")
            model = hf_decoder.load_model(folder)
            cfg = hf_decoder.read_decoder_config(folder)
            ir = hf_decoder.parse_loaded(folder, SourceSpec(path=folder), model, cfg)
            session = ort.InferenceSession(ir.model.SerializeToString(), providers=["CPUExecutionProvider"])
            done[family] = folder, model, cfg, ir, session
        return done[family]

    return export


@pytest.fixture(params=sorted(FAMILIES))
def exported(request, exports):
    return exports(request.param)


def test_signature_names_and_dims(exported):
    _, _, cfg, ir, _ = exported
    ins = {s.name: s for s in ir.inputs}
    outs = {s.name: s for s in ir.outputs}
    assert list(ins)[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert ins["input_ids"].shape == ["batch", "sequence"] and ins["input_ids"].dtype == "int64"
    assert ins["attention_mask"].shape == ["batch", "total_sequence"]
    assert ins["position_ids"].shape == ["batch", "sequence"]
    for i in range(cfg.num_layers):
        for kv in ("key", "value"):
            assert ins[f"past_key_values.{i}.{kv}"].shape == ["batch", 2, "past_sequence", cfg.head_dim]
            assert outs[f"present.{i}.{kv}"].shape == ["batch", 2, "total_sequence", cfg.head_dim]
    assert cfg.head_dim == (24 if cfg.family.startswith("gemma") else 16)  # Gemma's is not hidden / heads
    assert outs["logits"].shape == ["batch", "sequence", 128]
    assert ir.provenance["task"] == "text-generation" and ir.provenance["decoder"]["family"] == cfg.family


@pytest.mark.parametrize("past,sequence", [(0, 5), (0, 1), (1, 1), (4, 1), (9, 1), (6, 3)])
def test_prefill_and_decode_match_transformers(exported, past, sequence):
    """Left-padded batch of 2 (row 0 starts with two padded slots): every non-padded query's logits
    and the whole grown cache equal transformers' own forward pass with a DynamicCache."""
    import torch

    _, model, cfg, _, session = exported
    feeds = hf_decoder_step.sample_step(cfg, seed=past * 10 + sequence, past=past, sequence=sequence)
    if past == 0:  # prefill: row 0's padded slots are the first two of the prompt itself
        feeds["attention_mask"][0, :2] = 0
        pos = np.clip(np.cumsum(feeds["attention_mask"], axis=1) - 1, 0, None)
        feeds["position_ids"] = pos[:, -sequence:].astype(np.int64)
    module = hf_decoder_step.flat_cache_module(model, cfg)
    with torch.no_grad():
        ref = module(*[torch.from_numpy(feeds[n]) for n in cfg.input_names])
    got = session.run(cfg.output_names, feeds)
    valid = feeds["attention_mask"][:, past:].astype(bool)  # queries that are real tokens
    assert np.abs(got[0][valid] - ref[0].numpy()[valid]).max() < 1e-4
    real = feeds["attention_mask"].astype(bool)  # cache slots of real tokens (a padded slot stays masked out)
    for g, r in zip(got[1:], ref[1:], strict=True):
        assert g.shape == (2, cfg.kv_heads, past + sequence, cfg.head_dim)
        assert np.abs(g - r.numpy()).transpose(0, 2, 1, 3)[real].max() < 1e-5


def test_greedy_generation_equals_transformers(exported, tmp_path):
    """Our loop over the ONNX model (cache fed back) generates exactly transformers' greedy tokens
    from a left-padded batch of three prompts, logits within tolerance at every step."""
    import onnx

    _, model, cfg, ir, _ = exported
    path = tmp_path / "model.onnx"
    onnx.save(ir.model, str(path))
    prompts = generation.fixed_prompts(cfg.vocab_size, avoid=(cfg.safe_pad,))
    assert len({len(p) for p in prompts}) == len(prompts) > 1
    ref = generation.generate_transformers(model, prompts, 32, cfg.safe_pad)
    got = generation.generate_onnx(path, prompts, 32, cfg.safe_pad)
    result = generation.compare_generation(ref, got, hop="test")
    assert result.ok, result.reason
    assert result.tokens == 1.0 and result.max_abs < 1e-4
    assert got.tokens.shape == (3, 32)


def test_unsupported_family_is_refused_before_loading(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(UnsupportedError) as e:
        hf_decoder.read_decoder_config(folder)
    assert e.value.exit_code == 2 and "GPT2LMHeadModel" in str(e.value) and "\n" not in str(e.value)
    assert not hf_decoder.sniff(folder)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_a_sliding_window_shorter_than_the_text_is_honoured(exports, family, tmp_path):
    """Mistral (every layer) and Gemma2 (every other layer) with a window of 4 over prompts of up to
    7 tokens and 32 generated: the export generates what transformers generates with its
    sliding-window cache, and that differs from the same weights without a window (so the window
    is really in play)."""
    import onnx

    folder, model, cfg, ir, _ = exports(family)
    assert json.loads((Path(folder) / "config.json").read_text())["sliding_window"] == 4
    path = tmp_path / "model.onnx"
    onnx.save(ir.model, str(path))
    prompts = generation.fixed_prompts(cfg.vocab_size, avoid=(cfg.safe_pad,))
    ref = generation.generate_transformers(model, prompts, 32, cfg.safe_pad)
    got = generation.generate_onnx(path, prompts, 32, cfg.safe_pad)
    result = generation.compare_generation(ref, got, hop="test")
    assert result.ok and result.tokens == 1.0, result.reason
    full = {"sliding_window": None} if family == "mistral" else {"layer_types": ["full_attention"] * 2}
    unwindowed = hf_decoder.load_model(build(family, tmp_path / "full", **full))
    assert (generation.generate_transformers(unwindowed, prompts, 32, cfg.safe_pad).tokens != ref.tokens).mean() > 0.5


def test_gemma_layout_is_what_the_tests_exercise(exports):
    """The Gemma folder really has the traits the export must reproduce: head_dim apart from
    hidden / heads, a GELU-tanh MLP, tied embeddings and sqrt(hidden)-scaled embeddings."""
    folder, model, cfg, _, _ = exports("gemma")
    assert cfg.head_dim * cfg.num_heads != cfg.hidden_size and cfg.tied_embeddings
    assert model.config.hidden_act == "gelu_pytorch_tanh"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert float(model.model.embed_tokens.embed_scale) == pytest.approx(cfg.hidden_size ** 0.5)


def test_layer_types_other_than_full_and_sliding_are_refused(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
        "vocab_size": 128, "layer_types": ["chunked_attention", "full_attention"]}))
    (folder / "model.safetensors").write_bytes(b"x")
    with pytest.raises(UnsupportedError, match="layer types \\['chunked_attention'\\] is not supported") as e:
        hf_decoder.read_decoder_config(folder)
    assert e.value.exit_code == 2


def test_a_folder_without_safetensors_is_refused(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (folder / "pytorch_model.bin").write_bytes(b"x")
    assert hf_decoder.sniff(folder)
    with pytest.raises(BadInputError, match="safetensors"):
        hf_decoder.read_decoder_config(folder)


def test_tied_embeddings_follow_the_config(exported):
    folder, _, cfg, _, _ = exported
    config = json.loads((Path(folder) / "config.json").read_text())
    assert cfg.tied_embeddings == bool(config.get("tie_word_embeddings"))


def _config_folder(tmp_path: Path, architecture: str, **extra) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": [architecture], "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
        "vocab_size": 128, "max_position_embeddings": 256, **extra}))
    (folder / "model.safetensors").write_bytes(b"x")
    return folder


LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [4.0] * 8}


@pytest.mark.parametrize("architecture,extra,message", [
    ("LlamaForCausalLM", {"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
    ("LlamaForCausalLM", {"rope_parameters": {"rope_type": "dynamic", "factor": 4.0}},
     "rope type 'dynamic' is not supported (its frequencies follow the longest sequence seen so far"),
])
def test_rope_scalings_one_graph_cannot_reproduce_are_refused(tmp_path, architecture, extra, message):
    """Read from config.json before anything is loaded: old-style `rope_scaling: {type: ...}` too."""
    with pytest.raises(UnsupportedError) as e:
        hf_decoder.read_decoder_config(_config_folder(tmp_path, architecture, **extra))
    assert e.value.exit_code == 2 and message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("architecture,extra", [
    ("Phi3ForCausalLM", {"rope_parameters": {**LONGROPE, "original_max_position_embeddings": 256}}),  # never switches
    ("LlamaForCausalLM", {"rope_parameters": {**LONGROPE, "original_max_position_embeddings": 16}}),  # generate keeps the cache
    ("LlamaForCausalLM", {"rope_scaling": {"type": "linear", "factor": 2.0}}),
])
def test_rope_scalings_the_graph_reproduces_are_accepted(tmp_path, architecture, extra):
    assert hf_decoder.read_decoder_config(_config_folder(tmp_path, architecture, **extra)).architecture == architecture


@pytest.mark.parametrize("extra,context", [
    ({"rope_parameters": {**LONGROPE, "original_max_position_embeddings": 16}}, 16),
    ({"original_max_position_embeddings": 4096, "max_position_embeddings": 131072,
      "rope_scaling": {**LONGROPE, "type": "longrope"}}, 4096),  # Phi-3.5-mini's layout, old-style key
])
def test_phi3_longrope_that_switches_factors_is_limited_to_its_original_context(tmp_path, extra, context):
    """Past original_max_position_embeddings Phi-3 re-encodes its cache with the long factors, which
    a KV-cache graph cannot: the model is converted for the context up to that point."""
    cfg = hf_decoder.read_decoder_config(_config_folder(tmp_path, "Phi3ForCausalLM", **extra))
    longest = extra.get("max_position_embeddings", 256)
    assert cfg.context_length == context and cfg.context_capped_from == longest
    assert cfg.to_dict()["context_length"] == context


def test_an_export_failure_is_one_line_naming_its_cause(tmp_path):
    """A real torch.export failure (dynamic NTK rope branches on a tensor value): one line without
    the exporter's colour codes and advice, naming the error and the source line that raised it."""
    import torch
    import transformers

    plain = build("llama", tmp_path / "plain")
    dynamic = build("llama", tmp_path / "dynamic", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0})
    model = transformers.AutoModelForCausalLM.from_pretrained(str(dynamic), dtype=torch.float32).eval()
    with pytest.raises(UnsupportedError) as e:
        hf_decoder.export_decoder(dynamic, model=model, cfg=hf_decoder.read_decoder_config(plain))
    text = str(e.value)
    assert e.value.exit_code == 2 and "\n" not in text and "\x1b" not in text
    assert text.startswith(f"{dynamic}: LlamaForCausalLM cannot be exported with a KV cache: Could not guard on data-dependent")
    assert "(at transformers/modeling_rope_utils.py:" in text and text.endswith(", in dynamic_frequency_update)")


@pytest.mark.parametrize("family", ["llama-tied", "phi3"])
def test_the_export_streamed_to_a_file_holds_the_same_model_as_in_memory(exports, family, tmp_path):
    """The text-generation route has the exporter write its weights straight to a data file
    (`save_to`) and reads them back tensor by tensor (optimize/weight_store.py): the graph and every
    weight must be the ones the in-memory export holds, the same bytes, and the two files generate
    the same tokens and logits in onnxruntime."""
    import onnx

    from modelport.onnxfile.onnx_io import save_onnx
    from modelport.optimize.weight_store import WeightStore

    folder, model, cfg, ir, _ = exports(family)
    path = tmp_path / "stream" / "model.onnx"
    path.parent.mkdir()
    streamed, _ = hf_decoder.export_decoder(folder, model=model, cfg=cfg, save_to=path)
    external = [t.name for t in streamed.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and all(not t.raw_data for t in streamed.graph.initializer if t.name in external)
    WeightStore(path.parent).attach(streamed)
    in_memory = ir.model
    assert [n.SerializeToString() for n in streamed.graph.node] == [n.SerializeToString() for n in in_memory.graph.node]
    assert ([(i.name, i.SerializeToString()) for i in streamed.graph.input]
            == [(i.name, i.SerializeToString()) for i in in_memory.graph.input])
    mine = {t.name: onnx.numpy_helper.to_array(t) for t in in_memory.graph.initializer}
    theirs = {t.name: onnx.numpy_helper.to_array(t) for t in streamed.graph.initializer}
    assert mine.keys() == theirs.keys()
    for name, value in mine.items():
        assert value.dtype == theirs[name].dtype and value.shape == theirs[name].shape, name
        assert value.tobytes() == theirs[name].tobytes(), name
    save_onnx(in_memory, tmp_path / "memory.onnx")
    prompts = generation.fixed_prompts(cfg.vocab_size, seed=0, avoid=(cfg.safe_pad,))
    a = generation.generate_onnx(path, prompts, 4, cfg.safe_pad)
    b = generation.generate_onnx(tmp_path / "memory.onnx", prompts, 4, cfg.safe_pad)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.logits, b.logits)
