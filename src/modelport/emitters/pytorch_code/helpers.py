"""Module-level helper functions a generated model.py includes when an op needs more than one call.

Each entry is (source, helpers it calls). Only helpers a model uses are written into its file.
"""

from __future__ import annotations

ONNX_RESHAPE = '''
def onnx_reshape(x: torch.Tensor, shape: list[int], allowzero: bool = False) -> torch.Tensor:
    """Reshape with ONNX semantics: a 0 in `shape` copies the input's size unless `allowzero`."""
    if not allowzero:
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)
'''

ONNX_SLICE = '''
def onnx_slice(x: torch.Tensor, starts: list[int], ends: list[int], axes: list[int] | None = None,
               steps: list[int] | None = None) -> torch.Tensor:
    """Slice with bounds known only at run time (ONNX Slice semantics, negative steps included)."""
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        picked = range(x.shape[axis])[slice(start, end, step)]
        index = torch.tensor(list(picked), dtype=torch.long, device=x.device)
        x = x.index_select(axis, index)
    return x
'''

GATHER_ND = '''
def gather_nd(data: torch.Tensor, indices: torch.Tensor, batch_dims: int = 0) -> torch.Tensor:
    """ONNX GatherND: the last axis of `indices` indexes the axes of `data` that follow `batch_dims`."""
    batch_shape, index_shape, depth = data.shape[:batch_dims], indices.shape[batch_dims:-1], indices.shape[-1]
    flat_data = data.reshape(-1, *data.shape[batch_dims:])
    flat_index = indices.reshape(flat_data.shape[0], -1, depth).long()
    sizes = torch.tensor(flat_data.shape[1:depth + 1], device=data.device)
    flat_index = torch.where(flat_index < 0, flat_index + sizes, flat_index)
    batch = torch.arange(flat_data.shape[0], device=data.device).unsqueeze(1).expand(-1, flat_index.shape[1])
    picked = flat_data[(batch, *flat_index.unbind(-1))]
    return picked.reshape(*batch_shape, *index_shape, *data.shape[batch_dims + depth:])
'''

SCATTER_ND = '''
def scatter_nd(data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    """ONNX ScatterND: write (or reduce) `updates` into a copy of `data` at the positions in `indices`."""
    out = data.clone()
    depth = indices.shape[-1]
    flat_index = indices.reshape(-1, depth)
    flat_updates = updates.reshape(-1, *data.shape[depth:])
    for position, update in zip(flat_index.tolist(), flat_updates, strict=True):
        key = tuple(position)
        if reduction == "add":
            out[key] = out[key] + update
        elif reduction == "mul":
            out[key] = out[key] * update
        elif reduction == "max":
            out[key] = torch.maximum(out[key], update)
        elif reduction == "min":
            out[key] = torch.minimum(out[key], update)
        else:
            out[key] = update
    return out
'''

ONE_HOT = '''
def onnx_one_hot(indices: torch.Tensor, depth: int, values: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """ONNX OneHot: `values[1]` at each index (negative indices count from the end), `values[0]` elsewhere."""
    depth = int(depth)
    indices = indices.long()
    indices = torch.where(indices < 0, indices + depth, indices)
    hot = torch.nn.functional.one_hot(indices.clamp(0, depth - 1), depth) * ((indices >= 0) & (indices < depth)).unsqueeze(-1)
    out = torch.where(hot.bool(), values[1], values[0])
    return out.movedim(-1, axis if axis >= 0 else out.dim() + axis)
'''

RNN_LOOP = '''
def onnx_recurrence(x, w, r, b, h0, c0, peephole, *, cell: str, hidden_size: int, direction: str = "forward",
                    batch_first: bool = False, clip: float | None = None, linear_before_reset: bool = False,
                    input_forget: bool = False):
    """ONNX LSTM / GRU / RNN with default activations, step by step, in ONNX gate order
    (LSTM: i, o, f, c; GRU: z, r, h). Returns (Y, Y_h, Y_c) in ONNX layouts."""
    if batch_first:
        x = x.transpose(0, 1)
        h0 = None if h0 is None else h0.transpose(0, 1)
        c0 = None if c0 is None else c0.transpose(0, 1)
    steps, batch = x.shape[0], x.shape[1]
    num_dir = w.shape[0]
    gates = {"lstm": 4, "gru": 3, "rnn": 1}[cell]
    ys, hs, cs = [], [], []
    for d in range(num_dir):
        reverse = direction == "reverse" or d == 1
        bias = torch.zeros(2 * gates * hidden_size, dtype=x.dtype, device=x.device) if b is None else b[d]
        wb, rb = bias[: gates * hidden_size], bias[gates * hidden_size:]
        h = torch.zeros(batch, hidden_size, dtype=x.dtype, device=x.device) if h0 is None else h0[d]
        c = torch.zeros(batch, hidden_size, dtype=x.dtype, device=x.device) if c0 is None else c0[d]
        outs = []
        for t in (reversed(range(steps)) if reverse else range(steps)):
            xw = x[t] @ w[d].T + wb
            if cell == "lstm":
                g = xw + h @ r[d].T + rb
                if clip is not None:
                    g = g.clamp(-clip, clip)
                gi, go, gf, gc = g.chunk(4, dim=-1)
                if peephole is not None:
                    pi, po, pf = peephole[d].chunk(3)
                    gi, gf = gi + pi * c, gf + pf * c
                i, f = torch.sigmoid(gi), torch.sigmoid(gf)
                if input_forget:
                    f = 1 - i
                c = f * c + i * torch.tanh(gc)
                if peephole is not None:
                    go = go + po * c
                h = torch.sigmoid(go) * torch.tanh(c)
            elif cell == "gru":
                xz, xr, xh = xw.chunk(3, dim=-1)
                rz, rr, rh = r[d].chunk(3, dim=0)
                bz, br, bh = rb.chunk(3)
                pre_z, pre_r = xz + h @ rz.T + bz, xr + h @ rr.T + br
                if clip is not None:
                    pre_z, pre_r = pre_z.clamp(-clip, clip), pre_r.clamp(-clip, clip)
                z, rg = torch.sigmoid(pre_z), torch.sigmoid(pre_r)
                if linear_before_reset:
                    pre_h = xh + rg * (h @ rh.T + bh)
                else:
                    pre_h = xh + (rg * h) @ rh.T + bh
                if clip is not None:
                    pre_h = pre_h.clamp(-clip, clip)
                h = (1 - z) * torch.tanh(pre_h) + z * h
            else:
                pre = xw + h @ r[d].T + rb
                if clip is not None:
                    pre = pre.clamp(-clip, clip)
                h = torch.tanh(pre)
            outs.append(h)
        if reverse:
            outs.reverse()
        ys.append(torch.stack(outs))
        hs.append(h)
        cs.append(c)
    y = torch.stack(ys, dim=1)
    y_h, y_c = torch.stack(hs), torch.stack(cs)
    if batch_first:
        return y.permute(2, 0, 1, 3), y_h.transpose(0, 1), y_c.transpose(0, 1)
    return y, y_h, y_c
'''

ONNX_UNSQUEEZE = '''
def onnx_unsqueeze(x: torch.Tensor, axes: list[int]) -> torch.Tensor:
    """Insert size-1 axes at `axes` (positions in the output, negative ones counted from its end)."""
    rank = x.dim() + len(axes)
    for axis in sorted(a + rank if a < 0 else a for a in axes):
        x = x.unsqueeze(axis)
    return x
'''

ONNX_PAD = '''
def onnx_pad(x: torch.Tensor, pads: list[int], mode: str = "constant", value: float = 0.0) -> torch.Tensor:
    """Pad with ONNX's [begin_0, begin_1, ..., end_0, end_1, ...] order (torch starts from the last axis)."""
    half = len(pads) // 2
    flat = []
    for axis in reversed(range(half)):
        flat += [pads[axis], pads[half + axis]]
    while len(flat) > 2 and flat[-1] == 0 and flat[-2] == 0:
        flat = flat[:-2]
    if mode == "constant":
        return torch.nn.functional.pad(x, flat, value=value)
    return torch.nn.functional.pad(x, flat, mode=mode)
'''

HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "onnx_reshape": (ONNX_RESHAPE, ()),
    "onnx_slice": (ONNX_SLICE, ()),
    "gather_nd": (GATHER_ND, ()),
    "scatter_nd": (SCATTER_ND, ()),
    "onnx_one_hot": (ONE_HOT, ()),
    "onnx_recurrence": (RNN_LOOP, ()),
    "onnx_unsqueeze": (ONNX_UNSQUEEZE, ()),
    "onnx_pad": (ONNX_PAD, ()),
}
