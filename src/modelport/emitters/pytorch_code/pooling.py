"""MaxPool, AveragePool, LpPool and their global forms as torch.nn.functional calls."""

from __future__ import annotations

from modelport.emitters.pytorch_code.conv import resolve_pads, tup
from modelport.emitters.pytorch_code.registry import converter


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


@converter("MaxPool")
def max_pool(n):
    nd = _spatial(n)
    n.use("F")
    if n.used(1):
        n.fail("MaxPool indices output (torch numbers them per channel, ONNX over the whole tensor)")
    if n.attr("storage_order", 0):
        n.fail("MaxPool storage_order=1")
    kernel = n.attr("kernel_shape")
    strides = n.attr("strides", [1] * nd)
    dilations = n.attr("dilations", [1] * nd)
    pads = resolve_pads(n, kernel, strides, dilations)
    x = n.t(0)
    begin, end = pads[:nd], pads[nd:]
    fits = all(p <= ((k - 1) * d + 1) // 2 for p, k, d in zip(begin, kernel, dilations, strict=False))
    if begin != end or not fits:
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
    n.emit(f"F.max_pool{nd}d({x}, {', '.join(opts)})")


@converter("AveragePool")
def avg_pool(n):
    nd = _spatial(n)
    n.use("F")
    kernel = n.attr("kernel_shape")
    strides = n.attr("strides", [1] * nd)
    dilations = n.attr("dilations", [1] * nd)
    if any(d != 1 for d in dilations):
        n.fail("AveragePool with dilations (torch's avg_pool has none)")
    pads = resolve_pads(n, kernel, strides, dilations)
    include = bool(n.attr("count_include_pad", 0))
    ceil = bool(n.attr("ceil_mode", 0))
    x = n.t(0)
    begin, end = pads[:nd], pads[nd:]
    opts = [tup(kernel), f"stride={tup(strides)}"]
    if ceil:
        opts.append("ceil_mode=True")
    fits = all(p <= k // 2 for p, k in zip(begin, kernel, strict=False))
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
    if ceil:
        n.fail("AveragePool with unequal pads, ceil_mode and count_include_pad=0")
    # Average over real elements only: pooled sum of the input over pooled count of ones.
    ones = _explicit_pad(n, f"torch.ones_like({x})", pads, None)
    n.emit(f"F.avg_pool{nd}d({padded}, {', '.join(opts)}) / F.avg_pool{nd}d({ones}, {', '.join(opts)})")


def _spatial_dims(n) -> str:
    rank = n.rank(0)
    if rank is None:
        n.fail("global pooling on an input of unknown rank")
    return "(" + ", ".join(str(d) for d in range(2, rank)) + ("," if rank == 3 else "") + ")"


@converter("GlobalAveragePool")
def global_avg_pool(n):
    n.emit(f"{n.t(0)}.mean(dim={_spatial_dims(n)}, keepdim=True)")


@converter("GlobalMaxPool")
def global_max_pool(n):
    n.emit(f"{n.t(0)}.amax(dim={_spatial_dims(n)}, keepdim=True)")


@converter("GlobalLpPool")
def global_lp_pool(n):
    p = n.attr("p", 2)
    n.emit(f"{n.t(0)}.abs().pow({p}).sum(dim={_spatial_dims(n)}, keepdim=True).pow(1 / {p})")


@converter("LpPool")
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
