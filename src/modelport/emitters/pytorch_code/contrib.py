"""onnxruntime's contrib ops (domain `com.microsoft`) that `--optimize all` writes into transformer
graphs: fused attention, GELU variants, FusedMatMul and SkipLayerNormalization.

Attention packs the Q/K/V projections into one weight ([hidden_in, q + k + v]): it becomes one
`nn.Linear` whose output is split, then `ort_attention` (a helper: heads split, additive masks,
`F.scaled_dot_product_attention`, heads merged). What the ops can also do and these converters do
not (a key/value cache, packed or 4-D keys, rotary, other mask formats) is refused with the reason.
"""

from __future__ import annotations

import numpy as np

from modelport.emitters.pytorch_code.registry import CONVERTERS

MS = "com.microsoft"


def _only_first_output(n) -> None:
    if any(n.used(j) for j in range(1, len(n.outputs))):
        n.fail(f"{n.op_type} outputs beyond the first (the key/value cache)")


def _padding_mask(n, i: int) -> str:
    """A 2-D key padding mask (1 keep, 0 masked) as an additive [B, 1, 1, T] bias."""
    if n.rank(i) not in (None, 2):
        n.fail(f"{n.op_type} mask of rank {n.rank(i)} (only a 2-D key padding mask converts)")
    fill = n.gen.literal(float(n.attr("mask_filter_value", -10000.0)))
    return f"({n.t(i)}[:, None, None, :] == 0).float() * {fill}"


def _attention_call(n, q: str, k: str, v: str, masks: list[str]) -> None:
    opts = [f"num_heads={n.attr('num_heads')}"]
    if n.attr("scale") is not None and float(n.attr("scale")) != 0.0:
        opts.append(f"scale={n.gen.literal(float(n.attr('scale')))}")
    if n.attr("unidirectional", 0):
        opts.append("causal=True")
    if masks:
        opts.append(f"bias={' + '.join(masks)}")
    n.use("F")
    n.emit(f"{n.helper('ort_attention')}({q}, {k}, {v}, {', '.join(opts)})")


@CONVERTERS.register("Attention", domain=MS)
def attention(n):
    """com.microsoft.Attention: packed QKV projection of the input, then attention over heads."""
    _only_first_output(n)
    for i, what in ((4, "past"), (6, "past_sequence_length")):
        if n.has(i):
            n.fail(f"Attention with a {what} input (the key/value cache)")
    if n.attr("do_rotary", 0):
        n.fail("Attention with do_rotary")
    w = n.const(1)
    if w is None or w.ndim != 2:
        n.fail("Attention whose weights are not a constant matrix")
    sizes = list(n.attr("qkv_hidden_sizes") or [w.shape[1] // 3] * 3)
    bias = n.const(2) if n.has(2) else None
    if n.has(2) and bias is None:
        n.fail("Attention whose bias is not a constant")
    state = {"weight": np.ascontiguousarray(w.T)}
    if bias is not None:
        state["bias"] = bias.astype(w.dtype)
    ctor = f"nn.Linear({w.shape[0]}, {w.shape[1]})" if bias is not None else f"nn.Linear({w.shape[0]}, {w.shape[1]}, bias=False)"
    proj = n.submodule("qkv_proj", ctor, state)
    qkv = n.tmp("qkv")
    n.line(f"{qkv} = {proj}({n.t(0)}).split({sizes}, dim=-1)")
    masks = [_padding_mask(n, 3)] if n.has(3) else []
    if n.has(5):
        masks.append(n.t(5))
    _attention_call(n, f"{qkv}[0]", f"{qkv}[1]", f"{qkv}[2]", masks)


@CONVERTERS.register("MultiHeadAttention", domain=MS)
def multi_head_attention(n):
    """com.microsoft.MultiHeadAttention with 3-D query, key and value (bias optional)."""
    _only_first_output(n)
    if not n.has(1) or not n.has(2):
        n.fail("MultiHeadAttention with packed QKV in the query")
    for i in (0, 1, 2):
        if n.rank(i) not in (None, 3):
            n.fail(f"MultiHeadAttention with a {n.rank(i)}-D input {i} (packed or cached keys)")
    if any(n.has(i) for i in range(6, len(n.inputs))):
        n.fail("MultiHeadAttention with past key/value or cache inputs")
    q, k, v = n.t(0), n.t(1), n.t(2)
    if n.has(3):
        qkv = n.tmp("qkv_bias")
        n.line(f"{qkv} = {n.t(3)}.split([{q}.shape[-1], {k}.shape[-1], {v}.shape[-1]])")
        q, k, v = f"{q} + {qkv}[0]", f"{k} + {qkv}[1]", f"{v} + {qkv}[2]"
    masks = [_padding_mask(n, 4)] if n.has(4) else []
    if n.has(5):
        masks.append(n.t(5))
    _attention_call(n, q, k, v, masks)


@CONVERTERS.register("Gelu", domain=MS)
def gelu(n):
    n.use("F")
    n.emit(f"F.gelu({n.t(0)})")


@CONVERTERS.register(("BiasGelu", "FastGelu"), domain=MS)
def bias_gelu(n):
    n.use("F")
    x = f"{n.t(0)} + {n.t(1)}" if n.has(1) else n.t(0)
    n.emit(f"F.gelu({x})" if n.op_type == "BiasGelu" else f'F.gelu({x}, approximate="tanh")')


@CONVERTERS.register("FusedMatMul", domain=MS)
def fused_matmul(n):
    """alpha * op(A) @ op(B), op a transpose of the last two axes."""
    if n.attr("transBatchA", 0) or n.attr("transBatchB", 0):
        n.fail("FusedMatMul with transBatchA/transBatchB")
    a = f"{n.t(0)}.transpose(-1, -2)" if n.attr("transA", 0) else n.t(0)
    b = f"{n.t(1)}.transpose(-1, -2)" if n.attr("transB", 0) else n.t(1)
    alpha = float(n.attr("alpha", 1.0))
    n.emit(f"{a} @ {b}" if alpha == 1.0 else f"{n.gen.literal(alpha)} * ({a} @ {b})")


@CONVERTERS.register("SkipLayerNormalization", domain=MS)
def skip_layer_norm(n):
    """LayerNorm(input + skip (+ bias)) * gamma (+ beta); output 3 is the sum itself."""
    if n.used(1) or n.used(2):
        n.fail("SkipLayerNormalization mean / inv_std_var outputs")
    total = f"{n.t(0)} + {n.t(1)}" + (f" + {n.t(4)}" if n.has(4) else "")
    if len(n.outputs) > 3 and n.used(3):
        total = n.emit(total, 3)
    n.use("F")
    beta = n.t(3) if n.has(3) else "None"
    eps = n.gen.literal(float(n.attr("epsilon", 1e-12)))
    n.emit(f"F.layer_norm({total}, {n.t(2)}.shape, {n.t(2)}, {beta}, eps={eps})")
