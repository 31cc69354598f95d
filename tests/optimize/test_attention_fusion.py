"""Attention fusion on real torch.onnx dynamo exports of transformers BERT and GPT-2 (eager
attention, dynamic batch and sequence), checked on other batch/sequence sizes and padded masks."""

from __future__ import annotations

import contextlib
import io
from collections import Counter

import numpy as np
import pytest

from modelport.optimize import get_pass

LAYERS = 2


def _export(model, names, args, path):
    import torch

    dims = {"batch": torch.export.Dim("batch"), "sequence": torch.export.Dim("sequence")}
    dynamic = tuple({0: dims["batch"], 1: dims["sequence"]} for _ in names)
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(model, args, str(path), input_names=names, dynamic_shapes=dynamic, dynamo=True,
                          external_data=False)


def _feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2:] = 0  # padded tail on the last row
    return {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64), "attention_mask": mask}


def _ir(path):
    import onnx

    from modelport.ir import IRModel, Reference, specs_from_onnx
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    model = onnx.load(str(path))
    feeds = _feeds(2, 16)
    ref = Reference(feeds, OnnxRuntimeRunner(model).run(feeds))
    return IRModel(model, specs_from_onnx(model.graph.input), specs_from_onnx(model.graph.output), reference=ref)


def _bert(path, *, biased: bool):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
                                 intermediate_size=128, max_position_embeddings=64,
                                 attn_implementation="eager")).eval()
    with torch.no_grad():
        if biased:  # trained models have non-zero biases; random init has zeros
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.copy_(torch.randn_like(p) * 0.1)
        else:  # bias-free Q/K/V projections
            for layer in model.encoder.layer:
                att = layer.attention.self
                for proj in ("query", "key", "value"):
                    old = getattr(att, proj)
                    new = torch.nn.Linear(old.in_features, old.out_features, bias=False)
                    new.weight.copy_(old.weight)
                    setattr(att, proj, new)
    ids, mask = (torch.from_numpy(v) for v in _feeds(2, 16).values())
    _export(model, ["input_ids", "attention_mask"], (ids, mask), path)
    return _ir(path)


def _gpt(path):
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    inner = GPT2Model(GPT2Config(vocab_size=1000, n_embd=64, n_layer=LAYERS, n_head=4, n_positions=64,
                                 use_cache=False, attn_implementation="eager")).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = inner

        def forward(self, input_ids, attention_mask):
            return self.gpt(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids, mask = (torch.from_numpy(v) for v in _feeds(2, 16).values())
    _export(LastHidden().eval(), ["input_ids", "attention_mask"], (ids, mask), path)
    return _ir(path)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    d = tmp_path_factory.mktemp("attn")
    return {"bert": _bert(d / "bert.onnx", biased=False), "bert_biased": _bert(d / "bert_b.onnx", biased=True),
            "gpt": _gpt(d / "gpt.onnx")}


def _all_level(ir, name="transformer"):
    """What `--optimize all` ends with: the transformer fusions, then simplify."""
    result = get_pass(name).apply(ir)
    result.model = get_pass("simplify").apply(result.model).model
    return result


def _ops(ir) -> Counter:
    return Counter(f"{n.domain}:{n.op_type}" for n in ir.model.graph.node)


def _assert_same(raw, fused, batch, seq):
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    feeds = _feeds(batch, seq, seed=batch * 100 + seq)
    a, b = OnnxRuntimeRunner(raw.model).run(feeds), OnnxRuntimeRunner(fused.model).run(feeds)
    assert a.keys() == b.keys()
    for k in a:
        assert b[k].shape == a[k].shape and a[k].shape[0] == batch
        np.testing.assert_allclose(b[k], a[k], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("key", ["bert", "bert_biased"])
def test_bert_attention_fuses_into_packed_attention(exports, key):
    raw = exports[key]
    result = _all_level(raw)
    ops = _ops(result.model)
    assert ops["com.microsoft:Attention"] == LAYERS, ops
    assert ops[":Softmax"] == 0 and ops["com.microsoft:MultiHeadAttention"] == 0
    assert ops["com.microsoft:SkipLayerNormalization"] == 0  # slower than Add+LayerNorm on ORT CPU
    fusions = result.details["fusions"]
    assert fusions["sdpa"] == fusions["mha"] == fusions["attention"] == LAYERS
    # without biases our rule gives MHA a zero bias so Q/K/V pack; non-zero ones go upstream
    assert fusions.get("mha_zero_bias", 0) == (0 if key == "bert_biased" else LAYERS)
    assert fusions.get("mha_bias", 0) == (LAYERS if key == "bert_biased" else 0)
    for batch, seq in ((2, 16), (3, 7), (1, 40)):
        _assert_same(raw, result.model, batch, seq)


def test_gpt_attention_fuses_through_flattening_reshape(exports):
    raw = exports["gpt"]
    result = _all_level(raw)
    ops = _ops(result.model)
    assert ops["com.microsoft:MultiHeadAttention"] == LAYERS, ops
    assert ops[":Softmax"] == 0
    # GPT-2's Conv1D flattens the merged heads to (B*S, D): the MHA output is reshaped back
    graph = result.model.model.graph
    consumers = {i: n for n in graph.node for i in n.input}
    for n in graph.node:
        if n.op_type == "MultiHeadAttention":
            assert consumers[n.output[0]].op_type == "Reshape"
    for batch, seq in ((2, 16), (3, 7), (1, 40)):
        _assert_same(raw, result.model, batch, seq)


def test_transformer_sln_also_fuses_skip_layer_norm(exports):
    raw = exports["bert"]
    result = _all_level(raw, "transformer-sln")
    ops = _ops(result.model)
    assert ops["com.microsoft:Attention"] == LAYERS
    assert ops["com.microsoft:SkipLayerNormalization"] >= 2 * LAYERS
    _assert_same(raw, result.model, 3, 7)


def test_all_level_keeps_the_fused_attention(exports):
    from modelport.optimize.pipeline import OptimizeOptions, optimize_ir

    out, rows, *_ = optimize_ir(exports["gpt"], OptimizeOptions(level="all"))
    row = next(r for r in rows if r["pass"] == "transformer")
    assert row["status"] == "applied", row["reason"]
    assert _ops(out)["com.microsoft:MultiHeadAttention"] == LAYERS
