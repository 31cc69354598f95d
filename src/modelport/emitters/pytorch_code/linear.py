"""Gemm and MatMul (+ a bias Add) as `nn.Linear` when the weight is a constant; `@` otherwise. Einsum.

ONNX computes x @ W (W: [in, out]); nn.Linear holds weight [out, in], so W is stored transposed.
"""

from __future__ import annotations

import numpy as np

from modelport.emitters.pytorch_code.registry import CONVERTERS


def _linear(n, hint_input: int, weight: np.ndarray, bias: np.ndarray | None) -> str:
    out_f, in_f = weight.shape
    state = {"weight": weight.astype(weight.dtype)}
    if bias is not None:
        state["bias"] = np.broadcast_to(bias, (out_f,)).astype(weight.dtype)
    ctor = f"nn.Linear({in_f}, {out_f})" if bias is not None else f"nn.Linear({in_f}, {out_f}, bias=False)"
    return n.submodule(n.module_hint(hint_input), ctor, state)


def _bias_vector(c: np.ndarray | None, out_f: int) -> bool:
    return c is not None and c.size in (1, out_f) and (c.ndim <= 1 or all(d == 1 for d in c.shape[:-1]))


@CONVERTERS.register("Gemm")
def gemm(n):
    alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
    ta, tb = n.attr("transA", 0), n.attr("transB", 0)
    w, c = n.const(1), n.const(2)
    if w is not None and not ta and w.dtype.kind == "f" and (not n.has(2) or _bias_vector(c, w.shape[1 - tb])):
        weight = (w if tb else w.T) * np.asarray(alpha, w.dtype)
        bias = None if not n.has(2) else (c.reshape(-1) * np.asarray(beta, c.dtype))
        mod = _linear(n, 1, np.ascontiguousarray(weight), bias)
        n.emit(f"{mod}({n.t(0)})")
        return
    a = f"{n.t(0)}.T" if ta else n.t(0)
    b = f"{n.t(1)}.T" if tb else n.t(1)
    expr = f"{a} @ {b}"
    if alpha != 1.0:
        expr = f"{n.gen.literal(alpha)} * ({expr})"
    if n.has(2):
        cexpr = n.t(2) if beta == 1.0 else f"{n.gen.literal(beta)} * {n.t(2)}"
        expr = f"{expr} + {cexpr}"
    n.emit(expr)


@CONVERTERS.register("MatMul")
def matmul(n):
    w = n.const(1)
    if w is not None and w.ndim == 2 and w.dtype.kind == "f" and n.kind(0) == "tensor":
        bias = None
        users = n.consumers(0)
        if len(users) == 1 and users[0].op_type == "Add" and n.outputs[0] not in {o.name for o in n.gen.graph.output}:
            add = users[0]
            other = add.input[1] if add.input[0] == n.outputs[0] else add.input[0]
            cv = n.gen.values.get(other)
            if cv is not None and cv.kind == "const" and _bias_vector(cv.const, w.shape[1]) and cv.const.dtype == w.dtype:
                bias = cv.const.reshape(-1)
                n.absorb(add)
                mod = _linear(n, 1, np.ascontiguousarray(w.T), bias)
                n.emit_as(add.output[0], f"{mod}({n.t(0)})", "Linear")
                n.gen.values[n.outputs[0]] = n.gen.values[add.output[0]]
                return
        mod = _linear(n, 1, np.ascontiguousarray(w.T), None)
        n.emit(f"{mod}({n.t(0)})")
        return
    n.emit(f"{n.t(0)} @ {n.t(1)}")


@CONVERTERS.register("Einsum")
def einsum(n):
    eq = n.attr("equation").replace(" ", "")
    args = ", ".join(n.t(i) for i in range(len(n.inputs)))
    n.emit(f'torch.einsum("{eq}", {args})')


@CONVERTERS.register("Attention")
def attention(n):
    """ONNX Attention (opset 23): a call to the `onnx_attention` helper."""
    args = [n.t(i) for i in range(3)]
    optional = [n.t(i) if n.has(i) else "None" for i in range(3, 7)]
    while optional and optional[-1] == "None":
        optional.pop()
    args += optional
    if n.attr("softmax_precision") == 11:
        n.fail("softmax_precision float64 (the softmax runs in float32)")
    opts = []
    if n.attr("q_num_heads") is not None:
        opts += [f"q_heads={n.attr('q_num_heads')}", f"kv_heads={n.attr('kv_num_heads')}"]
    if n.attr("scale") is not None:
        opts.append(f"scale={n.gen.literal(n.attr('scale'))}")
    if n.attr("is_causal", 0):
        opts.append("causal=True")
    if n.attr("softcap", 0.0):
        opts.append(f"softcap={n.gen.literal(n.attr('softcap'))}")
    if n.attr("qk_matmul_output_mode", 0):
        opts.append(f"qk_output={n.attr('qk_matmul_output_mode')}")
    window = (n.attr("left_window_size", -1), n.attr("right_window_size", -1))
    if window != (-1, -1):
        opts.append(f"window={window}")
    n.use("math")
    n.emit_many(f"{n.helper('onnx_attention')}({', '.join(args + opts)})", 4)
