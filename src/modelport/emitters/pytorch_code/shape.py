"""Shape, Reshape, Transpose, Concat, (Un)Squeeze, Expand, Flatten, Split, Tile, Pad, Range and friends.

`Shape` yields a Python list (`list(x.shape)`) and the ops that only compute with it keep it that
way; a reshape target built from it is passed to `reshape` directly, so sizes stay symbolic.
"""

from __future__ import annotations

import numpy as np

from modelport.emitters.pytorch_code.codegen import ONNX_DTYPES, Value, literal, torch_dtype
from modelport.emitters.pytorch_code.registry import CONVERTERS


def dims_tuple(dims) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


@CONVERTERS.register("Shape")
def shape(n):
    start, end = n.attr("start", 0), n.attr("end")
    rank = n.rank(0)
    x = n.t(0)
    if start == 0 and end is None:
        n.emit_ints(f"list({x}.shape)", rank)
        return
    length = None
    if rank is not None:
        s = max(0, min(rank, start + rank if start < 0 else start))
        e = rank if end is None else max(0, min(rank, end + rank if end < 0 else end))
        length = max(0, e - s)
    stop = "" if end is None else str(end)
    n.emit_ints(f"list({x}.shape[{start if start else ''}:{stop}])", length)


@CONVERTERS.register("Size")
def size(n):
    n.emit_int(f"{n.t(0)}.numel()")


@CONVERTERS.register("Reshape")
def reshape(n):
    allowzero = n.attr("allowzero", 0)
    if n.kind(0) in ("ints", "int"):
        target = n.const_ints(1)
        if target is not None and len(target) == 1:
            if n.kind(0) == "int":
                n.emit_ints(f"[{n.value(0).expr}]", 1)
            else:
                n.alias(0)
            return
        if target == [] and n.kind(0) == "ints":
            n.emit_int(f"{n.value(0).expr}[0]")
            return
    x = n.t(0)
    target = n.const_ints(1)
    if target is not None:
        parts = []
        for i, d in enumerate(target):
            parts.append(f"{x}.shape[{i}]" if d == 0 and not allowzero else str(d))
        n.emit(f"{x}.reshape({', '.join(parts)})" if parts else f"{x}.reshape(())")
        return
    if n.kind(1) == "ints":
        expr = n.ints(1) if allowzero else _keep_zero_dims(n.value(1).items, n.ints(1), x)
        if expr is not None:
            n.emit(f"{x}.reshape({expr})")
            return
    n.emit(f"{n.helper('onnx_reshape')}({x}, {n.ints(1)}, allowzero={bool(allowzero)})")


def _keep_zero_dims(items: list[str] | None, expr: str, x: str) -> str | None:
    """A reshape target with ONNX's allowzero=0 semantics kept symbolic: each literal 0 among the
    list's known parts becomes the input's size at that position. None when a 0 follows a starred
    part, whose position is known only at run time (the caller then uses the `onnx_reshape` helper)."""
    if items is None or "0" not in items:
        return expr
    out = []
    for i, item in enumerate(items):
        if item == "0":
            if any(p.startswith("*") for p in items[:i]):
                return None
            out.append(f"{x}.shape[{i}]")
        else:
            out.append(item)
    return "[" + ", ".join(out) + "]"


@CONVERTERS.register("Transpose")
def transpose(n):
    if n.kind(0) in ("ints", "int"):
        n.alias(0)
        return
    x = n.t(0)
    perm = n.attr("perm")
    if perm is None:
        rank = n.rank(0)
        if rank is None:
            n.emit(f"{x}.permute(*reversed(range({x}.dim())))")
            return
        perm = list(reversed(range(rank)))
    moved = [i for i, p in enumerate(perm) if p != i]
    if len(moved) == 2 and perm[moved[0]] == moved[1]:
        n.emit(f"{x}.transpose({moved[0]}, {moved[1]})")
    elif not moved:
        n.alias(0)
    else:
        n.emit(f"{x}.permute({', '.join(str(p) for p in perm)})")


@CONVERTERS.register("Concat")
def concat(n):
    idx = [i for i in range(len(n.inputs)) if n.has(i)]
    kinds = [n.kind(i) for i in idx]
    int_like = all(
        k in ("ints", "int") or (k == "const" and n.const(i).ndim <= 1 and n.const(i).dtype.kind == "i")
        for i, k in zip(idx, kinds, strict=False)
    )
    if int_like and any(k in ("ints", "int") for k in kinds):
        parts, length = [], 0
        for i, k in zip(idx, kinds, strict=False):
            v = n.value(i)
            if k == "const":
                parts += [str(int(c)) for c in v.const.reshape(-1)]
                length = None if length is None else length + v.const.size
            elif k == "int":
                parts.append(v.expr)
                length = None if length is None else length + 1
            else:
                parts.append(f"*{v.expr}")
                length = None if length is None or v.length is None else length + v.length
        if len(parts) == 1 and parts[0].startswith("*"):
            n.alias(idx[0])
            return
        n.emit_ints(f"[{', '.join(parts)}]", length, items=parts)
        return
    axis = n.attr("axis", 0)
    args = [n.t(i) for i in idx]
    n.emit(f"torch.cat([{', '.join(args)}], dim={axis})")


def _axes(n, i: int) -> list[int] | None:
    """Axes from input i (opset 13+) or the `axes` attribute."""
    if n.opset >= 13:
        if not n.has(i):
            return None
        axes = n.const_ints(i)
        if axes is None:
            return "runtime"
        return axes
    return n.attr("axes")


@CONVERTERS.register("Unsqueeze")
def unsqueeze(n):
    axes = _axes(n, 1)
    if axes == "runtime":
        n.emit(f"{n.helper('onnx_unsqueeze')}({n.t(0)}, {n.ints(1)})")
        return
    if axes is None:
        n.fail("Unsqueeze without axes")
    if n.kind(0) == "int" and axes in ([0], [-1]):
        n.emit_ints(f"[{n.value(0).expr}]", 1)
        return
    out_rank = n.out_rank()
    if out_rank is None and n.rank(0) is not None:
        out_rank = n.rank(0) + len(axes)
    if any(a < 0 for a in axes) and out_rank is None:
        # the rank is known only at run time: torch counts one negative axis from the output's end as
        # ONNX does; several go through the helper, which normalises them with x.dim()
        if len(axes) == 1:
            n.emit(f"{n.t(0)}.unsqueeze({axes[0]})")
        else:
            n.emit(f"{n.helper('onnx_unsqueeze')}({n.t(0)}, {literal(axes)})")
        return
    axes = sorted(a + out_rank if a < 0 else a for a in axes)
    expr = n.t(0)
    for a in axes:
        expr = f"{expr}.unsqueeze({a})"
    n.emit(expr)


@CONVERTERS.register("Squeeze")
def squeeze(n):
    axes = _axes(n, 1)
    if axes == "runtime":
        n.emit(f"{n.t(0)}.squeeze(tuple({n.ints(1)}))")
        return
    if n.kind(0) == "ints" and (axes is None or axes in ([0], [-1])):
        n.emit_int(f"{n.value(0).expr}[0]")
        return
    x = n.t(0)
    if axes is None:
        n.emit(f"{x}.squeeze()")
    elif len(axes) == 1:
        n.emit(f"{x}.squeeze({axes[0]})")
    else:
        n.emit(f"{x}.squeeze({dims_tuple(axes)})")


@CONVERTERS.register("Expand")
def expand(n):
    x = n.t(0)
    target = n.const_ints(1)
    xs = n.static_shape(0)
    if target is not None and xs is not None and len(target) >= len(xs):
        tail = target[len(target) - len(xs):]
        if all(t == d or d == 1 or t == 1 and d == 1 for t, d in zip(tail, xs, strict=False)) and all(t >= 1 for t in target):
            n.emit(f"{x}.expand({', '.join(str(t) for t in target)})")
            return
    n.emit(f"{x}.expand(torch.broadcast_shapes({x}.shape, tuple({n.ints(1)})))")


@CONVERTERS.register("Flatten")
def flatten(n):
    x = n.t(0)
    axis = n.attr("axis", 1)
    rank = n.rank(0)
    if axis < 0 and rank is None:  # the rank is known at run time only: both sides' sizes from the shape there
        n.use("math")
        n.emit(f"{x}.reshape(math.prod({x}.shape[:{axis}]), math.prod({x}.shape[{axis}:]))")
        return
    if axis < 0:
        axis += rank
    if axis == 0:
        n.emit(f"{x}.reshape(1, -1)")
    elif axis == 1:
        n.emit(f"{x}.flatten(1)" if rank != 2 else f"{x}.flatten(1)")
    elif rank is not None and axis == rank:
        n.emit(f"{x}.reshape(-1, 1)")
    else:
        n.emit(f"{x}.flatten({axis}).flatten(0, {axis - 1})")


@CONVERTERS.register("Split")
def split(n):
    axis = n.attr("axis", 0)
    count = len(n.outputs)
    sizes = None
    if n.opset >= 13 and n.has(1):
        sizes = n.const_ints(1)
        if sizes is None:
            n.emit_many(f"torch.split({n.t(0)}, {n.ints(1)}, dim={axis})")
            return
    elif n.opset < 13:
        sizes = n.attr("split")
    x = n.t(0)
    if sizes is None:
        if n.attr("num_outputs") is not None or count > 1:
            n.emit_many(f"{x}.chunk({count}, dim={axis})")
        else:
            n.alias(0)
        return
    if count == 1:
        n.alias(0)
        return
    n.emit_many(f"torch.split({x}, {literal(sizes)}, dim={axis})")


@CONVERTERS.register("Tile")
def tile(n):
    n.emit(f"{n.t(0)}.repeat({n.ints(1)})")


PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}


@CONVERTERS.register("Pad")
def pad(n):
    mode = n.attr("mode", "constant")
    if mode not in PAD_MODES:
        n.fail(f"Pad mode '{mode}'")
    if n.opset >= 11:
        pads = n.const_ints(1)
        value = n.scalar(2) if n.has(2) and n.const(2) is not None else None
        if n.has(2) and n.const(2) is None:
            value = n.scalar(2)
        axes = n.const_ints(3) if n.has(3) else None
        if n.has(3) and axes is None:
            value_arg = "" if value is None else f", value={value}"
            n.emit(f'{n.helper("onnx_pad")}({n.t(0)}, {n.ints(1)}, mode="{PAD_MODES[mode]}"{value_arg}, axes={n.ints(3)})')
            return
    else:
        pads = n.attr("pads")
        value = n.gen.literal(n.attr("value", 0.0))
        axes = None
    rank = n.rank(0)
    x = n.t(0)
    if pads is None:
        value_arg = "" if value is None else f", value={value}"
        axes_arg = "" if axes is None else f", axes={literal(axes)}"
        n.emit(f'{n.helper("onnx_pad")}({x}, {n.ints(1)}, mode="{PAD_MODES[mode]}"{value_arg}{axes_arg})')
        return
    k = len(pads) // 2
    if axes is not None and rank is None:
        # which dims the axes name (counted from the front or the back) is known at run time only
        value_arg = "" if value is None else f", value={value}"
        n.emit(f'{n.helper("onnx_pad")}({x}, {literal(pads)}, mode="{PAD_MODES[mode]}"{value_arg}, axes={literal(axes)})')
        return
    if axes is None:
        axes = list(range(k))  # pads covers every dim: the rank is k
        rank = k if rank is None else rank
    axes = [a + rank if a < 0 else a for a in axes]
    per_dim = {a: (pads[i], pads[k + i]) for i, a in enumerate(axes)}
    flat = []
    for d in reversed(range(rank)):
        flat += list(per_dim.get(d, (0, 0)))
    while len(flat) > 2 and flat[-1] == 0 and flat[-2] == 0:
        flat = flat[:-2]
    n.use("F")
    # a reflect/replicate/circular pad of a tensor with no batch dim in front of the padded ones (3-D
    # padded on its last two dims, 2-D on its last one) is written on the batched form: the same numbers, and the form
    # every exporter lowers (litert-torch mis-lowers the unbatched one)
    unbatched = mode != "constant" and rank == len(flat) // 2 + 1
    args = [f"{x}.unsqueeze(0)" if unbatched else x, "(" + ", ".join(str(v) for v in flat) + ")"]
    if mode != "constant":
        args.append(f'mode="{PAD_MODES[mode]}"')
    elif value not in (None, "0", "0.0"):
        args.append(f"value={value}")
    n.emit(f"F.pad({', '.join(args)})" + (".squeeze(0)" if unbatched else ""))


@CONVERTERS.register("ConstantOfShape")
def constant_of_shape(n):
    from onnx import numpy_helper

    v = n.attrs.get("value")
    arr = numpy_helper.to_array(v) if v is not None else np.zeros(1, np.float32)
    dt = torch_dtype(arr.dtype)
    dt_arg = "" if dt == "torch.float32" else f", dtype={dt}"
    fill = arr.reshape(-1)[0]
    shape_expr = n.ints(0)
    if fill == 0:
        n.emit(f"torch.zeros({shape_expr}{dt_arg})")
    elif fill == 1:
        n.emit(f"torch.ones({shape_expr}{dt_arg})")
    else:
        n.emit(f"torch.full({shape_expr}, {n.gen.literal(fill)}{dt_arg})")


@CONVERTERS.register("Range")
def range_(n):
    dt = n.out_dtype() or n.dtype(0) or "int64"
    args = ", ".join(n.scalar(i) for i in range(3))
    n.emit(f"torch.arange({args}, dtype={torch_dtype(dt)})")


@CONVERTERS.register("DepthToSpace")
def depth_to_space(n):
    bs = n.attr("blocksize")
    mode = n.attr("mode", "DCR")
    x = n.t(0)
    if mode == "CRD":
        n.use("F")
        n.emit(f"F.pixel_shuffle({x}, {bs})")
        return
    b, c, h, w = (n.tmp(s) for s in ("batch", "channels", "height", "width"))
    n.line(f"{b}, {c}, {h}, {w} = {x}.shape")
    n.emit(f"{x}.reshape({b}, {bs}, {bs}, {c} // {bs * bs}, {h}, {w}).permute(0, 3, 4, 1, 5, 2)"
           f".reshape({b}, {c} // {bs * bs}, {h} * {bs}, {w} * {bs})")


@CONVERTERS.register("SpaceToDepth")
def space_to_depth(n):
    bs = n.attr("blocksize")
    x = n.t(0)
    b, c, h, w = (n.tmp(s) for s in ("batch", "channels", "height", "width"))
    n.line(f"{b}, {c}, {h}, {w} = {x}.shape")
    n.emit(f"{x}.reshape({b}, {c}, {h} // {bs}, {bs}, {w} // {bs}, {bs}).permute(0, 3, 5, 1, 2, 4)"
           f".reshape({b}, {c} * {bs * bs}, {h} // {bs}, {w} // {bs})")


@CONVERTERS.register("Trilu")
def trilu(n):
    fn = "torch.triu" if n.attr("upper", 1) else "torch.tril"
    k = n.scalar(1) if n.has(1) else None
    n.emit(f"{fn}({n.t(0)}, {k})" if k not in (None, "0") else f"{fn}({n.t(0)})")


@CONVERTERS.register("EyeLike")
def eye_like(n):

    s = n.static_shape(0)
    if s is None:
        n.fail("EyeLike on a dynamic shape")
    dt = ONNX_DTYPES.get(n.attr("dtype")) if n.attr("dtype") is not None else (n.dtype(0) or "float32")
    n.gen.values[n.outputs[0]] = Value("const", const=np.eye(s[0], s[1], k=n.attr("k", 0), dtype=np.dtype(dt)))
