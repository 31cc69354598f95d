"""Decoders written from config.json and the safetensors (parsers/hf_decoder_graph.py): both forms
compute what transformers computes on a left-padded decode step and a left-padded prefill, from fp32
and bf16 checkpoints; what the writer does not cover is named (and exported with dynamo instead);
weights that do not fit the config are refused before anything is written; and writing holds one
tensor at a time, not the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.alone import run_alone
from tests.hf_folders import build

FAMILIES = ["llama", "qwen2", "qwen3", "llama-tied", "llama3-rope"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {f: build(f, root / f) for f in FAMILIES}


def _transformers_outputs(folder: Path, feeds: dict, *, half: bool = False):
    import torch

    from modelport.parsers import hf_decoder, hf_decoder_step

    cfg = hf_decoder.read_decoder_config(folder)
    model = hf_decoder.load_model(folder)
    module = hf_decoder_step.flat_cache_module(model.half() if half else model, cfg)
    with torch.no_grad():
        outs = module(*[torch.from_numpy(feeds[n]) for n in cfg.input_names])
    return {n: o.float().numpy() for n, o in zip(cfg.output_names, outs, strict=True)}


def _written_outputs(folder: Path, out: Path, feeds: dict, *, fused: bool, dtype: str = "float32"):
    import onnxruntime as ort

    from modelport.parsers import hf_decoder, hf_decoder_graph

    cfg = hf_decoder.read_decoder_config(folder)
    out.mkdir(parents=True, exist_ok=True)
    hf_decoder_graph.write_decoder(folder, cfg, out / "model.onnx", fused=fused, dtype=dtype)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    outs = session.run(None, feeds)
    return dict(zip(cfg.output_names, [o.astype(np.float32) for o in outs], strict=True)), session


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("family", FAMILIES)
def test_written_graph_computes_what_transformers_computes(folders, family, fused, tmp_path):
    from modelport.parsers import hf_decoder, hf_decoder_graph, hf_decoder_step

    folder = folders[family]
    cfg = hf_decoder.read_decoder_config(folder)
    assert hf_decoder_graph.unsupported(folder, cfg) is None
    for name, feeds in (("decode", hf_decoder_step.sample_step(cfg, seed=1)),
                        ("prefill", hf_decoder_step.sample_step(cfg, seed=2, past=0, sequence=6))):
        want = _transformers_outputs(folder, feeds)
        got, _ = _written_outputs(folder, tmp_path / name, feeds, fused=fused)
        real = feeds["attention_mask"][:, -feeds["input_ids"].shape[1]:] == 1  # padded query rows are not compared
        assert np.abs(got["logits"][real] - want["logits"][real]).max() < 1e-5, name
        for n in cfg.present_names:
            keep = feeds["attention_mask"] == 1  # the cache at real slots
            assert np.abs(got[n].transpose(0, 2, 1, 3)[keep] - want[n].transpose(0, 2, 1, 3)[keep]).max() < 1e-5, (name, n)
    import onnx

    nodes = onnx.load(str(tmp_path / "decode" / "model.onnx"), load_external_data=False).graph.node
    ops = {n.op_type for n in nodes}
    if fused:
        assert "GroupQueryAttention" in ops and "SkipSimplifiedLayerNormalization" in ops
    else:
        assert all(n.domain in ("", "ai.onnx") for n in nodes) and "Softmax" in ops


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_float16_graph_computes_what_transformers_computes_in_float16(folders, family, fused, tmp_path):
    """float16 weights, activations, cache and logits: the logits and cache of a float16
    transformers model within float16's rounding, NaN-free in padded rows."""
    import onnx

    from modelport.parsers import hf_decoder, hf_decoder_step

    folder = folders[family]
    cfg = hf_decoder.read_decoder_config(folder)
    for name, feeds in (("decode", hf_decoder_step.sample_step(cfg, seed=1)),
                        ("prefill", hf_decoder_step.sample_step(cfg, seed=2, past=0, sequence=6))):
        feeds = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
        want = _transformers_outputs(folder, feeds, half=True)
        got, session = _written_outputs(folder, tmp_path / name, feeds, fused=fused, dtype="float16")
        real = feeds["attention_mask"][:, -feeds["input_ids"].shape[1]:] == 1
        scale = max(1.0, float(np.abs(want["logits"][real]).max()))
        assert np.abs(got["logits"][real] - want["logits"][real]).max() < 4e-3 * scale, name
        assert np.isfinite(got["logits"]).all()  # padded rows too: the softmax runs in float32 over a float32 bias
        for n in cfg.present_names:
            keep = feeds["attention_mask"] == 1
            assert np.abs(got[n].transpose(0, 2, 1, 3)[keep] - want[n].transpose(0, 2, 1, 3)[keep]).max() < 1e-2, (name, n)
        assert {t.type for t in (*session.get_inputs()[3:], *session.get_outputs())} == {"tensor(float16)"}
    model = onnx.load(str(tmp_path / "decode" / "model.onnx"), load_external_data=False)
    floats = {t.data_type for t in model.graph.initializer} - {onnx.TensorProto.INT64, onnx.TensorProto.INT32}
    norms_in_float32 = {onnx.TensorProto.FLOAT} if not fused else set()  # the RMSNorm epsilon of the float32 island
    assert floats == {onnx.TensorProto.FLOAT16} | norms_in_float32


def test_float16_clamps_weights_beyond_its_range_and_says_so(tmp_path):
    import onnx
    from safetensors.numpy import load_file, save_file

    from modelport.parsers import hf_decoder, hf_decoder_graph

    folder = build("llama", tmp_path / "src")
    tensors = load_file(str(folder / "model.safetensors"))
    big = tensors["model.layers.1.mlp.down_proj.weight"].copy()
    big[0, :3] = [1e5, -7e4, 6e4]  # two beyond float16's 65504, one within
    save_file({**tensors, "model.layers.1.mlp.down_proj.weight": big}, str(folder / "model.safetensors"))
    out = tmp_path / "out"
    out.mkdir()
    _, details = hf_decoder_graph.write_decoder(folder, hf_decoder.read_decoder_config(folder), out / "model.onnx",
                                                dtype="float16")
    assert details["dtype"] == "float16" and details["clamped"] == {"model.layers.1.mlp.down_proj.weight": 2}
    model = onnx.load(str(out / "model.onnx"))
    (down,) = [t for t in model.graph.initializer if t.name.startswith("model.layers.1.mlp.down_proj")]
    values = onnx.numpy_helper.to_array(down)
    assert values.dtype == np.float16 and np.isfinite(values).all()
    assert sorted(values[:3, 0].tolist()) == [-65504.0, 60000.0, 65504.0]


def test_a_bf16_checkpoint_is_read_as_transformers_reads_it(tmp_path):
    """bf16 weights widened to fp32 on reading: the same numbers transformers computes in fp32."""
    import torch
    import transformers

    from modelport.parsers import hf_decoder, hf_decoder_step

    folder = build("qwen2", tmp_path / "fp32")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16)
    bf16 = tmp_path / "bf16"
    model.save_pretrained(str(bf16))
    from safetensors import safe_open

    with safe_open(str(bf16 / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    cfg = hf_decoder.read_decoder_config(bf16)
    feeds = hf_decoder_step.sample_step(cfg, seed=3)
    want = _transformers_outputs(bf16, feeds)
    got, _ = _written_outputs(bf16, tmp_path / "out", feeds, fused=False)
    assert np.abs(got["logits"] - want["logits"]).max() < 1e-5


@pytest.mark.parametrize("family,why", [("mistral", "a sliding window of 4"), ("phi3", "family phi3"),
                                        ("gemma", "family gemma")])
def test_what_the_writer_does_not_cover_is_named(family, why, tmp_path):
    from modelport.parsers import hf_decoder, hf_decoder_graph

    folder = build(family, tmp_path / family)
    assert why in hf_decoder_graph.unsupported(folder, hf_decoder.read_decoder_config(folder))


def test_uncovered_folders_take_the_dynamo_export(cli, tmp_path):
    """A sliding window shorter than the context: exported with dynamo, the parse row says why."""
    folder = build("mistral", tmp_path / "src" / "mistral")
    r = cli("convert", folder, "--task", "text-generation", "-o", tmp_path / "out", "--json", "--new-tokens", "4")
    assert r.exit_code == 0, r
    parse = next(s for s in r.json()["stages"] if s["name"] == "parse")
    assert parse["exporter"].startswith("torch.onnx dynamo") and parse["writer_skipped"] == "a sliding window of 4"


def test_covered_folders_are_written_not_traced(cli, folders, tmp_path):
    """Written at the opset asked for (from 18 on), the fused form too."""
    import onnx

    r = cli("convert", folders["qwen2"], "--task", "text-generation", "-o", tmp_path / "out", "--json", "--new-tokens", "4",
            "--opset", "20", "--optimize", "all")
    assert r.exit_code == 0, r
    parse = next(s for s in r.json()["stages"] if s["name"] == "parse")
    assert parse["exporter"] == "modelport decoder writer (config + safetensors)" and "writer_skipped" not in parse
    model = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    assert {o.domain: o.version for o in model.opset_import}[""] == 20
    assert any(n.op_type == "GroupQueryAttention" for n in model.graph.node)


def test_a_tensor_the_config_does_not_describe_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file

    from modelport.errors import BadInputError
    from modelport.parsers import hf_decoder, hf_decoder_graph

    folder = build("llama", tmp_path / "src")
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({**tensors, "model.layers.0.mlp.extra.weight": np.zeros((4, 4), np.float32)}, str(folder / "model.safetensors"))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(BadInputError, match="does not describe: model.layers.0.mlp.extra.weight"):
        hf_decoder_graph.write_decoder(folder, hf_decoder.read_decoder_config(folder), out / "model.onnx")


WRITE = """
import sys
from pathlib import Path
from modelport.run.memory import own_peak
from modelport.parsers import hf_decoder, hf_decoder_graph
small, big, out = map(Path, sys.argv[1:4])
for folder in (small, big):
    cfg = hf_decoder.read_decoder_config(folder)
    (out / folder.name).mkdir(parents=True)
    hf_decoder_graph.write_decoder(folder, cfg, out / folder.name / "model.onnx", fused=sys.argv[4] == "fused")
    print(own_peak())
"""


@pytest.mark.parametrize("form", ["plain", "fused"])
def test_writing_holds_one_tensor_at_a_time_not_the_model(tmp_path, form):
    """A 16-layer folder of 217 MB (fp32, no tensor over 6 MB) written after a 1-layer one in the same
    process: the high-water mark may grow by a few of its largest tensors, far from the model's size
    (reading the checkpoint whole, or keeping the written weights, would add over 200 MB)."""
    shape = dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=4, vocab_size=1024)
    small = build("llama", tmp_path / "small", num_hidden_layers=1, **shape)
    big = build("llama", tmp_path / "big", num_hidden_layers=16, **shape)
    weights = (big / "model.safetensors").stat().st_size
    assert weights > 200e6
    after_small, after_big = map(int, run_alone(WRITE, str(small), str(big), str(tmp_path / "out"), form).split())
    assert after_big - after_small < 0.15 * weights, (after_small, after_big, weights)
    assert (tmp_path / "out" / "big" / "model.onnx.data").stat().st_size >= weights


@pytest.mark.parametrize("rope", [None, {"rope_type": "linear", "rope_theta": 500000.0, "factor": 4.0},
                                  {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}],
                         ids=["default", "linear", "llama3"])
def test_rotary_tables_are_what_the_rotary_module_computes(rope, tmp_path):
    """The tables the writer computes in numpy against transformers' own LlamaRotaryEmbedding."""
    import torch
    import transformers

    from modelport.parsers import hf_decoder, hf_decoder_rotary

    folder = build("llama", tmp_path / "src", **({"rope_parameters": rope} if rope else {}))
    cfg = hf_decoder.read_decoder_config(folder)
    cos, sin = hf_decoder_rotary.rotary_tables(folder, cfg)
    config = transformers.AutoConfig.from_pretrained(str(folder))
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config=config)
    want_cos, want_sin = rotary(torch.zeros(1), torch.arange(cfg.context_length)[None, :])
    half = cfg.head_dim // 2
    assert cos.shape == (cfg.context_length, half) and cos.dtype == np.float32
    assert np.abs(cos - want_cos[0, :, :half].numpy()).max() < 1e-5 and np.abs(sin - want_sin[0, :, :half].numpy()).max() < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reference_model_loaded_per_tensor_is_the_one_from_pretrained_loads(folders, family):
    """The reference child's loader (one tensor mapped at a time) against transformers' own: the same
    parameters and buffers (rotary frequencies included), the output projection tied where it is."""
    import torch

    from modelport.parsers import hf_decoder_loading

    ours, theirs = hf_decoder_loading.load_model_per_tensor(folders[family]), hf_decoder_loading.load_model(folders[family])
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    buffers = dict(theirs.named_buffers())
    assert all(torch.equal(v, buffers[n]) for n, v in ours.named_buffers())
    tied = ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    assert tied == (theirs.lm_head.weight.data_ptr() == theirs.model.embed_tokens.weight.data_ptr())
