"""MaxPool, AveragePool, LpPool and their global forms as torch.nn.functional calls."""

from __future__ import annotations

from modelport.emitters.pytorch_code.codegen import literal
from modelport.emitters.pytorch_code.conv import resolve_pads, tup
from modelport.emitters.pytorch_code.registry import CONVERTERS


def _spatial(n) -> int:
    kernel = n.attr("kernel_shape")
    if not kernel:
        n.fail("no kernel_shape")
    if len(kernel) not in (1, 2, 3):
        n.fail(f"{len(kernel)}-D pooling")
    return len(kernel)


def _explicit_pad(n, x: str, pads: list[int], value: str | None) -> str:
    nd = len(pads) // 2
    flat = []
    for i in reversed(range(nd)):
        flat += [pads[i], pads[nd + i]]
    val = f", value={value}" if value is not None else ""
    return f"F.pad({x}, ({', '.join(str(v) for v in flat)}){val})"


@CONVERTERS.register("MaxPool")
def max_pool(n):
    nd = _spatial(n)
    n.use("F")
    with_indices = n.used(1)
    column_major = bool(n.attr("storage_order", 0))
    if column_major and (not with_indices or nd != 2):
        n.fail("MaxPool storage_order=1 outside 2-D pooling with indices")
    kernel = n.attr("kernel_shape")
    strides = n.attr("strides", [1] * nd)
    dilations = n.attr("dilations", [1] * nd)
    pads = resolve_pads(n, kernel, strides, dilations)
    x = n.t(0)
    begin, end = pads[:nd], pads[nd:]
    fits = all(p <= ((k - 1) * d + 1) // 2 for p, k, d in zip(begin, kernel, dilations, strict=False))
    if begin != end or not fits:
        if with_indices:
            n.fail("MaxPool indices with padding torch cannot express")
        if (n.dtype(0) or "float32").startswith(("int", "uint")):
            n.fail("integer MaxPool with padding torch cannot express")
        n.use("math")
        x = _explicit_pad(n, x, pads, "-math.inf")
        begin = [0] * nd
    opts = [tup(kernel), f"stride={tup(strides)}"]
    if any(begin):
        opts.append(f"padding={tup(begin)}")
    if any(d != 1 for d in dilations):
        opts.append(f"dilation={tup(dilations)}")
    if n.attr("ceil_mode", 0):
        opts.append("ceil_mode=True")
    if not with_indices:
        n.emit(f"F.max_pool{nd}d({x}, {', '.join(opts)})")
        return
    pooled, where = n.tmp("pooled"), n.tmp("argmax")
    n.line(f"{pooled}, {where} = F.max_pool{nd}d({x}, {', '.join(opts)}, return_indices=True)")
    n.bind(pooled, 0)
    order = ", column_major=True" if column_major else ""
    n.emit(f"{n.helper('onnx_max_pool_indices')}({x}, {where}{order})", 1)


@CONVERTERS.register("AveragePool")
def avg_pool(n):
    nd = _spatial(n)
    n.use("F")
    kernel = n.attr("kernel_shape")
    strides = n.attr("strides", [1] * nd)
    dilations = n.attr("dilations", [1] * nd)
    pads = resolve_pads(n, kernel, strides, dilations)
    include = bool(n.attr("count_include_pad", 0))
    ceil = bool(n.attr("ceil_mode", 0))
    x = n.t(0)
    begin, end = pads[:nd], pads[nd:]
    opts = [tup(kernel), f"stride={tup(strides)}"]
    if ceil:
        opts.append("ceil_mode=True")
    fits = all(p <= k // 2 for p, k in zip(begin, kernel, strict=False))
    if any(d != 1 for d in dilations) or (ceil and begin != end):
        # torch's avg_pool has no dilation, and its ceil_mode windows differ once pads are uneven
        flags = (", ceil_mode=True" if ceil else "") + (", count_include_pad=True" if include else "")
        n.emit(f"{n.helper('onnx_avg_pool')}({x}, {literal(kernel)}, {literal(strides)}, {literal(pads)}, {literal(dilations)}{flags})")
        return
    if begin == end and fits:
        if any(begin):
            opts.append(f"padding={tup(begin)}")
            if not include:
                opts.append("count_include_pad=False")
        n.emit(f"F.avg_pool{nd}d({x}, {', '.join(opts)})")
        return
    padded = _explicit_pad(n, x, pads, None)
    if include:
        n.emit(f"F.avg_pool{nd}d({padded}, {', '.join(opts)})")
        return
    # Average over real elements only: pooled sum of the input over pooled count of ones.
    ones = _explicit_pad(n, f"torch.ones_like({x})", pads, None)
    n.emit(f"F.avg_pool{nd}d({padded}, {', '.join(opts)}) / F.avg_pool{nd}d({ones}, {', '.join(opts)})")


def _spatial_dims(n) -> str:
    rank = n.rank(0)
    if rank is None:
        return f"tuple(range(2, {n.t(0)}.dim()))"
    return "(" + ", ".join(str(d) for d in range(2, rank)) + ("," if rank == 3 else "") + ")"


@CONVERTERS.register("GlobalAveragePool")
def global_avg_pool(n):
    n.emit(f"{n.t(0)}.mean(dim={_spatial_dims(n)}, keepdim=True)")


@CONVERTERS.register("GlobalMaxPool")
def global_max_pool(n):
    n.emit(f"{n.t(0)}.amax(dim={_spatial_dims(n)}, keepdim=True)")


@CONVERTERS.register("GlobalLpPool")
def global_lp_pool(n):
    p = n.attr("p", 2)
    n.emit(f"{n.t(0)}.abs().pow({p}).sum(dim={_spatial_dims(n)}, keepdim=True).pow(1 / {p})")


@CONVERTERS.register("LpPool")
def lp_pool(n):
    nd = _spatial(n)
    n.use("F")
    kernel = n.attr("kernel_shape")
    strides = n.attr("strides", [1] * nd)
    dilations = n.attr("dilations", [1] * nd)
    if any(d != 1 for d in dilations):
        n.fail("LpPool with dilations")
    pads = resolve_pads(n, kernel, strides, dilations)
    p = n.attr("p", 2)
    x = f"{n.t(0)}.abs().pow({p})"
    if any(pads):
        x = _explicit_pad(n, x, pads, None)
    opts = [tup(kernel), f"stride={tup(strides)}"]
    if n.attr("ceil_mode", 0):
        opts.append("ceil_mode=True")
    count = 1
    for k in kernel:
        count *= k
    n.emit(f"(F.avg_pool{nd}d({x}, {', '.join(opts)}) * {count}).pow(1 / {p})")
