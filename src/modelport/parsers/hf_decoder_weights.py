"""The safetensors checkpoint the decoder writer (parsers/hf_decoder_graph.py) reads: every tensor
its graph reads, with the shape config.json gives it (`expected_shapes`), and `Weights`, which
checks the folder's tensors against those before anything is written and reads each one, when
asked, as float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.errors import BadInputError
from modelport.parsers.hf_decoder_config import DecoderConfig, text_config
from modelport.parsers.hf_folder import weight_files
from modelport.parsers.hf_loading import weights_problem
from modelport.parsers.pytorch_files import check_safetensors_header


def expected_shapes(folder: Path, cfg: DecoderConfig) -> dict[str, list[int]]:
    """Every tensor the written graph reads, by name, with the shape config.json gives it."""
    text = text_config(folder)
    h, q, kv, inter = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, int(text["intermediate_size"])
    attn_bias = cfg.family == "qwen2" or bool(text.get("attention_bias"))
    shapes = {"model.embed_tokens.weight": [cfg.vocab_size, h], "model.norm.weight": [h]}
    if not cfg.tied_embeddings:
        shapes["lm_head.weight"] = [cfg.vocab_size, h]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        shapes.update({f"{p}.input_layernorm.weight": [h], f"{p}.post_attention_layernorm.weight": [h],
                       f"{p}.self_attn.q_proj.weight": [q, h], f"{p}.self_attn.k_proj.weight": [kv, h],
                       f"{p}.self_attn.v_proj.weight": [kv, h], f"{p}.self_attn.o_proj.weight": [h, q],
                       f"{p}.mlp.gate_proj.weight": [inter, h], f"{p}.mlp.up_proj.weight": [inter, h],
                       f"{p}.mlp.down_proj.weight": [h, inter]})
        if attn_bias:
            shapes.update({f"{p}.self_attn.q_proj.bias": [q], f"{p}.self_attn.k_proj.bias": [kv],
                           f"{p}.self_attn.v_proj.bias": [kv]})
            if cfg.family != "qwen2":
                shapes[f"{p}.self_attn.o_proj.bias"] = [h]
        if text.get("mlp_bias"):
            shapes.update({f"{p}.mlp.gate_proj.bias": [inter], f"{p}.mlp.up_proj.bias": [inter], f"{p}.mlp.down_proj.bias": [h]})
        if cfg.family == "qwen3":
            shapes.update({f"{p}.self_attn.q_norm.weight": [cfg.head_dim], f"{p}.self_attn.k_norm.weight": [cfg.head_dim]})
    return shapes


DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # bf16: the top half of a float32


class Weights:
    """The folder's safetensors tensors by name, each read from its file when asked for (plain reads,
    no memory map: a mapped checkpoint stays resident while it is open) and given as float32.
    A tensor missing, of another shape than config.json gives it, of another dtype, or not placed by
    the graph is a BadInputError naming it before anything is written."""

    def __init__(self, folder: Path, expected: dict[str, list[int]]):
        import struct


        self._where: dict[str, tuple[Path, str, list[int], int, int]] = {}
        for f in weight_files(folder)[0]:
            header = check_safetensors_header(f)
            with open(f, "rb") as fh:
                base = 8 + struct.unpack("<Q", fh.read(8))[0]
            for key, info in header.items():
                if key != "__metadata__":
                    start, end = info["data_offsets"]
                    self._where[key] = (f, info["dtype"], list(info["shape"]), base + start, end - start)
        mismatched = [(n, self._where[n][2], shape) for n, shape in expected.items()
                      if n in self._where and self._where[n][2] != shape]
        missing = [n for n in expected if n not in self._where]
        lm_head = [] if "lm_head.weight" in expected else ["lm_head.weight"]  # a tied checkpoint may keep its copy
        extra = sorted(k for k in self._where if k not in expected and k not in lm_head and not k.endswith("inv_freq"))
        problem = weights_problem({"mismatched_keys": mismatched, "missing_keys": missing})
        if problem:
            raise BadInputError(f"the weights do not fit config.json: {problem}", path=folder)
        if extra:
            raise BadInputError(f"the weights hold tensors config.json does not describe: {', '.join(extra[:4])}"
                                f"{' …' if len(extra) > 4 else ''}", path=folder)
        odd = sorted({self._where[n][1] for n in expected} - set(DTYPES))
        if odd:
            raise BadInputError(f"weights of dtype {', '.join(odd)} (the writer reads {', '.join(DTYPES)})", path=folder)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> list[int]:
        return self._where[name][2]

    def get(self, name: str, *, transpose: bool = False) -> np.ndarray:
        """The tensor in float32 (a 2-D one transposed, when asked: widened and transposed in one pass)."""
        path, dtype, shape, offset, length = self._where[name]
        raw = np.empty(length // np.dtype(DTYPES[dtype]).itemsize, dtype=DTYPES[dtype])
        with open(path, "rb") as f:
            f.seek(offset)
            if f.readinto(memoryview(raw).cast("B")) != length:
                raise BadInputError(f"the safetensors file ends inside tensor {name!r}", path=path)
        raw = raw.reshape(shape)
        if not transpose:
            return _widen(raw, raw, dtype)
        out = np.empty(raw.shape[::-1], dtype=np.uint32 if dtype == "BF16" else np.float32)
        for i in range(0, raw.shape[1], 64):  # a band of columns at a time: 2x faster than one strided pass
            _widen(raw[:, i:i + 64].T, out[i:i + 64], dtype)
        return out.view(np.float32)


def _widen(part: np.ndarray, out: np.ndarray, dtype: str) -> np.ndarray:
    """`part` (raw safetensors values of `dtype`) as float32 into `out` (or a new array when `out` is `part`)."""
    if dtype == "BF16":  # bf16 is the top half of a float32
        if out is part:
            out = np.empty(part.shape, dtype=np.uint32)
        np.left_shift(part, 16, out=out, dtype=np.uint32)
        return out.view(np.float32)
    if out is part:
        return np.ascontiguousarray(part, dtype=np.float32)
    out[...] = part
    return out
