"""Attention fusion on real torch.onnx dynamo exports of transformers BERT and GPT-2 (eager
attention, dynamic batch and sequence; GPT-2 also with a KV cache), checked on other
batch/sequence/past sizes and padded masks."""

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


def _ir(path, feeds=None):
    import onnx

    from modelport.ir import IRModel, Reference, specs_from_onnx
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    model = onnx.load(str(path))
    feeds = feeds or _feeds(2, 16)
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


def _optimize(ir, **opts):
    from modelport.optimize.pipeline import OptimizeOptions, optimize_ir

    out, rows, _ = optimize_ir(ir, OptimizeOptions(**opts))
    row = next(r for r in rows if r["pass"] == "transformer")
    assert row["status"] == "applied", row["reason"]  # not rolled back by the parity gate
    return out, row


@pytest.mark.parametrize(("key", "fused_op"), [("bert", "Attention"), ("gpt", "MultiHeadAttention")])
def test_simplify_before_transformer_still_fuses_dynamic_exports(exports, key, fused_op):
    # onnxsim drops the exporter's shapes; onnx alone re-infers a different `unk__N` head count
    # for Q, K and V, and the symbolic shape inference in front of the rules repairs that
    raw = exports[key]
    out, row = _optimize(raw, level=None, passes=["simplify", "transformer"])
    ops = _ops(out)
    assert ops[f"com.microsoft:{fused_op}"] == LAYERS, ops
    assert ops[":Softmax"] == 0
    assert row["details"]["fusions"]["sdpa"] == LAYERS
    for batch, seq in ((3, 7), (1, 40)):
        _assert_same(raw, out, batch, seq)
    # the repaired shapes are matching evidence only: the graph's I/O shapes are the export's
    assert [o.type for o in out.model.graph.output] == [o.type for o in raw.model.graph.output]


def test_canonical_dim_name():
    from modelport.optimize.attention_fusion import canonical_dim_name

    assert canonical_dim_name("sequence + past_sequence") == canonical_dim_name("past_sequence + sequence")
    assert canonical_dim_name("s0*2 + 1") == canonical_dim_name("1 + 2*s0") == "1 + 2*s0"
    for name in ("batch", "unk__3", "Min(64, sequence)", "s0 - 1", "2**s0", "__import__('os')"):
        assert canonical_dim_name(name) == name


# GPT-2 with a KV cache: past key/value per layer in, present key/value per layer out.
HEADS, HEAD_SIZE = 4, 16


def _kv_feeds(batch: int, past: int, new: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, past + new), np.int64)
    if past:
        mask[-1, 0] = 0  # a padded cached position
    if new > 1:
        mask[-1, -(new // 2):] = 0  # a padded tail of the new tokens
    feeds = {"input_ids": rng.integers(0, 1000, (batch, new)).astype(np.int64), "attention_mask": mask}
    for i in range(LAYERS):
        for kv in ("key", "value"):
            feeds[f"past_{kv}_{i}"] = rng.standard_normal((batch, HEADS, past, HEAD_SIZE)).astype(np.float32)
    return feeds


def _gpt_kv(path):
    import torch
    from transformers import DynamicCache, GPT2Config, GPT2Model

    torch.manual_seed(0)
    inner = GPT2Model(GPT2Config(vocab_size=1000, n_embd=HEADS * HEAD_SIZE, n_layer=LAYERS, n_head=HEADS,
                                 n_positions=64, use_cache=True, attn_implementation="eager")).eval()

    class WithCache(torch.nn.Module):
        """Flat past tensors in, flat present tensors out; the DynamicCache lives inside."""

        def __init__(self):
            super().__init__()
            self.gpt = inner

        def forward(self, input_ids, attention_mask, past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(LAYERS)])
            out = self.gpt(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.last_hidden_state, *present)

    feeds = _kv_feeds(2, 3, 5)
    pasts = [f"past_{kv}_{i}" for i in range(LAYERS) for kv in ("key", "value")]
    Dim = torch.export.Dim
    batch, seq, past, total = Dim("batch"), Dim("sequence"), Dim("past_sequence"), Dim("total_sequence")
    dynamic = ({0: batch, 1: seq}, {0: batch, 1: total}, tuple({0: batch, 2: past} for _ in pasts))
    args = (torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]),
            tuple(torch.from_numpy(feeds[n]) for n in pasts))
    outputs = ["last_hidden_state", *(n.replace("past", "present") for n in pasts)]
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(WithCache().eval(), args, str(path), input_names=["input_ids", "attention_mask", *pasts],
                          output_names=outputs, dynamic_shapes=dynamic, dynamo=True, external_data=False)
    return _ir(path, feeds)


@pytest.fixture(scope="module")
def gpt_kv(tmp_path_factory):
    return _gpt_kv(tmp_path_factory.mktemp("attn_kv") / "gpt_kv.onnx")


@pytest.mark.parametrize("opts", [{"level": None, "passes": ["transformer"]}, {"level": "all"},
                                  {"level": None, "passes": ["simplify", "transformer"]}],
                         ids=["transformer", "all", "simplify-transformer"])
def test_kv_cache_attention_fuses_into_mha_with_past_and_present(gpt_kv, opts):
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

    out, row = _optimize(gpt_kv, **opts)
    ops = _ops(out)
    assert ops["com.microsoft:MultiHeadAttention"] == LAYERS, ops
    assert ops[":Softmax"] == 0
    graph = out.model.graph
    assert not [n for n in graph.node if n.op_type == "Concat" and any(i.startswith("past_") for i in n.input)]
    outputs = [o.name for o in graph.output]
    for n in graph.node:
        if n.op_type == "MultiHeadAttention":  # past key/value in (inputs 6, 7), present out
            assert n.input[6].startswith("past_key_") and n.input[7].startswith("past_value_")
            assert len(n.output) == 3 and n.output[1] in outputs and n.output[2] in outputs
    assert [o.type for o in graph.output] == [o.type for o in gpt_kv.model.graph.output]
    # prefill from an empty cache, prefill and decode on a cache, at other batch sizes
    for batch, past, new in ((3, 0, 4), (2, 0, 1), (1, 7, 1), (3, 9, 6), (2, 3, 5)):
        feeds = _kv_feeds(batch, past, new, seed=batch * 100 + past * 10 + new)
        a, b = OnnxRuntimeRunner(gpt_kv.model).run(feeds), OnnxRuntimeRunner(out.model).run(feeds)
        assert a.keys() == b.keys() and b["present_key_0"].shape == (batch, HEADS, past + new, HEAD_SIZE)
        for k in a:
            np.testing.assert_allclose(b[k], a[k], atol=1e-4, rtol=1e-4)


def test_symbolic_shapes_fill_what_onnx_cannot_and_leave_no_files(tmp_path, monkeypatch):
    import onnx_ir as ir
    from onnx import TensorProto, helper

    from modelport.optimize.attention_fusion import fill_symbolic_shapes

    # Reshape(x, [2, -1]) on (n, 8): onnx calls the -1 dim `unk__N`, sympy gets 4*n. The op after
    # it is unknown to both, so the symbolic inference stops there (the upstream helper would then
    # write sym_shape_infer_temp.onnx into the working directory and raise).
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["y"]), helper.make_node("Foo", ["y"], ["z"], domain="custom"),
         helper.make_node("Relu", ["z"], ["w"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("w", TensorProto.FLOAT, None)],
        [helper.make_tensor("target", TensorProto.INT64, [2], [2, -1])])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                                  helper.make_opsetid("custom", 1)]))
    monkeypatch.chdir(tmp_path)
    restore = fill_symbolic_shapes(model)
    y = model.graph.node(0).outputs[0]
    assert [d if isinstance(d, int) else d.value for d in y.shape] == [2, "4*n"]
    assert list(tmp_path.iterdir()) == []
    restore()
    assert y.shape is None
