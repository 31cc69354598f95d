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
                    input_forget: bool = False, seq_lens: torch.Tensor | None = None):
    """ONNX LSTM / GRU / RNN with default activations, step by step, in ONNX gate order
    (LSTM: i, o, f, c; GRU: z, r, h). Returns (Y, Y_h, Y_c) in ONNX layouts. With `seq_lens`, a batch
    entry's steps past its length leave its state unchanged and output zeros."""
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
            h_prev, c_prev = h, c
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
            if seq_lens is not None:
                valid = (t < seq_lens).unsqueeze(1)
                h, c = torch.where(valid, h, h_prev), torch.where(valid, c, c_prev)
                outs.append(torch.where(valid, h, 0.0))
            else:
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
def onnx_pad(x: torch.Tensor, pads: list[int], mode: str = "constant", value: float = 0.0,
             axes: list[int] | None = None) -> torch.Tensor:
    """Pad with ONNX's [begin_0, begin_1, ..., end_0, end_1, ...] order (torch starts from the last axis)."""
    half = len(pads) // 2
    axes = list(range(half)) if axes is None else [a % x.dim() for a in axes]
    per_axis = {axis: (pads[i], pads[half + i]) for i, axis in enumerate(axes)}
    flat = []
    for axis in reversed(range(x.dim())):
        flat += per_axis.get(axis, (0, 0))
    while len(flat) > 2 and flat[-1] == 0 and flat[-2] == 0:
        flat = flat[:-2]
    if mode == "constant":
        return torch.nn.functional.pad(x, flat, value=value)
    return torch.nn.functional.pad(x, flat, mode=mode)
'''

ONNX_AVG_POOL = '''
def onnx_avg_pool(x: torch.Tensor, kernel: list[int], strides: list[int], pads: list[int], dilations: list[int],
                  ceil_mode: bool = False, count_include_pad: bool = False) -> torch.Tensor:
    """ONNX AveragePool for what torch's avg_pool lacks (dilations, uneven pads with ceil_mode): a sum over
    each window by a ones-kernel convolution, divided by how many real (or padded) elements it covers."""
    nd = len(kernel)
    spatial = list(x.shape[2:])
    extra = []
    for i in range(nd):
        window = (kernel[i] - 1) * dilations[i] + 1
        span = spatial[i] + pads[i] + pads[nd + i] - window
        out = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (out - 1) * strides[i] >= spatial[i] + pads[i]:
            out -= 1
        extra.append(max(0, (out - 1) * strides[i] + window - spatial[i] - pads[i] - pads[nd + i]))
    torch_pads, count_pads, ceil_pads = [], [], []
    for i in reversed(range(nd)):
        torch_pads += [pads[i], pads[nd + i] + extra[i]]
        count_pads += [pads[i], pads[nd + i]]
        ceil_pads += [0, extra[i]]
    conv = (torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d)[nd - 1]
    flat = x.reshape(-1, 1, *spatial)
    ones_kernel = torch.ones(1, 1, *kernel, dtype=x.dtype, device=x.device)
    total = conv(torch.nn.functional.pad(flat, torch_pads), ones_kernel, stride=strides, dilation=dilations)
    mask = torch.ones_like(flat[:1])
    mask = torch.nn.functional.pad(mask, count_pads, value=1.0 if count_include_pad else 0.0)
    mask = torch.nn.functional.pad(mask, ceil_pads)
    count = conv(mask, ones_kernel, stride=strides, dilation=dilations)
    return (total / count).reshape(*x.shape[:2], *total.shape[2:])
'''

ONNX_MAX_POOL_INDICES = '''
def onnx_max_pool_indices(x: torch.Tensor, indices: torch.Tensor, column_major: bool = False) -> torch.Tensor:
    """ONNX MaxPool's indices count over the whole input tensor (N, C, spatial...), torch's within one channel."""
    plane = 1
    for size in x.shape[2:]:
        plane *= size
    if column_major:
        height, width = x.shape[2], x.shape[3]
        indices = (indices % width) * height + indices // width
    offsets = torch.arange(x.shape[0] * x.shape[1], device=x.device).reshape(x.shape[0], x.shape[1], *[1] * (x.dim() - 2))
    return indices + offsets * plane
'''

ONNX_RESIZE = '''
def onnx_resize(x: torch.Tensor, scales: list[float] | None = None, sizes: list[int] | None = None, *,
                mode: str = "nearest", coordinate_mode: str = "half_pixel", nearest_mode: str = "round_prefer_floor",
                cubic_a: float = -0.75, exclude_outside: bool = False, roi: list[float] | None = None,
                extrapolation: float = 0.0, axes: list[int] | None = None, keep_aspect: str = "stretch") -> torch.Tensor:
    """ONNX Resize for what F.interpolate has no mode for, one axis at a time: map each output index to a
    source coordinate, then take the nearest element or weight the 2 (linear) or 4 (cubic) around it."""
    rank = x.dim()
    scales, sizes, roi = (v.tolist() if isinstance(v, torch.Tensor) else v for v in (scales, sizes, roi))
    scales, sizes, roi = (None if v is not None and len(v) == 0 else v for v in (scales, sizes, roi))
    if axes is not None:
        axes = [a % rank for a in axes]
        if scales is not None:
            scales = [scales[axes.index(d)] if d in axes else 1.0 for d in range(rank)]
        if sizes is not None:
            sizes = [sizes[axes.index(d)] if d in axes else x.shape[d] for d in range(rank)]
        if roi is not None:
            k = len(axes)
            roi = ([roi[axes.index(d)] if d in axes else 0.0 for d in range(rank)]
                   + [roi[k + axes.index(d)] if d in axes else 1.0 for d in range(rank)])
    if sizes is not None and keep_aspect != "stretch":
        picked = axes if axes is not None else list(range(rank))
        ratios = [sizes[d] / x.shape[d] for d in picked]
        ratio = min(ratios) if keep_aspect == "not_larger" else max(ratios)
        scales = [ratio if d in picked else 1.0 for d in range(rank)]
        sizes = [int(ratio * x.shape[d] + 0.5) if d in picked else x.shape[d] for d in range(rank)]
    if sizes is None:
        sizes = [int(size * scale) for size, scale in zip(x.shape, scales, strict=True)]
    if scales is None:
        scales = [out / size for out, size in zip(sizes, x.shape, strict=True)]
    out = x.double()
    for axis in range(rank):
        length, count, scale = x.shape[axis], sizes[axis], scales[axis]
        start, end = (roi[axis], roi[rank + axis]) if roi is not None else (0.0, 1.0)
        if count == length and scale == 1 and (start, end) == (0.0, 1.0):
            continue
        dst = torch.arange(count, dtype=torch.float64, device=x.device)
        width = scale * length
        if coordinate_mode == "align_corners":
            src = dst * (length - 1) / (width - 1) if width != 1 else torch.zeros_like(dst)
        elif coordinate_mode == "asymmetric":
            src = dst / scale
        elif coordinate_mode == "tf_crop_and_resize":
            span = (end - start) * (length - 1)
            src = (dst * span / (width - 1) if width != 1 else torch.full_like(dst, span / 2)) + start * (length - 1)
        elif coordinate_mode == "pytorch_half_pixel" and width == 1:
            src = torch.full_like(dst, -0.5)
        elif coordinate_mode == "half_pixel_symmetric":
            src = length / 2 * (1 - count / width) + (dst + 0.5) / scale - 0.5
        else:
            src = (dst + 0.5) / scale - 0.5
        if mode == "nearest":
            rounding = {"round_prefer_floor": lambda v: torch.ceil(v - 0.5), "round_prefer_ceil": lambda v: torch.floor(v + 0.5),
                        "floor": torch.floor, "ceil": torch.ceil}[nearest_mode]
            taps = rounding(src).long().unsqueeze(1)
            weights = torch.ones_like(src).unsqueeze(1)
        else:
            base = torch.floor(src)
            t = (src - base).unsqueeze(1)
            if mode == "linear":
                taps = base.long().unsqueeze(1) + torch.arange(2, device=x.device)
                weights = torch.cat([1 - t, t], dim=1)
            else:
                taps = base.long().unsqueeze(1) + torch.arange(-1, 3, device=x.device)
                d = (taps - src.unsqueeze(1)).abs()
                a = cubic_a
                weights = torch.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                                      torch.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, torch.zeros_like(d)))
            if exclude_outside:
                weights = weights * ((taps >= 0) & (taps < length))
                weights = weights / weights.sum(dim=1, keepdim=True)
        picked = out.index_select(axis, taps.clamp(0, length - 1).reshape(-1))
        picked = picked.unflatten(axis, (count, taps.shape[1]))
        shape = [1] * (rank + 1)
        shape[axis], shape[axis + 1] = count, taps.shape[1]
        out = (picked * weights.reshape(shape)).sum(dim=axis + 1)
        if coordinate_mode == "tf_crop_and_resize":
            outside = ((src < 0) | (src > length - 1)).reshape(shape[:axis + 1] + [1] * (rank - axis - 1))
            out = torch.where(outside, extrapolation, out)
    return out.to(x.dtype)
'''

ONNX_ATTENTION = '''
def onnx_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                   past_key: torch.Tensor | None = None, past_value: torch.Tensor | None = None,
                   kv_lengths: torch.Tensor | None = None, *, q_heads: int | None = None, kv_heads: int | None = None,
                   scale: float | None = None, causal: bool = False, softcap: float = 0.0, qk_output: int = 0,
                   window: tuple[int, int] = (-1, -1)):
    """ONNX Attention: softmax(q @ k^T * scale + bias) @ v over heads, with the key/value cache, grouped
    heads, bool or additive masks, causal and sliding-window masking aligned to the cache, and softcap.
    Returns (y, present_key, present_value, qk) with qk at the stage `qk_output` names."""
    flat = q.dim() == 3
    if flat:
        q = q.unflatten(-1, (q_heads, -1)).transpose(1, 2)
        k = k.unflatten(-1, (kv_heads, -1)).transpose(1, 2)
        v = v.unflatten(-1, (kv_heads, -1)).transpose(1, 2)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if past_key is not None:
        k, v = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
    present_key, present_value = k, v
    q_len, kv_len = q.shape[2], k.shape[2]
    bias = torch.zeros(q_len, kv_len, dtype=q.dtype, device=q.device)
    if mask is not None:
        if mask.shape[-1] < kv_len:
            mask = torch.nn.functional.pad(mask, (0, kv_len - mask.shape[-1]), value=False if mask.dtype == torch.bool else -math.inf)
        if mask.dtype == torch.bool:
            mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill(~mask, -math.inf)
        bias = bias + mask
    if past_key is None and kv_lengths is not None:
        offset = (kv_lengths.reshape(-1, 1, 1, 1) - q_len).to(q.device)
    else:
        offset = past_key.shape[2] if past_key is not None else 0
    rows = torch.arange(q_len, device=q.device).reshape(-1, 1) + offset
    cols = torch.arange(kv_len, device=q.device)
    allowed = torch.ones_like(rows - cols, dtype=torch.bool)
    if causal:
        allowed = allowed & (cols <= rows)
    if window[0] >= 0:
        allowed = allowed & (rows - cols <= window[0])
    if window[1] >= 0:
        allowed = allowed & (cols - rows <= window[1])
    if kv_lengths is not None:
        allowed = allowed & (cols < kv_lengths.reshape(-1, 1, 1, 1))
    bias = bias.masked_fill(~allowed, -math.inf)
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    qk = (q * scale ** 0.5) @ (k.transpose(-1, -2) * scale ** 0.5)
    if softcap > 0:
        qk = softcap * torch.tanh(qk / softcap)
    scores = qk + bias
    masked_rows = torch.isneginf(bias.amax(dim=-1, keepdim=True))
    weights = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).masked_fill(masked_rows, 0.0).to(q.dtype)
    y = weights @ v
    if flat:
        y = y.transpose(1, 2).flatten(2)
    qk = {0: qk, 1: qk, 2: scores, 3: weights}[qk_output] if softcap > 0 or qk_output != 1 else scores
    return y, present_key, present_value, qk
'''

ORT_ATTENTION = '''
def ort_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, num_heads: int, scale: float | None = None,
                  bias: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """onnxruntime's fused attention: [B, S, N*H] query, key and value split into heads, softmax(q @ k^T
    * scale + bias) @ v (causal: each position sees itself and those before), heads merged again."""
    q, k, v = (t.unflatten(-1, (num_heads, -1)).transpose(1, 2) for t in (q, k, v))
    if causal:
        rows, cols = q.shape[2], k.shape[2]
        future = torch.ones(rows, cols, dtype=torch.bool, device=q.device).triu(cols - rows + 1)
        mask = torch.zeros(rows, cols, dtype=q.dtype, device=q.device).masked_fill(future, float("-inf"))
        bias = mask if bias is None else bias + mask
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if bias is None else bias.to(q.dtype), scale=scale)
    return y.transpose(1, 2).flatten(2)
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
    "onnx_avg_pool": (ONNX_AVG_POOL, ()),
    "onnx_resize": (ONNX_RESIZE, ()),
    "onnx_attention": (ONNX_ATTENTION, ()),
    "ort_attention": (ORT_ATTENTION, ()),
    "onnx_max_pool_indices": (ONNX_MAX_POOL_INDICES, ()),
}
