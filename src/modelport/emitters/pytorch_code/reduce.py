"""Reduce* (axes from the attribute before opset 18 — 13 for ReduceSum — and from an input after), ArgMax/ArgMin."""

from __future__ import annotations

from modelport.emitters.pytorch_code.registry import CONVERTERS

# op -> (expression template on {x}, torch method applied to it, post-processing template)
REDUCE = {
    "ReduceSum": ("{x}", "sum", "{r}"),
    "ReduceMean": ("{x}", "mean", "{r}"),
    "ReduceMax": ("{x}", "amax", "{r}"),
    "ReduceMin": ("{x}", "amin", "{r}"),
    "ReduceProd": ("{x}", "prod", "{r}"),
    "ReduceL1": ("{x}.abs()", "sum", "{r}"),
    "ReduceL2": ("{x}.pow(2)", "sum", "{r}.sqrt()"),
    "ReduceSumSquare": ("{x}.pow(2)", "sum", "{r}"),
    "ReduceLogSum": ("{x}", "sum", "{r}.log()"),
    "ReduceLogSumExp": ("{x}", "logsumexp", "{r}"),
}
AXES_INPUT_SINCE = {"ReduceSum": 13}


def _axes(n) -> list[int] | None:
    if n.opset >= AXES_INPUT_SINCE.get(n.op_type, 18):
        if not n.has(1):
            return None
        axes = n.const_ints(1)
        if axes is None:
            return "runtime"
        return axes
    return n.attr("axes")


@CONVERTERS.register(tuple(REDUCE))
def reduce(n):
    pre, method, post = REDUCE[n.op_type]
    keep = bool(n.attr("keepdims", 1))
    axes = _axes(n)
    x = n.t(0)
    if axes == "runtime":
        if method == "prod":
            n.fail("ReduceProd with axes computed at run time")
        noop = bool(n.attr("noop_with_empty_axes", 0))
        axes_list = n.ints(1)
        dims = f"tuple({axes_list})" if noop else f"tuple({axes_list}) or tuple(range({x}.dim()))"
        keep_arg = ", keepdim=True" if keep else ""
        base = pre.format(x=x)
        call = f"torch.logsumexp({base}, dim={dims}{keep_arg})" if method == "logsumexp" else f"{base}.{method}(dim={dims}{keep_arg})"
        expr = post.format(r=call)
        n.emit(f"({expr} if len({axes_list}) else {x})" if noop else expr)
        return
    if not axes:
        if axes is not None or n.attr("noop_with_empty_axes", 0):
            if n.attr("noop_with_empty_axes", 0):
                n.alias(0)
                return
        rank = n.rank(0)
        if rank is None and method != "prod":  # every axis, however many there are at run time
            keep_arg = ", keepdim=True" if keep else ""
            base = pre.format(x=x)
            dims = f"tuple(range({x}.dim()))"
            call = f"torch.logsumexp({base}, dim={dims}{keep_arg})" if method == "logsumexp" else f"{base}.{method}(dim={dims}{keep_arg})"
            n.emit(post.format(r=call))
            return
        if rank is None:
            n.fail("ReduceProd over all axes of an input of unknown rank")
        axes = list(range(rank))
    if method == "prod" and len(axes) > 1:
        expr = pre.format(x=x)
        for a in sorted(axes, reverse=True):
            expr = f"{expr}.prod(dim={a}, keepdim=True)"
        if not keep:
            dims = ", ".join(str(a) for a in sorted(axes))
            expr = f"{expr}.squeeze(({dims},))" if len(axes) > 1 else f"{expr}.squeeze({axes[0]})"
        n.emit(post.format(r=expr))
        return
    dims = str(axes[0]) if len(axes) == 1 else "(" + ", ".join(str(a) for a in axes) + ")"
    keep_arg = ", keepdim=True" if keep else ""
    base = pre.format(x=x)
    if method == "logsumexp":
        expr = f"torch.logsumexp({base}, dim={dims}{keep_arg})"
    else:
        expr = f"{base}.{method}(dim={dims}{keep_arg})"
    n.emit(post.format(r=expr))


@CONVERTERS.register(("ArgMax", "ArgMin"))
def arg_reduce(n):
    axis = n.attr("axis", 0)
    keep = bool(n.attr("keepdims", 1))
    fn = "argmax" if n.op_type == "ArgMax" else "argmin"
    x = n.t(0)
    keep_arg = ", keepdim=True" if keep else ""
    if n.attr("select_last_index", 0):
        n.emit(f"{x}.shape[{axis}] - 1 - {x}.flip({axis}).{fn}(dim={axis}{keep_arg})")
    else:
        n.emit(f"{x}.{fn}(dim={axis}{keep_arg})")
