"""Decoder fusions on our KV-cache exports (optimize/decoder_fusion.py, optimize/gqa_fusion.py): every layer's
attention becomes one GroupQueryAttention on the un-expanded cache, rotary inside it, q/k/v packed, and the
fused model equals the unfused one at prefill and decode over a left-padded batch, and generates what
transformers generates."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.optimize.decoder_fusion import fuse_decoder
from modelport.optimize.gqa_fusion import fuse_group_query_attention
from modelport.parsers import hf_decoder, hf_decoder_step
from modelport.validation import generation
from tests.hf_folders import COMMON, build

FAMILIES = ("llama", "qwen2", "phi3", "mistral", "gemma")


def _build(family: str, folder):
    """tests/hf_folders.py's families, plus Mistral and Gemma (head_dim 32 while hidden/heads is 16) built here."""
    if family in ("llama", "qwen2", "phi3"):
        return build(family, folder)
    import torch
    import transformers

    from tests.hf_folders import write_tokenizer

    torch.manual_seed(0)
    if family == "mistral":
        config, cls = transformers.MistralConfig(**COMMON, sliding_window=None), transformers.MistralForCausalLM
    else:
        config, cls = transformers.GemmaConfig(**COMMON, head_dim=32), transformers.GemmaForCausalLM
    folder.mkdir(parents=True, exist_ok=True)
    cls(config).eval().save_pretrained(str(folder))
    write_tokenizer(folder)
    return folder


@pytest.fixture(scope="module", params=FAMILIES)
def fused(request, tmp_path_factory):
    """(family, raw export, transformers model, cfg, unfused session, fused model, details, fused session);
    fuse_decoder must leave its input as it was."""
    import onnxruntime as ort

    folder = _build(request.param, tmp_path_factory.mktemp(request.param) / "model")
    cfg = hf_decoder.read_decoder_config(folder)
    model = hf_decoder.load_model(folder)
    raw, cfg = hf_decoder.export_decoder(folder, model=model, cfg=cfg)
    before = raw.SerializeToString()
    out, details = fuse_decoder(raw, context_length=cfg.context_length)
    assert raw.SerializeToString() == before

    def session(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])

    return request.param, raw, model, cfg, session(raw), out, details, session(out)


def test_every_layer_is_one_group_query_attention(fused):
    family, _, _, cfg, _, model, details, _ = fused
    ops = [n.op_type for n in model.graph.node]
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == cfg.num_layers and details["fused"]["GroupQueryAttention"] == cfg.num_layers
    assert details["group_query_attention"]["fused"] == list(range(cfg.num_layers))
    assert details["group_query_attention"]["unfused"] == {}
    assert details["rules"]["group_query_attention"] == cfg.num_layers
    # no repeat_kv, no separate attention or rotary arithmetic left: the cache is read by GQA alone
    assert "MultiHeadAttention" not in ops and "Neg" not in ops and "Cos" not in ops and "Transpose" not in ops
    assert not [n for n in model.graph.node if any(i.startswith("present.") for i in n.input)]
    assert ops.count("Expand") == 3  # seqlens_k, query_seqlens and the padding bias, once per model
    attrs = {a.name: a for a in gqa[0].attribute}
    assert attrs["num_heads"].i == cfg.num_heads and attrs["kv_num_heads"].i == cfg.kv_heads and attrs["do_rotary"].i == 1
    assert attrs["scale"].f == pytest.approx(cfg.head_dim ** -0.5, rel=1e-6)
    if family == "gemma":
        assert cfg.head_dim * cfg.num_heads != cfg.hidden_size
    # q/k/v packed into one projection: the key and value inputs are empty
    assert all(n.input[1] == "" and n.input[2] == "" for n in gqa) and details["group_query_attention"]["packed_qkv"] == 2
    # per layer: qkv, o_proj, gate+up (packed here; Phi-3 exports them packed), down; then the LM head
    assert ops.count("MatMul") == 4 * cfg.num_layers + 1
    assert details["rules"].get("packed_matmuls", 0) == (0 if family == "phi3" else cfg.num_layers)
    assert details["nodes"] < details["nodes_before"] / 3


@pytest.mark.parametrize("past,sequence", [(0, 5), (0, 1), (1, 1), (4, 1), (9, 1), (6, 3)])
def test_prefill_and_decode_equal_the_unfused_model(fused, past, sequence):
    """Left-padded batch of 2 (row 0 starts with two padded slots, its positions start at 0 at its
    first real token): logits of real queries and the grown cache at real slots equal the unfused export's."""
    _, _, _, cfg, raw, _, _, session = fused
    feeds = hf_decoder_step.sample_step(cfg, seed=past * 10 + sequence, past=past, sequence=sequence)
    if past == 0:
        feeds["attention_mask"][0, :2] = 0
        pos = np.clip(np.cumsum(feeds["attention_mask"], axis=1) - 1, 0, None)
        feeds["position_ids"] = pos[:, -sequence:].astype(np.int64)
    ref = raw.run(cfg.output_names, feeds)
    got = session.run(cfg.output_names, feeds)
    valid = feeds["attention_mask"][:, past:].astype(bool)
    assert np.abs(got[0][valid] - ref[0][valid]).max() < 2e-6
    real = feeds["attention_mask"].astype(bool)
    for g, r in zip(got[1:], ref[1:], strict=True):
        assert g.shape == r.shape == (2, cfg.kv_heads, past + sequence, cfg.head_dim)
        assert np.abs(g - r).transpose(0, 2, 1, 3)[real].max() < 2e-6
        assert np.isfinite(g).all()


def test_fused_model_generates_like_transformers(fused, tmp_path):
    """Our greedy loop over the fused model, three prompts of different lengths left-padded into one
    batch, 24 tokens: transformers' tokens, logits within 1e-4 at every step."""
    import onnx

    _, _, model, cfg, _, out, _, _ = fused
    path = tmp_path / "fused.onnx"
    onnx.save(out, str(path))
    prompts = generation.fixed_prompts(cfg.vocab_size, avoid=(cfg.safe_pad,))
    ref = generation.generate_transformers(model, prompts, 24, cfg.safe_pad)
    got = generation.generate_onnx(path, prompts, 24, cfg.safe_pad)
    result = generation.compare_generation(ref, got, hop="test")
    assert result.ok, result.reason
    assert result.tokens == 1.0 and result.max_abs < 1e-4


def test_a_graph_without_the_attention_form_is_left_unfused_with_reasons(fused):
    """On the raw export (no MultiHeadAttention yet) nothing matches: each layer is named with its reason
    and the model is returned as it was."""
    import onnx

    _, raw, _, cfg, _, _, _, _ = fused
    copy = onnx.ModelProto()
    copy.CopyFrom(raw)
    out, details = fuse_group_query_attention(copy, context_length=64)
    assert details["fused"] == [] and set(details["unfused"]) == {str(i) for i in range(cfg.num_layers)}
    assert all(isinstance(reason, str) and reason for reason in details["unfused"].values())
    assert out.SerializeToString() == raw.SerializeToString()


def test_onnxscript_group_query_attention_rules_are_not_run(tmp_path, monkeypatch):
    """onnxscript's GQA rules take the mask for purely causal: on transformers 5.17's export they fused
    every layer and generated differently on a left-padded batch (agreement 0.375, measured), so
    they must never run inside fuse_decoder; they are put back afterwards."""
    from onnxscript.rewriter.ort_fusions import _core

    calls = []

    def spy(model, debug=False, **kw):
        calls.append(kw)
        return 0

    for name in ("fuse_gqa", "fuse_qkv_gqa"):
        monkeypatch.setattr(_core, name, spy)
    folder = build("llama", tmp_path / "llama")
    raw, cfg = hf_decoder.export_decoder(folder)
    _, details = fuse_decoder(raw, context_length=cfg.context_length)
    assert calls == [] and "gqa" not in details["rules"]
    assert details["rules"]["group_query_attention"] == cfg.num_layers
    assert _core.fuse_gqa is spy and _core.fuse_qkv_gqa is spy


def _as_rotary_embedding_nodes(model, inv_freq, head_dim: int, num_heads: int) -> int:
    """Rewrite a pre-GQA graph into the form onnxscript's rotary rules leave on transformers 5.17 exports: every
    rotate_half rotary becomes `com.microsoft.RotaryEmbedding(x, position_ids, cos, sin)` with cos/sin of
    head_dim/2 per position computed at run time from `Range(0, ReduceMax(position_ids) + 1)`, the key's on its
    BNSH heads and the query's on the [B, S, H·D] projection, which then feeds the attention directly.
    Returns how many RotaryEmbedding nodes were made."""
    import onnx
    import onnx.numpy_helper as nh

    from modelport.optimize import gqa_fusion as gf
    from modelport.optimize import gqa_matching as gm

    graph, make = model.graph, onnx.helper.make_node
    graph.initializer.extend([nh.from_array(np.asarray(v), n) for n, v in (
        ("r_zero", np.int64(0)), ("r_one", np.int64(1)), ("r_col", np.array([-1, 1], np.int64)),
        ("r_inv_freq", np.asarray(inv_freq, np.float32).reshape(1, head_dim // 2)))])
    nodes = [
        make("ReduceMax", ["position_ids"], ["r_max"], keepdims=0),
        make("Add", ["r_max", "r_one"], ["r_end"]),
        make("Range", ["r_zero", "r_end", "r_one"], ["r_range"]),
        make("Reshape", ["r_range", "r_col"], ["r_column"]),
        make("Cast", ["r_column"], ["r_positions"], to=onnx.TensorProto.FLOAT),
        make("MatMul", ["r_positions", "r_inv_freq"], ["r_angles"]),
        make("Cos", ["r_angles"], ["r_cos"]),
        make("Sin", ["r_angles"], ["r_sin"]),
    ]
    g, drop, made = gm.Graph(graph), set(), 0
    for i in range(sum(1 for x in graph.input if x.name.startswith("past_key_values.") and x.name.endswith(".key"))):
        ck = g.node(f"present.{i}.key", "Concat")
        k_heads, _, _ = gm._rope(g, ck.input[1], head_dim)
        drop.add(id(g.producer[ck.input[1]]))
        nodes.append(make("RotaryEmbedding", [k_heads, "position_ids", "r_cos", "r_sin"], [ck.input[1]], domain=gm.MS,
                          interleaved=0, num_heads=1))
        mha = gm._forward_to(g, ck.output[0], "MultiHeadAttention")
        t = g.node(g.node(mha.input[0], "Reshape").input[0], "Transpose")
        q = gm._heads(g, gm._rope(g, t.input[0], head_dim)[0])
        nodes.append(make("RotaryEmbedding", [q, "position_ids", "r_cos", "r_sin"], [f"r_query_{i}"], domain=gm.MS,
                          num_heads=num_heads))
        mha.input[0] = f"r_query_{i}"
        made += 2
    kept = [n for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(nodes + kept)
    gf._toposort(graph)
    gf._dce(graph)
    return made


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_rotary_embedding_form_of_transformers_517_fuses_exactly(family, tmp_path):
    """transformers 5.17's export meets onnxscript's rotary rules, so the rotation arrives as RotaryEmbedding
    nodes with run-time cos/sin of head_dim/2 per position (built here from this version's export): every layer
    still becomes one GroupQueryAttention, equal to the unfused export at past lengths 0/1/4/9, left-padded."""
    import onnxruntime as ort

    folder = _build(family, tmp_path / family)
    cfg = hf_decoder.read_decoder_config(folder)
    model = hf_decoder.load_model(folder)
    raw, cfg = hf_decoder.export_decoder(folder, model=model, cfg=cfg)
    pre, _ = fuse_decoder(raw, context_length=cfg.context_length, group_query_attention=False)
    inv_freq = model.model.rotary_emb.inv_freq.detach().numpy()
    assert _as_rotary_embedding_nodes(pre, inv_freq, cfg.head_dim, cfg.num_heads) == 2 * cfg.num_layers
    # the rotate_half arithmetic left is read only by the mask's Shape; attention and cache read RotaryEmbedding
    producer = {o: n for n in pre.graph.node for o in n.output}
    mha = [n for n in pre.graph.node if n.op_type == "MultiHeadAttention"]
    assert len(mha) == cfg.num_layers and all(producer[n.input[0]].op_type == "RotaryEmbedding" for n in mha)
    assert all(producer[producer[f"present.{i}.key"].input[1]].op_type == "RotaryEmbedding" for i in range(cfg.num_layers))

    def session(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])

    rotary = session(pre)
    out, details = fuse_group_query_attention(pre, context_length=cfg.context_length)
    assert details["unfused"] == {} and details["fused"] == list(range(cfg.num_layers))
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("GroupQueryAttention") == cfg.num_layers
    assert not {"RotaryEmbedding", "MultiHeadAttention", "Neg", "Cos", "Sin", "Range"} & set(ops)
    raw_s, fused_s = session(raw), session(out)
    for past in (0, 1, 4, 9):
        sequence = 5 if past == 0 else 1
        feeds = hf_decoder_step.sample_step(cfg, seed=past, past=past, sequence=sequence)
        feeds["attention_mask"][0, :2] = 0
        pos = np.clip(np.cumsum(feeds["attention_mask"], axis=1) - 1, 0, None)
        feeds["position_ids"] = pos[:, -sequence:].astype(np.int64)
        ref = raw_s.run(cfg.output_names, feeds)
        valid = feeds["attention_mask"][:, past:].astype(bool)
        real = feeds["attention_mask"].astype(bool)
        for got in (rotary.run(cfg.output_names, feeds), fused_s.run(cfg.output_names, feeds)):
            assert np.abs(got[0][valid] - ref[0][valid]).max() < 2e-6
            for g, r in zip(got[1:], ref[1:], strict=True):
                assert g.shape == r.shape == (2, cfg.kv_heads, past + sequence, cfg.head_dim)
                assert np.abs(g - r).transpose(0, 2, 1, 3)[real].max() < 2e-6


def test_fusion_reading_the_weights_from_the_export_file_gives_the_same_model(fused, tmp_path):
    """The text-generation route fuses the export as written to a file with external data, reading each
    weight from there only when needed (optimize/weight_store.py): the model must be the one fusing the
    export held in memory gives, byte for byte, with every weight back in memory."""
    import onnx

    from modelport.onnxfile.onnx_io import save_onnx

    _, raw, _, cfg, _, out, _, _ = fused
    save_onnx(raw, tmp_path / "model.onnx", external=True)
    graph_only = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    assert sum(t.data_location == onnx.TensorProto.EXTERNAL for t in graph_only.graph.initializer) > 5
    from_file, _ = fuse_decoder(graph_only, context_length=cfg.context_length, base_dir=tmp_path)
    assert not [t.name for t in from_file.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert from_file.SerializeToString() == out.SerializeToString()
