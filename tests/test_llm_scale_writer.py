"""bench/llm_scale.py's source folder writer: a random Qwen2 folder written tensor by tensor into
bf16 safetensors shards with an index, which transformers loads as it would a downloaded one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "llm_scale.py"


@pytest.fixture(scope="module")
def llm_scale():
    spec = importlib.util.spec_from_file_location("llm_scale", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("tied", [True, False])
def test_the_folder_is_sharded_and_loads(llm_scale, tmp_path, tied):
    import torch
    from transformers import AutoModelForCausalLM

    folder = llm_scale.build_folder(tmp_path / "src", shard_bytes=12_000, hidden_size=32, intermediate_size=64,
                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                                    tie_word_embeddings=tied)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and set(index["weight_map"].values()) == {p.name for p in shards}
    assert not list(folder.glob("part-*"))
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16)
    params = dict(model.named_parameters())
    assert all(p.dtype == torch.bfloat16 for p in params.values())
    assert torch.all(params["model.norm.weight"] == 1)
    std = float(params["model.layers.0.mlp.up_proj.weight"].float().std())
    assert 0.015 < std < 0.025
    assert ("lm_head.weight" in index["weight_map"]) is not tied
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for n, t in params.items()
                                                  if not (tied and n == "lm_head.weight"))
    again = llm_scale.build_folder(tmp_path / "again", shard_bytes=12_000, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                                   tie_word_embeddings=tied)
    assert [p.read_bytes() for p in sorted(again.glob("model-*"))] == [p.read_bytes() for p in shards]  # seeded


def test_the_7b_preset_has_qwen25_7b_shapes(llm_scale):
    p = llm_scale.PRESETS["7b"]
    assert (p["num_hidden_layers"], p["hidden_size"], p["num_attention_heads"], p["num_key_value_heads"],
            p["intermediate_size"], p["vocab_size"], p["tie_word_embeddings"]) == (28, 3584, 28, 4, 18944, 152064, False)
