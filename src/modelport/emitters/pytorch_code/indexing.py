"""Slice, Gather (an embedding lookup becomes `nn.Embedding`), GatherElements/ND, Scatter*, TopK, CumSum…

Constant slices are written as Python indexing (`x[:, 1:3]`); negative steps, which torch
indexing lacks, flip the axis first.
"""

from __future__ import annotations

from modelport.emitters.pytorch_code.codegen import literal
from modelport.emitters.pytorch_code.registry import CONVERTERS

BIG = 1 << 62


def _part(n, i: int, k: int) -> str | None:
    """Element k of slice parameter input i as an expression (None when the input is absent)."""
    if not n.has(i):
        return None
    v = n.value(i)
    if v.kind == "const":
        return str(int(v.const.reshape(-1)[k]))
    if v.kind == "ints":
        return f"{v.expr}[{k}]"
    if v.kind == "int":
        return v.expr
    return None


@CONVERTERS.register("Slice")
def slice_(n):
    if n.opset >= 10:
        axes = n.const_ints(3) if n.has(3) else None
        steps = n.const_ints(4) if n.has(4) else None
        if (n.has(3) and axes is None) or (n.has(4) and steps is None):
            return _runtime_slice(n)
        starts_c, ends_c = n.const_ints(1), n.const_ints(2)
        count = len(starts_c) if starts_c is not None else (len(ends_c) if ends_c is not None else None)
        if count is None:
            count = n.value(1).length if n.kind(1) == "ints" else (1 if n.kind(1) == "int" else None)
        if count is None:
            return _runtime_slice(n)
        starts = [_part(n, 1, k) for k in range(count)]
        ends = [_part(n, 2, k) for k in range(count)]
        if None in starts or None in ends:
            return _runtime_slice(n)
    else:
        starts, ends = [str(s) for s in n.attr("starts")], [str(e) for e in n.attr("ends")]
        axes, steps = n.attr("axes"), None
        count = len(starts)
    axes = axes if axes is not None else list(range(count))
    steps = steps if steps is not None else [1] * count
    if n.kind(0) == "ints":
        if len(axes) != 1 or axes[0] not in (0, -1):
            n.fail("slicing a shape list on an axis other than 0")
        s, e, st = _clean(starts[0]), _clean(ends[0]), steps[0]
        step = f":{st}" if st != 1 else ""
        v = n.value(0)
        length = None
        if v.length is not None and all(t.lstrip("-").isdigit() or t == "" for t in (s, e)):
            length = len(range(v.length)[slice(int(s) if s else None, int(e) if e else None, st)])
        n.emit_ints(f"{v.expr}[{s}:{e}{step}]", length)
        return
    x = n.t(0)
    rank = n.rank(0)
    if any(a < 0 for a in axes) and rank is not None:
        axes = [a + rank if a < 0 else a for a in axes]
    if any(a < 0 for a in axes) and not all(a < 0 for a in axes):
        return _runtime_slice(n)  # axes counted from both ends of a tensor whose rank is known only at run time
    _emit_index(n, x, axes, starts, ends, steps)


def _clean(text: str) -> str:
    if text.lstrip("-").isdigit():
        v = int(text)
        if v >= BIG or v <= -BIG:
            return ""
    return text


def _emit_index(n, x, axes, starts, ends, steps):
    """`x[...]` for constant axes and steps: all axes non-negative (indexed from the front), or all
    negative (indexed from the back after an ellipsis, which needs no rank)."""
    flips = []
    parts: dict[int, str] = {}
    shape = n.shape(0)
    for a, s, e, st in zip(axes, starts, ends, steps, strict=False):
        s, e = _clean(s), _clean(e)
        if st < 0:
            size = shape[a] if shape is not None and a >= 0 and a < len(shape) else None
            if not isinstance(size, int) or not (s.lstrip("-").isdigit() or s == "") or not (e.lstrip("-").isdigit() or e == ""):
                return _runtime_slice(n)  # the flipped bounds need the axis's size: the helper computes them
            si = int(s) if s else None
            ei = int(e) if e else None
            if s and int(s) >= size:
                si = None
            idx = list(range(size))[slice(si, ei if not (e and int(e) < -size) else None, st)]
            flips.append(a)
            if not idx:
                parts[a] = "0:0"
            else:
                first = size - 1 - idx[0]
                stop = first + len(idx) * (-st)
                step = f":{-st}" if st != -1 else ""
                parts[a] = f"{first if first else ''}:{stop if stop < size else ''}{step}"
            continue
        step = f":{st}" if st != 1 else ""
        if s in ("0",):
            s = ""
        parts[a] = f"{s}:{e}{step}"
    if flips:
        x = f"{x}.flip({literal(flips)[1:-1]})" if len(flips) > 1 else f"{x}.flip({flips[0]})"
    if min(parts) < 0:
        last = min(parts)
        index = ["..."] + [parts.get(a, ":") for a in range(last, 0)]
    else:
        top = max(parts)
        index = [parts.get(a, ":") for a in range(top + 1)]
    if all(p == ":" for p in index if p != "..."):
        n.emit(x) if flips else n.alias(0)
        return
    n.emit(f"{x}[{', '.join(index)}]")


def _runtime_slice(n):
    if n.opset < 10:  # starts, ends and axes are attributes
        axes = n.attr("axes")
        args = [n.t(0), literal(n.attr("starts")), literal(n.attr("ends")), "None" if axes is None else literal(axes), "None"]
    else:
        args = [n.t(0), n.ints(1), n.ints(2)]
        args.append(n.ints(3) if n.has(3) else "None")
        args.append(n.ints(4) if n.has(4) else "None")
    n.emit(f"{n.helper('onnx_slice')}({', '.join(args)})")


@CONVERTERS.register("Gather")
def gather(n):
    axis = n.attr("axis", 0)
    idx = n.const(1)
    if n.kind(0) == "ints" and idx is not None:
        v = n.value(0)
        if idx.ndim == 0:
            n.emit_int(f"{v.expr}[{int(idx)}]")
        else:
            n.emit_ints("[" + ", ".join(f"{v.expr}[{int(i)}]" for i in idx.reshape(-1)) + "]", idx.size)
        return
    data = n.const(0)
    if data is not None and data.ndim == 2 and data.dtype.kind == "f" and axis == 0 and idx is None:
        mod = n.submodule(n.module_hint(0), f"nn.Embedding({data.shape[0]}, {data.shape[1]})", {"weight": data})
        n.emit(f"{mod}({n.t(1)})")
        return
    x = n.t(0)
    rank = n.rank(0)
    if axis < 0 and rank is not None:
        axis += rank
    # a negative axis on a rank known only at run time is counted from the back, after an ellipsis
    lead, trail = (":, " * axis, "") if axis >= 0 else ("..., ", ", :" * (-axis - 1))
    if idx is not None and idx.ndim == 0:
        n.emit(f"{x}[{lead}{int(idx)}{trail}]")
    elif idx is not None and idx.ndim == 1 and idx.size <= 16:
        n.emit(f"{x}[{lead}{literal(idx)}{trail}]")
    else:
        n.emit(f"{x}[{lead}{n.t(1)}{trail}]")


def _nonneg(n, i: int, data: str, axis) -> str:
    idx = n.t(i)
    c = n.const(i)
    if c is not None and (c >= 0).all():
        return idx
    return f"torch.where({idx} < 0, {idx} + {data}.shape[{axis}], {idx})"


@CONVERTERS.register("GatherElements")
def gather_elements(n):
    axis = n.attr("axis", 0)
    x = n.t(0)
    n.emit(f"torch.gather({x}, {axis}, {_nonneg(n, 1, x, axis)})")


@CONVERTERS.register("GatherND")
def gather_nd(n):
    n.emit(f"{n.helper('gather_nd')}({n.t(0)}, {n.t(1)}, batch_dims={n.attr('batch_dims', 0)})")


REDUCTIONS = {"none": None, "add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@CONVERTERS.register(("ScatterElements", "Scatter"))
def scatter_elements(n):
    axis = n.attr("axis", 0)
    red = n.attr("reduction", "none")
    x = n.t(0)
    idx = _nonneg(n, 1, x, axis)
    if REDUCTIONS.get(red, "?") is None:
        n.emit(f"torch.scatter({x}, {axis}, {idx}, {n.t(2)})")
    elif red in REDUCTIONS:
        n.emit(f'torch.scatter_reduce({x}, {axis}, {idx}, {n.t(2)}, reduce="{REDUCTIONS[red]}")')
    else:
        n.fail(f"reduction '{red}'")


@CONVERTERS.register("ScatterND")
def scatter_nd(n):
    red = n.attr("reduction", "none")
    if red not in ("none", "add", "mul", "max", "min"):
        n.fail(f"reduction '{red}'")
    n.emit(f'{n.helper("scatter_nd")}({n.t(0)}, {n.t(1)}, {n.t(2)}, reduction="{red}")')


@CONVERTERS.register("TopK", since=10)
def topk(n):
    axis = n.attr("axis", -1)
    largest = bool(n.attr("largest", 1))
    sorted_ = bool(n.attr("sorted", 1))
    x = n.t(0)
    if not sorted_:
        opts = [f"dim={axis}"] + ([] if largest else ["largest=False"]) + ([] if sorted_ else ["sorted=False"])
        n.emit_many(f"torch.topk({x}, {n.scalar(1)}, {', '.join(opts)})")
        return
    # ONNX orders equal values by index; a stable sort does, torch.topk does not promise it
    k = n.scalar(1)
    desc = ", descending=True" if largest else ""
    values, order = n.tmp("sorted_values"), n.tmp("order")
    n.line(f"{values}, {order} = torch.sort({x}, dim={axis}{desc}, stable=True)")
    index = ":, " * axis if axis >= 0 else "..., "
    tail = "" if axis >= 0 else ", :" * (-axis - 1)
    for j, name in ((0, values), (1, order)):
        if n.used(j):
            n.emit(f"{name}[{index}:{k}{tail}]", j)


@CONVERTERS.register("NonZero")
def nonzero(n):
    n.emit(f"torch.nonzero({n.t(0)}).T")


@CONVERTERS.register("CumSum")
def cumsum(n):
    x = n.t(0)
    axis = n.scalar(1)
    expr = x
    if n.attr("reverse", 0):
        expr = f"{x}.flip({axis})"
    expr = f"torch.cumsum({expr}, dim={axis})"
    if n.attr("exclusive", 0):
        src = f"{x}.flip({axis})" if n.attr("reverse", 0) else x
        expr = f"({expr} - {src})"
    if n.attr("reverse", 0):
        expr = f"{expr}.flip({axis})"
    n.emit(expr)


@CONVERTERS.register("OneHot")
def one_hot(n):
    axis = n.attr("axis", -1)
    n.emit(f"{n.helper('onnx_one_hot')}({n.t(0)}, {n.scalar(1)}, {n.t(2)}, axis={axis})")
