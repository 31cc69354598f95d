"""Tiny random-init Hugging Face decoder folders (`save_pretrained` output) for text-generation tests.

Each family keeps its own layout (Qwen2's q/k/v biases, Phi-3's fused qkv and gate_up
projections, Qwen3's q/k norms, Gemma's head_dim apart from hidden/heads, sqrt(hidden)-scaled
embeddings, GELU-tanh MLP and tied embeddings, Gemma2's logit soft-capping) at a size that exports
in seconds: 2 layers, hidden 64, 4 attention heads over 2 key/value heads, a vocabulary of 128.
Mistral and Gemma2 get a sliding window of 4, shorter than the sequences the tests run (Gemma2
alternates sliding and full layers), so a window that is not honoured shows. A small byte-level BPE
`tokenizer.json` (trained with `tokenizers`) lets onnxruntime-genai load a tokenizer too.
"""

from __future__ import annotations

from pathlib import Path

VOCAB = 128
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 24}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 24, "sliding_window": 4}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "llama3-rope": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}),
}


CORPUS = ["the cat sat on the mat", "a dog ran in the park", "hello world this is a test"]


def write_tokenizer(folder: Path) -> None:
    """A byte-level BPE (GPT-2 style) trained on a few sentences: under 128 ids, the model's
    vocabulary covers them all. onnxruntime-genai's tokenizer reads this kind (not WordLevel)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 10, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"]))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "add_bos_token": False, "model_max_length": 256}))


def build(family: str, folder: Path, *, seed: int = 0, **overrides) -> Path:
    """Write a random-init `family` model (a key of FAMILIES) into `folder`; returns it."""
    import torch
    import transformers

    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**{**COMMON, **extra, **overrides})
    model = getattr(transformers, model_cls)(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    write_tokenizer(folder)
    return folder
