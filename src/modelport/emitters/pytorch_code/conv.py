"""Conv and ConvTranspose: `nn.ConvNd` / `nn.ConvTransposeNd` for constant weights, `F.convNd` otherwise.

ONNX pads are [begin_0, begin_1, ..., end_0, end_1, ...]; torch takes one symmetric padding per
dimension, so unequal begin/end pads become an explicit `F.pad` before the convolution.
"""

from __future__ import annotations

import math

from modelport.emitters.pytorch_code.registry import CONVERTERS


def tup(values) -> str:
    values = [int(v) for v in values]
    if len(set(values)) == 1:
        return str(values[0])
    return "(" + ", ".join(str(v) for v in values) + ")"


def same_pads(n, kernel, strides, dilations, spatial_in, mode: str) -> list[int]:
    """Begin and end pads for auto_pad SAME_UPPER / SAME_LOWER."""
    begins, ends = [], []
    for i, k in enumerate(kernel):
        s, d = strides[i], dilations[i]
        if s == 1:
            total = d * (k - 1)
        else:
            size = spatial_in[i] if spatial_in else None
            if not isinstance(size, int):
                n.fail("auto_pad SAME with stride > 1 on a dynamic spatial size")
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else big)
        ends.append(big if mode == "SAME_UPPER" else small)
    return begins + ends


def resolve_pads(n, kernel, strides, dilations) -> list[int]:
    nd = len(kernel)
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        shape = n.shape(0)
        return same_pads(n, kernel, strides, dilations, shape[2:] if shape else None, auto)
    if auto == "VALID":
        return [0] * (2 * nd)
    return list(n.attr("pads", [0] * (2 * nd)))


def _pad_list(flat: list[int]) -> str:
    return "(" + ", ".join(str(v) for v in flat) + ")"


def _weight_and_dims(n, what: str):
    """(constant weight or None, spatial dims) of a Conv/ConvTranspose; 1-3 spatial dims only."""
    w = n.const(1)
    rank = n.rank(1) if w is None else w.ndim
    if rank is None:
        n.fail("weight of unknown rank")
    nd = rank - 2
    if nd not in (1, 2, 3):
        n.fail(f"{nd}-D {what}")
    return w, nd


@CONVERTERS.register("Conv")
def conv(n):
    w, nd = _weight_and_dims(n, "convolution")
    kernel = n.attr("kernel_shape") or (list(w.shape[2:]) if w is not None else (n.static_shape(1) or [None])[2:])
    if not kernel or any(k is None for k in kernel):
        n.fail("kernel shape unknown")
    strides = n.attr("strides", [1] * nd)
    dilations = n.attr("dilations", [1] * nd)
    group = n.attr("group", 1)
    pads = resolve_pads(n, kernel, strides, dilations)
    x, padding = _pad_input(n, n.t(0), pads)
    opts = []
    if any(s != 1 for s in strides):
        opts.append(f"stride={tup(strides)}")
    if any(p != 0 for p in padding):
        opts.append(f"padding={tup(padding)}")
    if any(d != 1 for d in dilations):
        opts.append(f"dilation={tup(dilations)}")
    if group != 1:
        opts.append(f"groups={group}")
    b = n.const(2) if n.has(2) else None
    if w is not None and w.dtype.kind == "f" and (not n.has(2) or b is not None):
        cin, cout = w.shape[1] * group, w.shape[0]
        args = [str(cin), str(cout), f"kernel_size={tup(kernel)}", *opts] + ([] if n.has(2) else ["bias=False"])
        state = {"weight": w}
        if n.has(2):
            state["bias"] = b
        mod = n.submodule(n.module_hint(1), f"nn.Conv{nd}d({', '.join(args)})", state)
        n.emit(f"{mod}({x})")
        return
    n.use("F")
    bias = n.t(2) if n.has(2) else "None"
    n.emit(f"F.conv{nd}d({', '.join([x, n.t(1), bias, *opts])})")


def _pad_input(n, x: str, pads: list[int]) -> tuple[str, list[int]]:
    nd = len(pads) // 2
    begin, end = pads[:nd], pads[nd:]
    if begin == end:
        return x, begin
    n.use("F")
    flat = []
    for i in reversed(range(nd)):
        flat += [begin[i], end[i]]
    return f"F.pad({x}, {_pad_list(flat)})", [0] * nd


@CONVERTERS.register("ConvTranspose")
def conv_transpose(n):
    w, nd = _weight_and_dims(n, "transposed convolution")
    wshape = list(w.shape) if w is not None else n.static_shape(1)
    kernel = n.attr("kernel_shape") or (wshape[2:] if wshape else None)
    if not kernel:
        n.fail("kernel shape unknown")
    strides = n.attr("strides", [1] * nd)
    dilations = n.attr("dilations", [1] * nd)
    group = n.attr("group", 1)
    out_pad = list(n.attr("output_padding", [0] * nd))
    pads = list(n.attr("pads", [0] * (2 * nd)))
    auto = n.attr("auto_pad", "NOTSET")
    out_shape = n.attr("output_shape")
    in_shape = n.shape(0)
    spatial = in_shape[2:] if in_shape else None
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if not spatial or not all(isinstance(d, int) for d in spatial):
            n.fail("output_shape / auto_pad SAME on a dynamic spatial size")
        target = list(out_shape)[-nd:] if out_shape is not None else [spatial[i] * strides[i] for i in range(nd)]
        pads = []
        begins, ends = [], []
        for i in range(nd):
            total = strides[i] * (spatial[i] - 1) + out_pad[i] + ((kernel[i] - 1) * dilations[i] + 1) - target[i]
            if total < 0:
                out_pad[i] += -total
                total = 0
            small, big = total // 2, total - total // 2
            use_upper = auto != "SAME_LOWER"
            begins.append(small if use_upper else big)
            ends.append(big if use_upper else small)
        pads = begins + ends
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    begin, end = pads[:nd], pads[nd:]
    crop = None
    padding = begin
    if begin != end:
        # Pad symmetrically by the smaller amount, then crop the rest.
        padding = [min(a, b) for a, b in zip(begin, end, strict=False)]
        crop = [(a - p, b - p) for a, b, p in zip(begin, end, padding, strict=False)]
    opts = []
    if any(s != 1 for s in strides):
        opts.append(f"stride={tup(strides)}")
    if any(p != 0 for p in padding):
        opts.append(f"padding={tup(padding)}")
    if any(p != 0 for p in out_pad):
        opts.append(f"output_padding={tup(out_pad)}")
    if group != 1:
        opts.append(f"groups={group}")
    if any(d != 1 for d in dilations):
        opts.append(f"dilation={tup(dilations)}")
    b = n.const(2) if n.has(2) else None
    if w is not None and w.dtype.kind == "f" and (not n.has(2) or b is not None):
        cin, cout = w.shape[0], w.shape[1] * group
        args = [str(cin), str(cout), f"kernel_size={tup(kernel)}", *opts] + ([] if n.has(2) else ["bias=False"])
        state = {"weight": w}
        if n.has(2):
            state["bias"] = b
        mod = n.submodule(n.module_hint(1), f"nn.ConvTranspose{nd}d({', '.join(args)})", state)
        expr = f"{mod}({n.t(0)})"
    else:
        n.use("F")
        bias = n.t(2) if n.has(2) else "None"
        expr = f"F.conv_transpose{nd}d({', '.join([n.t(0), n.t(1), bias, *opts])})"
    if crop:
        index = ", ".join([":", ":"] + [f"{a}:{'-' + str(b) if b else ''}" for a, b in crop])
        expr = f"({expr})[{index}]"
    n.emit(expr)
