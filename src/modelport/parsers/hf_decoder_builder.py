"""The nodes of a decoder written from its config and safetensors, layer by layer: RMSNorm, rotary
attention over the key/value cache, the gated MLP and the output projection, in the plain form
(standard ONNX ops) or the fused one (onnxruntime's ops). parsers/hf_decoder_graph.py's docstring
describes both forms and the float16 graph; `write_decoder` there drives the builder.
"""

from __future__ import annotations

import numpy as np

from modelport.parsers.graph_writer import GraphWriter
from modelport.parsers.hf_decoder_config import DecoderConfig
from modelport.parsers.hf_decoder_weights import Weights

MS = "com.microsoft"
BIAS_MIN = float(np.finfo(np.float32).min)  # transformers' own masked-out value: finite, so padded rows stay NaN-free


class Builder:
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
