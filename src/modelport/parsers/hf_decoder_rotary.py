"""The rotary tables of a written decoder (parsers/hf_decoder_graph.py), computed as transformers
computes them, in float32, for rope types default, linear and llama3.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.parsers.hf_decoder_config import DecoderConfig, text_config


def inverse_frequencies(text: dict, head_dim: int) -> np.ndarray:
    """The rotary inverse frequencies [head_dim/2] float32, as transformers computes them (in float32)
    for rope types default, linear and llama3 (`transformers.modeling_rope_utils`)."""
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    base = float(rope.get("rope_theta", text.get("rope_theta", 10000.0)))
    inv = np.float32(1.0) / (np.float32(base) ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    if kind == "linear":
        inv = inv / np.float32(rope["factor"])
    elif kind == "llama3":
        factor, low, high = (np.float32(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
        old = np.float32(rope["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = np.float32(2 * np.pi) / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    elif kind != "default":
        raise ValueError(f"rope type {kind}")
    return inv.astype(np.float32)


def rotary_tables(folder: Path, cfg: DecoderConfig) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) [context_length, head_dim/2] float32 at positions 0..context_length-1: the angles
    position · inverse frequency in float32, as the families' rotary modules compute them."""
    inv = inverse_frequencies(text_config(folder), cfg.head_dim)
    angles = np.arange(cfg.context_length, dtype=np.int64).astype(np.float32)[:, None] * inv[None, :]
    return np.cos(angles), np.sin(angles)
