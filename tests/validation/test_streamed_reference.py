"""The streamed reference: a decoder's teacher-forced logits a layer at a time from its safetensors.

Tiny random Llama / Qwen2 / Mistral folders (3 layers, saved in 100 KB shards so an index lists
them) give the same logits streamed as the whole model in memory; the weights are read once each,
and no more than the running decoder layer ever holds weights.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from modelport.errors import BadInputError, UnsupportedError
from modelport.validation.streamed_reference import logits_agreement, streamed_logits
from tests.hf_folders import COMMON, FAMILIES

SEQUENCES = [[5, 9, 3, 100, 7, 8, 1], [4], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13]]
# family (tests/hf_folders.py) -> sharded or a single model.safetensors
CASES = {
    "qwen2": True,        # q/k/v biases, tied embeddings
    "llama": True,        # a separate lm_head
    "llama-tied": True,   # tie_word_embeddings=True on Llama
    "mistral": True,      # sliding window 4, shorter than the sequences
    "qwen3": False,       # q/k norms inside the layer; one unsharded file
}


def _build(family: str, folder: Path, *, sharded: bool):
    """A random 3-layer `family` decoder saved into `folder`; returns the in-memory model (eval)."""
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**{**COMMON, **extra, "num_hidden_layers": 3})
    model = getattr(transformers, model_cls)(config).eval()
    model.save_pretrained(str(folder), **({"max_shard_size": "100KB"} if sharded else {}))
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> (folder, the whole model's logits for SEQUENCES), the models themselves dropped."""
    out = {}
    for family, sharded in CASES.items():
        folder = tmp_path_factory.mktemp(family)
        model = _build(family, folder, sharded=sharded)
        with torch.no_grad():
            ref = [model(torch.tensor([s])).logits[0].float().numpy() for s in SEQUENCES]
        out[family] = (folder, ref)
        del model
    gc.collect()
    return out


@pytest.mark.parametrize("family", list(CASES))
def test_streamed_logits_equal_the_whole_model(folders, family):
    folder, ref = folders[family]
    index = folder / "model.safetensors.index.json"
    if CASES[family]:
        assert len(set(json.loads(index.read_text())["weight_map"].values())) > 1
    else:
        assert not index.exists() and (folder / "model.safetensors").is_file()
    got = streamed_logits(folder, SEQUENCES)
    assert [g.shape for g in got] == [(len(s), COMMON["vocab_size"]) for s in SEQUENCES]
    for r, g in zip(ref, got, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def _materialised_layers() -> int:
    """Decoder layers alive in this process whose parameters hold memory (not on meta)."""
    return sum(1 for o in gc.get_objects()
               if isinstance(o, torch.nn.Module) and type(o).__name__.endswith("DecoderLayer")
               and any(not p.is_meta for p in o.parameters(recurse=True)))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_streaming_reads_each_tensor_once_and_holds_one_layer(folders, family, monkeypatch):
    """A spy on safetensors.safe_open records every tensor read, and a global forward hook counts
    the decoder layers holding weights whenever one runs: loading the model whole (or keeping the
    layers after use) would show 3 there; reading a layer's weights ahead of time or twice shows
    in the read log."""
    import safetensors

    folder, ref = folders[family]
    gc.collect()
    baseline = _materialised_layers()
    reads: list[str] = []
    events: list[tuple] = []
    real_open = safetensors.safe_open

    class Spy:
        def __init__(self, *args, **kwargs):
            self._f = real_open(*args, **kwargs)

        def __enter__(self):
            self._f.__enter__()
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def keys(self):
            return self._f.keys()

        def get_tensor(self, name):
            reads.append(name)
            events.append(("read", name))
            return self._f.get_tensor(name)

    alive: list[int] = []

    def hook(module, args):
        if type(module).__name__.endswith("DecoderLayer"):
            alive.append(_materialised_layers() - baseline)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        got = streamed_logits(folder, SEQUENCES, progress=lambda i, n: events.append(("progress", i, n)))
    finally:
        handle.remove()
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-5)

    # every layer ran once per sequence, and each time it was the only decoder layer with weights
    assert alive == [1] * (3 * len(SEQUENCES))
    # every stored tensor read exactly once (a tied embedding twice: for the input and as the head)
    wmap = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    tied = family == "qwen2"
    expected = {n: 1 for n in wmap if not (tied and n == "lm_head.weight")}
    expected["model.embed_tokens.weight"] = 2 if tied else 1
    assert {n: reads.count(n) for n in set(reads)} == expected
    # layer i's tensors are read after progress(i - 1) and before progress(i), nothing after the last
    # layer but the norm and the head
    assert [e[1:] for e in events if e[0] == "progress"] == [(0, 3), (1, 3), (2, 3)]
    layer = 0
    for e in events:
        if e[0] == "progress":
            layer = e[1] + 1
        elif e[1].startswith("model.layers."):
            assert int(e[1].split(".")[2]) == layer, (e, layer)
        elif layer == 3:
            assert e[1] in ("model.norm.weight", "lm_head.weight", "model.embed_tokens.weight")


def test_bfloat16_follows_float32(folders):
    folder, ref = folders["llama"]
    got = streamed_logits(folder, SEQUENCES[:1], dtype="bfloat16")
    agree = logits_agreement(ref[0], got[0])
    assert agree["cosine_min"] > 0.999 and 0 < agree["max_abs"] < 0.05
    with pytest.raises(BadInputError, match="float16"):
        streamed_logits(folder, SEQUENCES[:1], dtype="float16")


def test_refuses_other_architectures_and_bad_tokens(folders, tmp_path):
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"]).save_pretrained(str(gpt2))
    with pytest.raises(UnsupportedError, match="GPT2LMHeadModel"):
        streamed_logits(gpt2, [[1, 2]])
    folder, _ = folders["llama"]
    with pytest.raises(BadInputError, match="token ids"):
        streamed_logits(folder, [[1, COMMON["vocab_size"]]])
    with pytest.raises(BadInputError, match="at least one token"):
        streamed_logits(folder, [[]])
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(BadInputError, match="safetensors"):
        streamed_logits(no_weights, [[1]])


def test_logits_agreement_identical_and_crafted():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 50)).astype(np.float32)
    same = logits_agreement(a, a.copy())
    assert same["cosine_min"] == pytest.approx(1.0) and same["cosine_mean"] == pytest.approx(1.0)
    assert same["top1"] == 1.0 and same["topk"] == 1.0 and same["max_abs"] == 0.0 and same["positions"] == 6

    ref = np.array([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    got = np.array([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0]])[None]  # a batch of 1 is dropped
    agree = logits_agreement(ref, got, k=2)
    # position 0 identical; position 1 reversed: cosine (0*3 + 1*2 + 2*1 + 3*0) / 14, argmax 3 vs 0,
    # top-2 {3, 2} vs {0, 1}
    assert agree["cosine_min"] == pytest.approx(4 / 14)
    assert agree["cosine_mean"] == pytest.approx((1 + 4 / 14) / 2)
    assert agree["top1"] == 0.5 and agree["topk"] == 0.5 and agree["k"] == 2 and agree["max_abs"] == 3.0
    # top-3 at position 1: {3, 2, 1} vs {0, 1, 2} share 2 of 3
    assert logits_agreement(ref, got, k=3)["topk"] == pytest.approx((1 + 2 / 3) / 2)
    with pytest.raises(BadInputError):
        logits_agreement(ref, got[0][:, :3])
