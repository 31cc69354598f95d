"""LSTM, GRU and RNN: `nn.LSTM` / `nn.GRU` / `nn.RNN` when the weights are constants and the
configuration is one torch has; a step-by-step helper in ONNX semantics otherwise.

Gate order differs: ONNX LSTM stacks (i, o, f, c), torch (i, f, g, o); ONNX GRU (z, r, h), torch
(r, z, n). Torch's GRU applies the reset gate after the recurrent matmul, i.e. ONNX's
`linear_before_reset=1`; a GRU with 0 uses the helper. ONNX Y is [seq, num_directions, batch,
hidden]; torch returns [seq, batch, num_directions * hidden].
"""

from __future__ import annotations

import numpy as np

from modelport.emitters.pytorch_code.registry import CONVERTERS

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
TORCH_ORDER = {"LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2], "RNN": [0]}
DEFAULT_ACTS = {"LSTM": [["Sigmoid", "Tanh", "Tanh"]], "GRU": [["Sigmoid", "Tanh"]], "RNN": [["Tanh"]]}


def _reorder(a: np.ndarray, op: str) -> np.ndarray:
    blocks = np.split(a, GATES[op], axis=0)
    return np.concatenate([blocks[i] for i in TORCH_ORDER[op]], axis=0)


def _activations(n) -> str | None:
    """'default', 'relu' (RNN only) or None when the activations are not ones torch offers."""
    acts = n.attr("activations")
    if not acts:
        return "default"
    ndir = 2 if n.attr("direction", "forward") == "bidirectional" else 1
    per = len(acts) // ndir
    chunks = [acts[i * per:(i + 1) * per] for i in range(ndir)]
    if all(c in DEFAULT_ACTS[n.op_type] for c in chunks):
        return "default"
    if n.op_type == "RNN" and all(c == ["Relu"] for c in chunks):
        return "relu"
    return None


def _module_ok(n, acts) -> bool:
    op = n.op_type
    consts = [n.const(1), n.const(2)]
    if any(c is None or c.dtype != np.float32 for c in consts):
        return False
    if n.has(3) and n.const(3) is None:
        return False
    if n.has(4) and not _full_lengths(n):  # sequence_lens
        return False
    if op == "LSTM" and (n.has(7) or n.attr("input_forget", 0)):
        return False
    if op == "GRU" and not n.attr("linear_before_reset", 0):
        return False
    return acts is not None and n.attr("clip") is None and n.attr("direction", "forward") != "reverse"


def _full_lengths(n) -> bool:
    """sequence_lens is a constant equal to the sequence length for every batch entry."""
    lens, shape = n.const(4), n.static_shape(0)
    if lens is None or shape is None:
        return False
    steps = shape[1] if n.attr("layout", 0) else shape[0]
    return bool((lens == steps).all())


@CONVERTERS.register(("LSTM", "GRU", "RNN"))
def recurrent(n):
    op = n.op_type
    hidden = n.attr("hidden_size")
    direction = n.attr("direction", "forward")
    batch_first = bool(n.attr("layout", 0))
    acts = _activations(n)
    ndir = 2 if direction == "bidirectional" else 1
    if _module_ok(n, acts):
        _as_module(n, op, hidden, ndir, batch_first, acts)
        return
    if acts != "default":
        n.fail(f"{op} activations {n.attr('activations')}")
    clip = n.attr("clip")
    x, w, r = n.t(0), n.t(1), n.t(2)
    b = n.t(3) if n.has(3) else "None"
    h0 = n.t(5) if n.has(5) else "None"
    c0 = n.t(6) if op == "LSTM" and n.has(6) else "None"
    p = n.t(7) if op == "LSTM" and n.has(7) else "None"
    opts = [f'cell="{op.lower()}"', f"hidden_size={hidden}"]
    if direction != "forward":
        opts.append(f'direction="{direction}"')
    if batch_first:
        opts.append("batch_first=True")
    if clip is not None:
        opts.append(f"clip={n.gen.literal(clip)}")
    if op == "GRU" and n.attr("linear_before_reset", 0):
        opts.append("linear_before_reset=True")
    if op == "LSTM" and n.attr("input_forget", 0):
        opts.append("input_forget=True")
    if n.has(4) and not _full_lengths(n):
        opts.append(f"seq_lens={n.t(4)}")
    helper = n.helper("onnx_recurrence")
    n.emit_many(f"{helper}({x}, {w}, {r}, {b}, {h0}, {c0}, {p}, {', '.join(opts)})", 3)


def _as_module(n, op, hidden, ndir, batch_first, acts):
    w, r = n.const(1), n.const(2)
    b = n.const(3) if n.has(3) else None
    gates = GATES[op]
    state = {}
    for d in range(ndir):
        sfx = "_l0" + ("_reverse" if d == 1 else "")
        state[f"weight_ih{sfx}"] = _reorder(w[d], op)
        state[f"weight_hh{sfx}"] = _reorder(r[d], op)
        bias = b[d] if b is not None else np.zeros(2 * gates * hidden, np.float32)
        state[f"bias_ih{sfx}"] = _reorder(bias[: gates * hidden], op)
        state[f"bias_hh{sfx}"] = _reorder(bias[gates * hidden:], op)
    opts = [str(w.shape[2]), str(hidden)]
    if ndir == 2:
        opts.append("bidirectional=True")
    if batch_first:
        opts.append("batch_first=True")
    if acts == "relu":
        opts.append('nonlinearity="relu"')
    mod = n.submodule(n.module_hint(), f"nn.{op}({', '.join(opts)})", state)
    x = n.t(0)

    def initial(i: int) -> str | None:
        if not n.has(i):
            return None
        t = n.t(i)
        return f"{t}.transpose(0, 1)" if batch_first else t

    h0 = initial(5)
    c0 = initial(6) if op == "LSTM" else None
    if op == "LSTM" and (h0 or c0):
        h0 = h0 or f"torch.zeros_like({c0})"
        c0 = c0 or f"torch.zeros_like({h0})"
        call = f"{mod}({x}, ({h0}, {c0}))"
    else:
        call = f"{mod}({x}, {h0})" if h0 else f"{mod}({x})"
    out = n.tmp(f"{op.lower()}_out") if n.used(0) else "_"
    h = n.tmp(f"{op.lower()}_h") if n.used(1) else "_"
    if op == "LSTM":
        c = n.tmp(f"{op.lower()}_c") if n.used(2) else "_"
        n.line(f"{out}, ({h}, {c}) = {call}")
    else:
        c = "_"
        n.line(f"{out}, {h} = {call}")
    if n.used(0):
        if batch_first:
            y = f"{out}.unsqueeze(2)" if ndir == 1 else f"{out}.unflatten(2, (2, {hidden}))"
        else:
            y = f"{out}.unsqueeze(1)" if ndir == 1 else f"{out}.unflatten(2, (2, {hidden})).transpose(1, 2)"
        n.emit(y, 0)
    for j, name in ((1, h), (2, c)):
        if n.used(j):
            if batch_first:
                n.emit(f"{name}.transpose(0, 1)", j)
            else:
                n.bind(name, j)
