"""The sample inputs of a Hugging Face model, built from its config: their specs, named dynamic dims
and sample sizes, for each kind of main input (text, vision, audio, audio features)."""

from __future__ import annotations

import contextlib
import inspect as pyinspect
import json
from pathlib import Path

from modelport.errors import BadInputError
from modelport.ir import TensorSpec
from modelport.parsers.contract import merge_specs

SAMPLE_SEQUENCE = 8  # tokens per sample (within max_position_embeddings)
SAMPLE_AUDIO = 16000  # raw audio samples per sample (one second at 16 kHz)


def _forward_params(module) -> set[str]:
    try:
        return set(pyinspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _image_size(config, folder: Path) -> tuple[int, int]:
    size = getattr(config, "image_size", None)
    if isinstance(size, int):
        return size, size
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    with contextlib.suppress(OSError, ValueError, AttributeError):
        pre = json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8"))
        for key in ("crop_size", "size"):
            value = pre.get(key)
            if isinstance(value, int):
                return value, value
            if isinstance(value, dict) and "height" in value and "width" in value:
                return int(value["height"]), int(value["width"])
    return 224, 224


def input_specs(modality: str, config, module, folder: Path) -> tuple[list[TensorSpec], dict[str, int]]:
    """(input specs, sample dims) for the inputs of `modality` that `module` takes.

    text: input_ids (ids within vocab_size), attention_mask (ones), token_type_ids where the model
    takes them, all [batch, sequence]; vision: pixel_values [batch, num_channels, H, W] at the
    configured image size; audio: raw input_values [batch, samples]; audio-features: Whisper-style
    input_features [batch, num_mel_bins, 2 * max_source_positions].
    """
    params = _forward_params(module)
    if modality == "text":
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        if vocab < 1:
            raise BadInputError("config.json has no vocab_size to draw sample token ids from", path=folder)
        specs = [TensorSpec("input_ids", "int64", ["batch", "sequence"], "NT", value_range=[0, vocab])]
        if "attention_mask" in params:
            specs.append(TensorSpec("attention_mask", "int64", ["batch", "sequence"], "NT", value_range=[1, 2]))
        types = int(getattr(config, "type_vocab_size", 0) or 0)
        if "token_type_ids" in params and types > 0:
            specs.append(TensorSpec("token_type_ids", "int64", ["batch", "sequence"], "NT", value_range=[0, types]))
        limit = int(getattr(config, "max_position_embeddings", 0) or 0)
        return specs, {"sequence": min(SAMPLE_SEQUENCE, limit) if limit > 0 else SAMPLE_SEQUENCE}
    if modality == "vision":
        h, w = _image_size(config, folder)
        channels = int(getattr(config, "num_channels", 3) or 3)
        return [TensorSpec("pixel_values", "float32", ["batch", channels, h, w], "NCHW")], {}
    if modality == "audio":
        return [TensorSpec("input_values", "float32", ["batch", "samples"], "NT")], {"samples": SAMPLE_AUDIO}
    if modality == "audio-features":
        mels, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
        if not (isinstance(mels, int) and isinstance(positions, int)):
            raise BadInputError(f"cannot size input_features from the {config.model_type} config (no num_mel_bins/max_source_positions)",
                                path=folder, hint="pass --input input_features:SHAPE")
        return [TensorSpec("input_features", "float32", ["batch", mels, 2 * positions], "NCW")], {}
    raise BadInputError(f"no inputs known for a model whose main input is '{modality}'", path=folder)


def apply_user_specs(specs: list[TensorSpec], user: list[TensorSpec]) -> list[TensorSpec]:
    """`--input` overrides by name (shape, dtype, range), as for other sources."""
    if not user:
        return specs

    return merge_specs(specs, user)
