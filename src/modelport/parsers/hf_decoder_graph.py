"""Decoder LMs written as ONNX straight from the folder's config and safetensors, without tracing.

For the families whose layer is the plain Llama block (Llama, Mistral, Qwen2, Qwen3: RMSNorm,
rotary attention with grouped key/value heads, a SiLU-gated MLP), the graph follows from
config.json alone, so it is written node by node here and each weight is read from the safetensors,
converted to fp32 and appended to the data file one tensor at a time. Nothing is traced, and neither the
transformers model nor the graph's weights are ever held whole: peak memory is one tensor (the
largest, the embedding, and its transpose for the output projection), and a 0.5 B-parameter folder
is written in seconds where the dynamo export takes minutes (bench/llm_scale.py). The inputs, outputs
and dims are those of the export (parsers/hf_decoder.py), so everything after it is unchanged, and
the result is checked against transformers like the export is (the IR's decode step, then generation).

Two forms, from one description of the layer:

    plain  standard ONNX ops only (opset 18): the IR of `convert --task text-generation`
           RMSNorm          x · 1/sqrt(mean(x²) + eps) · w
           rotary           x·cos + rotate_half(x)·sin, cos/sin gathered at position_ids from a table
           attention        softmax(q·kᵀ·scale + bias)·v over the grown cache, the query heads of one
                            key/value head stacked (no copy of the cache per query head), bias = 0
                            where the key is real and not in the future, else float32's minimum
    fused  onnxruntime's ops, what `--optimize all` asks for: SimplifiedLayerNormalization and
           SkipSimplifiedLayerNormalization, q/k/v in one MatMul, com.microsoft.GroupQueryAttention with
           the rotary inside (cos/sin caches, the model's position_ids, a padding bias, every query row
           valid: optimize/gqa_fusion.py says why each input is needed for left-padded batches), gate and
           up in one MatMul

The rotary tables are computed as transformers computes them, in float32 (rope types default,
linear and llama3).

`dtype="float16"` writes either form in half precision, as a float16 transformers model computes:
weights, activations, the key/value cache and the logits in float16; the RMSNorm statistics and the
attention softmax in float32 (cast there and back, as transformers upcasts them), the rotary tables
computed in float32 and stored in float16. A weight beyond float16's range is clamped to ±65504 and
counted in the details (`clamped`).

A folder outside this description
(another family, a sliding window shorter than the context, an activation other than SiLU, an
unexpected tensor) is named by `unsupported` and goes to the dynamo export instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError
from modelport.parsers.hf_decoder import DecoderConfig

EXPORTER = "modelport decoder writer (config + safetensors)"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
OPSET = 18
MS = "com.microsoft"
BIAS_MIN = float(np.finfo(np.float32).min)  # transformers' own masked-out value: finite, so padded rows stay NaN-free
DTYPES_WRITTEN = {"float32": np.float32, "float16": np.float16}
ROPE_TYPES = ("default", "linear", "llama3")


def _text_config(folder: Path) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    return cfg.get("text_config") or cfg


def unsupported(folder: Path, cfg: DecoderConfig, opset: int | None = None) -> str | None:
    """Why this folder cannot be written directly (it is then exported with dynamo), or None."""
    if cfg.family not in FAMILIES:
        return f"family {cfg.family} (the writer covers {', '.join(FAMILIES)})"
    if opset is not None and opset < OPSET:
        return f"opset {opset} (the writer writes opset {OPSET})"
    text = _text_config(folder)
    act = text.get("hidden_act") or text.get("hidden_activation") or "silu"
    if act != "silu":
        return f"activation {act}"
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in ROPE_TYPES:
        return f"rope type {kind}"
    if text.get("partial_rotary_factor") not in (None, 1, 1.0):
        return "partial rotary"
    if any(t != "full_attention" for t in text.get("layer_types") or []):
        return "sliding-window layers"
    window = text.get("sliding_window")
    uses_window = text.get("use_sliding_window", cfg.family == "mistral")
    if uses_window and window is not None and int(window) < cfg.context_length:
        return f"a sliding window of {window}"
    if cfg.head_dim % 2:
        return "an odd head_dim"
    return None


def expected_shapes(folder: Path, cfg: DecoderConfig) -> dict[str, list[int]]:
    """Every tensor the written graph reads, by name, with the shape config.json gives it."""
    text = _text_config(folder)
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

        from modelport.parsers.huggingface import weight_files, weights_problem
        from modelport.parsers.pytorch import check_safetensors_header

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


@dataclass
class GraphWriter:
    """Nodes, initializers and a data file written as the graph is built (weights never kept)."""

    data: Path
    reuse: dict = field(default_factory=dict)  # name -> TensorProto already in a data file of this folder
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    _file: object = None

    def close(self):
        if self._file is not None:
            self._file.close()
            if self._file.offset == 0:  # every tensor was small or shared: no data file
                self.data.unlink()

    def tensor(self, name: str, value) -> str:
        """An initializer: small ones inline, the rest appended to the data file (created when first
        needed). `value` is an array or a function giving it, called only when the tensor is not
        one of `reuse` (a tensor another form of the graph already wrote)."""
        if name in self.reuse:
            self.initializers.append(self.reuse[name])
            return name
        if self._file is None:
            from modelport.onnx_io import DataFile

            self._file = DataFile(self.data)
        self.initializers.append(self._file.add(name, np.asarray(value() if callable(value) else value)))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str] | int = 1, *, name: str, domain: str = "", **attrs):
        """Add a node; returns its output name (or names when `outputs` is a list or a count > 1)."""
        import onnx

        if isinstance(outputs, int):
            outs = [f"{name}/out{i}" if outputs > 1 else f"{name}/out" for i in range(outputs)]
        else:
            outs = list(outputs)
        self.nodes.append(onnx.helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        return outs[0] if len(outs) == 1 else outs


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
    inv = inverse_frequencies(_text_config(folder), cfg.head_dim)
    angles = np.arange(cfg.context_length, dtype=np.int64).astype(np.float32)[:, None] * inv[None, :]
    return np.cos(angles), np.sin(angles)


def write_decoder(folder: str | Path, cfg: DecoderConfig, path: Path, *, fused: bool = False, reuse=None,
                  opset: int | None = None, dtype: str = "float32"):
    """Write the folder's decoder to `path` (model.onnx, its weights in model.onnx.data beside it);
    returns (the ModelProto, graph only: its initializers refer to the data file, details).
    `reuse`: a model written here before into the same folder as `path` (the other form): the
    tensors it holds in its data file are referred to there, not read or written again (the two
    forms share every weight, so the second form is a graph alone). `opset`: the default opset's
    version (OPSET when None; the ops written are the same from OPSET on). `dtype`: float32 or float16
    (see the module docstring)."""
    import functools

    import onnx

    from modelport.progress import doing

    folder = Path(folder)
    text = _text_config(folder)
    eps = float(text.get("rms_norm_eps", 1e-6))
    weights = Weights(folder, expected_shapes(folder, cfg))
    shared = {t.name: t for t in reuse.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL} if reuse else {}
    w = GraphWriter(path.parent / (path.name + ".data"), shared)
    try:
        b = _Builder(w, weights, cfg, eps, fused, DTYPES_WRITTEN[dtype])
        b.inputs_and_masks(functools.cache(lambda: rotary_tables(folder, cfg)))
        hidden = w.node("Gather", [b.weight("model.embed_tokens.weight", lambda: weights.get("model.embed_tokens.weight")),
                                   "input_ids"], name="embed_tokens")
        residual, normed = hidden, None
        for i in range(cfg.num_layers):
            with doing(f"writing layer {i + 1} of {cfg.num_layers}"):
                residual, normed = b.layer(i, residual, normed)
        with doing("writing the output projection"):
            b.head(residual, normed)
    finally:
        w.close()
    graph = onnx.helper.make_graph(w.nodes, "decoder", b.graph_inputs(), b.graph_outputs(), initializer=w.initializers)
    opsets = [onnx.helper.make_opsetid("", opset or OPSET)] + ([onnx.helper.make_opsetid(MS, 1)] if fused else [])
    model = onnx.helper.make_model(graph, opset_imports=opsets, producer_name="modelport")
    model.ir_version = min(model.ir_version, 10)
    onnx.save_model(model, str(path))
    from collections import Counter

    from modelport.optimize.decoder_fusion import FUSED_OPS

    ops = Counter(n.op_type for n in model.graph.node)
    details = {"writer": EXPORTER, "nodes": len(model.graph.node), "fused": {op: ops[op] for op in FUSED_OPS if ops[op]},
               "dtype": dtype, **({"clamped": b.clamped} if b.clamped else {})}
    if fused:
        details["group_query_attention"] = {"fused": list(range(cfg.num_layers)), "unfused": {},
                                            "packed_qkv": b.packed_qkv}
    return model, details


class _Builder:
    """One decoder's nodes, layer by layer (see the module docstring for the two forms)."""

    def __init__(self, w: GraphWriter, weights: Weights, cfg: DecoderConfig, eps: float, fused: bool, dtype=np.float32):
        import onnx

        self.w, self.weights, self.cfg, self.eps, self.fused = w, weights, cfg, eps, fused
        self.dtype = np.dtype(dtype)  # of the weights, activations, cache and logits
        self.half = self.dtype == np.float16
        self.elem = onnx.helper.np_dtype_to_tensor_dtype(self.dtype)
        self.packed_qkv = 0
        self.clamped: dict[str, int] = {}  # tensor -> values clamped to float16's range
        self._consts: dict = {}

    # -- small helpers -------------------------------------------------------------------------
    def stored(self, name: str, value: np.ndarray) -> np.ndarray:
        """A float32 value at the graph's dtype (float16: rounded, beyond its range clamped and counted)."""
        if not self.half:
            return value
        big = float(np.finfo(np.float16).max)
        over = int(np.count_nonzero(np.abs(value) > big))
        if over:
            self.clamped[name] = over
            np.clip(value, -big, big, out=value)
        return value.astype(np.float16)

    def weight(self, name: str, get) -> str:
        """The initializer `name` at the graph's dtype; `get()` gives it in float32 when it is written."""
        return self.w.tensor(name, lambda: self.stored(name, get()))

    def float_const(self, value) -> str:
        """A scalar or array constant at the graph's dtype."""
        return self.const(value, self.dtype)

    def to(self, x: str, dtype, name: str) -> str:
        """`x` cast to `dtype` in a float16 graph, between its float32 islands and the rest (a float32
        graph has none: `x` as it is)."""
        import onnx

        if not self.half:
            return x
        return self.w.node("Cast", [x], name=name, to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))

    def const(self, value, dtype=np.int64) -> str:
        value = np.asarray(value, dtype=dtype)
        key = (value.dtype.str, value.shape, value.tobytes())
        if key not in self._consts:
            self._consts[key] = self.w.tensor(f"const/{len(self._consts)}", value)
        return self._consts[key]

    def linear(self, x: str, names: list[str], out: str) -> str:
        """x · [W_a | W_b | …]ᵀ (+ their biases): one MatMul over the named projections' weights,
        packed side by side (the HF weights are [out, in]: transposed as they are read)."""
        def weight():
            mats = [self.weights.get(f"{n}.weight", transpose=True) for n in names]
            return mats[0] if len(mats) == 1 else np.concatenate(mats, axis=1)

        y = self.w.node("MatMul", [x, self.weight(f"{out}.weight", weight)], name=out)
        biases = [f"{n}.bias" for n in names]
        if any(bn in self.weights for bn in biases):
            def bias():
                return np.concatenate([self.weights.get(bn) if bn in self.weights else
                                       np.zeros(self.weights.shape(f"{n}.weight")[0], np.float32)
                                       for n, bn in zip(names, biases, strict=True)])

            y = self.w.node("Add", [y, self.weight(f"{out}.bias", bias)], name=f"{out}/bias")
        return y

    def split(self, x: str, sizes: list[int], name: str) -> list[str]:
        return self.w.node("Split", [x, self.const(sizes)], len(sizes), name=name, axis=-1)

    def rms_norm(self, x: str, weight: str, name: str) -> str:
        """The statistics in float32 (float16 input: cast there and back, as transformers does)."""
        w = self.weight(weight, lambda: self.weights.get(weight))
        if self.fused:
            return self.w.node("SimplifiedLayerNormalization", [x, w], name=name, axis=-1, epsilon=self.eps)
        x = self.to(x, np.float32, f"{name}/float32")
        sq = self.w.node("Mul", [x, x], name=f"{name}/square")
        mean = self.w.node("ReduceMean", [sq, self.const([-1])], name=f"{name}/mean", keepdims=1)
        std = self.w.node("Sqrt", [self.w.node("Add", [mean, self.const(self.eps, np.float32)], name=f"{name}/eps")],
                          name=f"{name}/sqrt")
        scaled = self.w.node("Mul", [x, self.w.node("Reciprocal", [std], name=f"{name}/inv")], name=f"{name}/scale")
        return self.w.node("Mul", [self.to(scaled, self.dtype, f"{name}/back"), w], name=f"{name}/weight")

    def add_norm(self, x: str, residual: str, weight: str, name: str) -> tuple[str, str]:
        """(residual + x, RMSNorm of it)."""
        if self.fused:
            w = self.weight(weight, lambda: self.weights.get(weight))
            out = self.w.node("SkipSimplifiedLayerNormalization", [x, residual, w],
                              [f"{name}/out", "", "", f"{name}/sum"], name=name, domain=MS, epsilon=self.eps)
            return f"{name}/sum", out[0]
        total = self.w.node("Add", [residual, x], name=f"{name}/residual")
        return total, self.rms_norm(total, weight, name)

    # -- graph parts -----------------------------------------------------------------------------
    def graph_inputs(self):
        import onnx

        cfg, T = self.cfg, onnx.TensorProto
        vi = onnx.helper.make_tensor_value_info
        kv = ["batch", cfg.kv_heads, "past_sequence", cfg.head_dim]
        return [vi("input_ids", T.INT64, ["batch", "sequence"]), vi("attention_mask", T.INT64, ["batch", "total_sequence"]),
                vi("position_ids", T.INT64, ["batch", "sequence"]), *[vi(n, self.elem, kv) for n in cfg.past_names]]

    def graph_outputs(self):
        import onnx

        cfg = self.cfg
        vi = onnx.helper.make_tensor_value_info
        kv = ["batch", cfg.kv_heads, "total_sequence", cfg.head_dim]
        return [vi("logits", self.elem, ["batch", "sequence", cfg.vocab_size]),
                *[vi(n, self.elem, kv) for n in cfg.present_names]]

    def inputs_and_masks(self, tables) -> None:
        """What every layer shares: the rotary tables (`tables()` gives them) and the attention bias
        (plain form: causal and padding; fused: padding only, with GroupQueryAttention's sequence lengths)."""
        w, c = self.w, self.const
        self.cos = self.weight("rotary/cos_cache", lambda: tables()[0])
        self.sin = self.weight("rotary/sin_cache", lambda: tables()[1])
        total = w.node("Gather", [w.node("Shape", ["attention_mask"], name="mask/shape"), c(1)], name="mask/total", axis=0)
        sequence = w.node("Shape", ["input_ids"], name="ids/sequence", start=1, end=2)
        batch = w.node("Shape", ["input_ids"], name="ids/batch", start=0, end=1)
        real = w.node("Cast", ["attention_mask"], name="mask/real", to=9)  # BOOL
        if self.fused:
            total32 = w.node("Cast", [total], ["gqa/total_sequence_length"], name="gqa/total32", to=6)  # INT32
            w.node("Expand", [w.node("Sub", [total32, c(1, np.int32)], name="gqa/total_minus_1"), batch], ["gqa/seqlens_k"],
                   name="gqa/seqlens_k")
            low = BIAS_MIN if not self.half else float(np.finfo(np.float16).min)
            pad = w.node("Where", [real, self.float_const(0.0), self.float_const(low)], name="gqa/pad_bias")
            pad4 = w.node("Unsqueeze", [pad, c([1, 2])], name="gqa/pad_bias4")
            shape = w.node("Concat", [c([1, 1]), sequence, c([1])], name="gqa/bias_shape", axis=0)
            w.node("Expand", [pad4, shape], ["gqa/attention_bias"], name="gqa/attention_bias")
            seq32 = w.node("Cast", [sequence], name="gqa/sequence32", to=6)
            w.node("Expand", [seq32, batch], ["gqa/query_seqlens"], name="gqa/query_seqlens")
            return
        # plain: queries sit at positions past..total-1 of the grown cache
        total1 = w.node("Reshape", [total, c([1])], name="mask/total1")
        past = w.node("Sub", [total1, sequence], name="mask/past")
        keys = w.node("Range", [c(0), total, c(1)], name="mask/keys")
        queries = w.node("Range", [w.node("Squeeze", [past, c([0])], name="mask/past0"), total, c(1)], name="mask/queries")
        causal = w.node("LessOrEqual", [w.node("Unsqueeze", [keys, c([0])], name="mask/keys_row"),
                                         w.node("Unsqueeze", [queries, c([1])], name="mask/queries_col")], name="mask/causal")
        allowed = w.node("And", [w.node("Unsqueeze", [causal, c([0, 1])], name="mask/causal4"),
                                 w.node("Unsqueeze", [real, c([1, 2])], name="mask/real4")], name="mask/allowed")
        self.bias = w.node("Where", [allowed, c(0.0, np.float32), c(BIAS_MIN, np.float32)], name="mask/bias")
        gather = [w.node("Gather", [t, "position_ids"], name=f"rotary/{n}_half") for t, n in ((self.cos, "cos"), (self.sin, "sin"))]
        self.rot = [w.node("Unsqueeze", [w.node("Concat", [g, g], name=f"rotary/{n}", axis=-1), c([1])], name=f"rotary/{n}4")
                    for g, n in zip(gather, ("cos", "sin"), strict=True)]

    def rotate(self, x: str, name: str) -> str:
        """x·cos + rotate_half(x)·sin for x [batch, heads, sequence, head_dim]."""
        w = self.w
        lo, hi = w.node("Split", [x], 2, name=f"{name}/halves", axis=-1, num_outputs=2)
        turned = w.node("Concat", [w.node("Neg", [hi], name=f"{name}/neg"), lo], name=f"{name}/rotate_half", axis=-1)
        return w.node("Add", [w.node("Mul", [x, self.rot[0]], name=f"{name}/cos"),
                              w.node("Mul", [turned, self.rot[1]], name=f"{name}/sin")], name=name)

    def heads(self, x: str, n: int, name: str, norm: str | None = None) -> str:
        """[batch, sequence, n·head_dim] → [batch, n, sequence, head_dim] (RMSNorm over head_dim first, Qwen3)."""
        y = self.w.node("Reshape", [x, self.const([0, 0, n, self.cfg.head_dim])], name=f"{name}/heads")
        if norm:
            y = self.rms_norm(y, norm, f"{name}/norm")
        return self.w.node("Transpose", [y], name=f"{name}/bhsd", perm=[0, 2, 1, 3])

    def attention(self, i: int, x: str) -> str:
        cfg, w, c = self.cfg, self.w, self.const
        p = f"model.layers.{i}.self_attn"
        qk_norm = f"{p}.q_norm.weight" in self.weights
        if self.fused:
            if qk_norm:  # the per-head norms sit between the projections and the rotary: three inputs
                qkv = []
                for proj, heads in (("q", cfg.num_heads), ("k", cfg.kv_heads), ("v", cfg.kv_heads)):
                    y = self.linear(x, [f"{p}.{proj}_proj"], f"{p}.{proj}_proj")
                    if proj != "v":
                        y = w.node("Reshape", [y, c([0, 0, heads, cfg.head_dim])], name=f"{p}.{proj}/heads")
                        y = self.rms_norm(y, f"{p}.{proj}_norm.weight", f"{p}.{proj}_norm")
                        y = w.node("Reshape", [y, c([0, 0, heads * cfg.head_dim])], name=f"{p}.{proj}/merge")
                    qkv.append(y)
            else:
                qkv = [self.linear(x, [f"{p}.q_proj", f"{p}.k_proj", f"{p}.v_proj"], f"{p}.qkv_proj"), "", ""]
                self.packed_qkv += 1
            out = w.node("GroupQueryAttention",
                         [*qkv, f"past_key_values.{i}.key", f"past_key_values.{i}.value", "gqa/seqlens_k",
                          "gqa/total_sequence_length", self.cos, self.sin, "position_ids", "gqa/attention_bias", "", "", "", "",
                          "", "gqa/query_seqlens"],
                         [f"{p}/attention", f"present.{i}.key", f"present.{i}.value"], name=f"{p}/GroupQueryAttention",
                         domain=MS, num_heads=cfg.num_heads, kv_num_heads=cfg.kv_heads, scale=float(cfg.head_dim ** -0.5),
                         do_rotary=1, rotary_interleaved=0)
            return self.linear(out[0], [f"{p}.o_proj"], f"{p}.o_proj")
        rep = cfg.num_heads // cfg.kv_heads
        if qk_norm:
            q, k, v = (self.linear(x, [f"{p}.{proj}_proj"], f"{p}.{proj}_proj") for proj in "qkv")
        else:  # packed as in the fused form, so both forms share their weights
            q, k, v = self.split(self.linear(x, [f"{p}.q_proj", f"{p}.k_proj", f"{p}.v_proj"], f"{p}.qkv_proj"),
                                 [cfg.num_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim],
                                 f"{p}/qkv")
        q = self.heads(q, cfg.num_heads, f"{p}.q", f"{p}.q_norm.weight" if qk_norm else None)
        k = self.heads(k, cfg.kv_heads, f"{p}.k", f"{p}.k_norm.weight" if qk_norm else None)
        v = self.heads(v, cfg.kv_heads, f"{p}.v")
        q = self.rotate(q, f"{p}.q/rotary")
        k = self.rotate(k, f"{p}.k/rotary")
        key = w.node("Concat", [f"past_key_values.{i}.key", k], [f"present.{i}.key"], name=f"{p}/present_key", axis=2)
        value = w.node("Concat", [f"past_key_values.{i}.value", v], [f"present.{i}.value"], name=f"{p}/present_value", axis=2)
        # the `rep` query heads of each key/value head, stacked along the sequence: [b, kv, rep·s, d]
        q = w.node("Mul", [q, self.float_const(cfg.head_dim ** -0.5)], name=f"{p}/q_scaled")
        grouped = w.node("Reshape", [q, c([0, cfg.kv_heads, -1, cfg.head_dim])], name=f"{p}/q_grouped")
        scores = w.node("MatMul", [grouped, w.node("Transpose", [key], name=f"{p}/keys_t", perm=[0, 1, 3, 2])], name=f"{p}/scores")
        scores = w.node("Reshape", [scores, c([0, cfg.num_heads, -1, 0])], name=f"{p}/scores_heads")
        scores = self.to(scores, np.float32, f"{p}/scores_float32")  # the softmax in float32, as transformers computes it
        probs = w.node("Softmax", [w.node("Add", [scores, self.bias], name=f"{p}/masked")], name=f"{p}/probs", axis=-1)
        probs = self.to(probs, self.dtype, f"{p}/probs_back")
        if rep > 1:
            probs = w.node("Reshape", [probs, c([0, cfg.kv_heads, -1, 0])], name=f"{p}/probs_grouped")
        ctx = w.node("MatMul", [probs, value], name=f"{p}/context")
        ctx = w.node("Reshape", [ctx, c([0, cfg.num_heads, -1, cfg.head_dim])], name=f"{p}/context_heads")
        ctx = w.node("Transpose", [ctx], name=f"{p}/context_bshd", perm=[0, 2, 1, 3])
        ctx = w.node("Reshape", [ctx, c([0, 0, cfg.num_heads * cfg.head_dim])], name=f"{p}/context_merged")
        return self.linear(ctx, [f"{p}.o_proj"], f"{p}.o_proj")

    def mlp(self, i: int, x: str) -> str:
        w = self.w
        p = f"model.layers.{i}.mlp"
        gate, up = w.node("Split", [self.linear(x, [f"{p}.gate_proj", f"{p}.up_proj"], f"{p}.gate_up_proj")], 2,
                          name=f"{p}/gate_up", axis=-1, num_outputs=2)
        silu = w.node("Mul", [gate, w.node("Sigmoid", [gate], name=f"{p}/sigmoid")], name=f"{p}/silu")
        return self.linear(w.node("Mul", [silu, up], name=f"{p}/gated"), [f"{p}.down_proj"], f"{p}.down_proj")

    def layer(self, i: int, residual: str, normed: str | None) -> tuple[str, str]:
        """One block; `normed` is the previous block's output still to be added to `residual` (None
        at the first). Returns (the residual stream, the MLP output not yet added to it)."""
        p = f"model.layers.{i}"
        if normed is None:
            x = self.rms_norm(residual, f"{p}.input_layernorm.weight", f"{p}.input_layernorm")
        else:
            residual, x = self.add_norm(normed, residual, f"{p}.input_layernorm.weight", f"{p}.input_layernorm")
        residual, x = self.add_norm(self.attention(i, x), residual, f"{p}.post_attention_layernorm.weight",
                                    f"{p}.post_attention_layernorm")
        return residual, self.mlp(i, x)

    def head(self, residual: str, pending: str) -> None:
        """The final norm and the output projection (the embedding, transposed, when tied)."""
        w = self.w
        _, x = self.add_norm(pending, residual, "model.norm.weight", "model.norm")
        name = "model.embed_tokens.weight" if self.cfg.tied_embeddings else "lm_head.weight"
        weight = self.weight("lm_head.weight_t", lambda: self.weights.get(name, transpose=True))
        w.node("MatMul", [x, weight], ["logits"], name="lm_head")
