"""config.json of a Hugging Face decoder folder: which families the KV-cache export takes and the
decoder's shape (`DecoderConfig`), read without importing a framework, so a folder outside the
table is refused (exit 2) before anything is loaded (parsers/hf_decoder.py exports the model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from modelport.errors import BadInputError, UnsupportedError
from modelport.ir import IRModel

# `architectures[0]` -> the family name onnxruntime-genai knows it by
FAMILIES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Phi3ForCausalLM": "phi3",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Qwen3ForCausalLM": "qwen3",
}
# attention kinds the export reproduces exactly: a sliding window is applied by the model's own
# attention mask over the full cache, so the exported graph carries it (a window shorter than the
# sequence is honoured, as transformers' sliding-window cache does)
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class DecoderConfig:
    """What the export, the generation loop and an ort-genai folder need to know of a decoder."""

    architecture: str
    family: str
    num_layers: int
    num_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    context_length: int
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    pad_token_id: int | None
    context_capped_from: int | None = None  # max_position_embeddings when context_length is cut short (see check_rope)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @property
    def past_names(self) -> list[str]:
        return [f"past_key_values.{i}.{kv}" for i in range(self.num_layers) for kv in ("key", "value")]

    @property
    def present_names(self) -> list[str]:
        return [f"present.{i}.{kv}" for i in range(self.num_layers) for kv in ("key", "value")]

    @property
    def input_names(self) -> list[str]:
        return ["input_ids", "attention_mask", "position_ids", *self.past_names]

    @property
    def output_names(self) -> list[str]:
        return ["logits", *self.present_names]

    @property
    def safe_pad(self) -> int:
        """A token id for padded slots (masked out, so any id in range will do)."""
        pad = self.pad_token_id
        return pad if isinstance(pad, int) and 0 <= pad < self.vocab_size else 0


def _read_config(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None


def sniff(path: Path) -> bool:
    """A folder whose config.json names a `...ForCausalLM` architecture (cheap: one small JSON read)."""
    if not path.is_dir():
        return False
    cfg = _read_config(path)
    archs = (cfg or {}).get("architectures") or []
    return bool(archs) and isinstance(archs[0], str) and archs[0].endswith("ForCausalLM")


def _first(*values):
    return next((v for v in values if v is not None), None)


def read_decoder_config(folder: str | Path) -> DecoderConfig:
    """The decoder's shape from config.json; an unsupported family or a folder without
    safetensors weights is a BadInputError (exit 2) naming the reason."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BadInputError("not a folder (a Hugging Face text-generation source is a save_pretrained folder)", path=folder)
    cfg = _read_config(folder)
    if cfg is None:
        raise BadInputError("no readable config.json in the folder", path=folder)
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else None
    if arch not in FAMILIES:
        raise UnsupportedError(f"architecture {arch or cfg.get('model_type')!r} is not a supported text-generation family; "
                               f"supported: {', '.join(FAMILIES)}", path=folder)
    if not any(folder.glob("*.safetensors")):
        raise BadInputError("no .safetensors weights in the folder (pickled .bin weights are not loaded)", path=folder)
    text = cfg.get("text_config") or cfg
    heads = int(text["num_attention_heads"])
    hidden = int(text["hidden_size"])
    layer_types = text.get("layer_types") or []
    other = sorted({str(t) for t in layer_types} - set(LAYER_TYPES))
    if other:
        raise UnsupportedError(f"{arch} with layer types {other} is not supported; only {' and '.join(LAYER_TYPES)}",
                               path=folder)
    capped = check_rope(text, arch, folder)
    longest = int(_first(text.get("max_position_embeddings"), 2048))
    tied = text.get("tie_word_embeddings")
    if tied is None:
        tied = arch.startswith("Gemma")  # the Gemma configs tie them by default, the others do not
    return DecoderConfig(
        architecture=arch, family=FAMILIES[arch], num_layers=int(text["num_hidden_layers"]), num_heads=heads,
        kv_heads=int(_first(text.get("num_key_value_heads"), heads)),
        head_dim=int(_first(text.get("head_dim"), hidden // heads)), hidden_size=hidden,
        vocab_size=int(text["vocab_size"]), tied_embeddings=bool(tied),
        context_length=capped or longest, context_capped_from=longest if capped else None,
        bos_token_id=text.get("bos_token_id"), eos_token_id=text.get("eos_token_id"), pad_token_id=text.get("pad_token_id"),
    )


def check_rope(text: dict, arch: str, folder: Path) -> int | None:
    """Refuse rotary scalings one KV-cache graph cannot reproduce exactly (exit 2, before loading);
    returns the context length a scaling limits the model to, or None.

    `dynamic` (NTK) recomputes the frequencies from the longest position seen so far, a state kept
    across calls. `longrope` switches from the short to the long factors once a position passes
    original_max_position_embeddings (the exported graph follows that switch step by step), but
    Phi-3's generate then recomputes the whole cache with the long factors
    (`Phi3ForCausalLM.prepare_inputs_for_generation`); a graph fed its own cache keeps the keys it
    rotated with the short ones, so it generates differently past that point. Up to that point it
    is exact, so such a model (Phi-3.5-mini, Phi-4-mini: 4096 of 131072) is converted with its
    context limited to original_max_position_embeddings (the ort-genai folder stops there; the
    caller warns). Without the switch (original at least max_position_embeddings) nothing is cut."""
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in ("default", "linear", "llama3", "longrope"):
        why = " (its frequencies follow the longest sequence seen so far, a state one graph cannot keep)" if kind == "dynamic" else ""
        raise UnsupportedError(f"{arch} with rope type {kind!r} is not supported{why}; supported: default, linear, llama3, "
                               "longrope", path=folder)
    if kind == "longrope" and arch == "Phi3ForCausalLM":
        original = _first(rope.get("original_max_position_embeddings"), text.get("original_max_position_embeddings"))
        longest = text.get("max_position_embeddings")
        if original is not None and longest is not None and int(original) < int(longest):
            return int(original)
    return None


def decoder_config_of(ir: IRModel) -> DecoderConfig | None:
    d = ir.provenance.get("decoder")
    return DecoderConfig(**d) if isinstance(d, dict) else None


def text_config(folder: Path) -> dict:
    """config.json's text model (a multimodal config nests it under `text_config`)."""
    cfg = json.loads((folder / "config.json").read_text())
    return cfg.get("text_config") or cfg
