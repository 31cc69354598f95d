"""Resize / Upsample as `F.interpolate` where torch has the same sampling, an `onnx_resize` helper
otherwise; GridSample as `F.grid_sample`.

Equivalences: nearest + asymmetric + floor is torch's "nearest"; linear with half_pixel (or
pytorch_half_pixel) is (bi/tri)linear with align_corners=False, and with align_corners the same
with align_corners=True; cubic with half_pixel or align_corners, A = -0.75 and no exclude_outside
is "bicubic" on 4-D inputs. Scales are passed as `scale_factor` (torch then maps coordinates with
the given scale, as ONNX does), sizes as `size`.
"""

from __future__ import annotations

import numpy as np

from modelport.emitters.pytorch_code.codegen import literal
from modelport.emitters.pytorch_code.registry import CONVERTERS

TORCH_MODES = {("linear", 3): "linear", ("linear", 4): "bilinear", ("linear", 5): "trilinear", ("cubic", 4): "bicubic"}


def _full(values: list, axes: list[int] | None, rank: int, fill) -> list:
    if axes is None:
        return list(values)
    out = [fill(d) for d in range(rank)]
    for v, a in zip(values, axes, strict=True):
        out[a % rank] = v
    return out


def _interpolate_mode(n, mode: str, coord: str, rank: int | None) -> tuple[str, str] | None:
    """(torch mode, extra arguments) when F.interpolate samples exactly as this Resize does."""
    if rank not in (3, 4, 5):
        return None
    if mode == "nearest":
        if coord == "asymmetric" and n.attr("nearest_mode", "round_prefer_floor") == "floor":
            return '"nearest"', ""
        return None
    torch_mode = TORCH_MODES.get((mode, rank))
    if torch_mode is None or n.attr("exclude_outside", 0):
        return None
    if mode == "cubic" and abs(n.attr("cubic_coeff_a", -0.75) + 0.75) > 1e-9:
        return None
    if coord == "align_corners":
        return f'"{torch_mode}"', ", align_corners=True"
    if coord in ("half_pixel", "pytorch_half_pixel"):
        return f'"{torch_mode}"', ", align_corners=False"
    return None


@CONVERTERS.register(("Resize", "Upsample"))
def resize(n):
    rank = n.rank(0)
    x = n.t(0)
    mode = n.attr("mode", "nearest")
    if n.op_type == "Upsample" or n.opset < 11:
        coord, scales_i, sizes_i, roi_i = "asymmetric", 1, None, None
        if n.op_type == "Upsample" and n.opset < 9:
            scales_c = np.asarray(n.attr("scales"), np.float32)
            scales_i = None
    else:
        coord = n.attr("coordinate_transformation_mode", "half_pixel")
        roi_i, scales_i, sizes_i = 1, 2, 3
    if mode not in ("nearest", "linear", "cubic"):
        n.fail(f"Resize mode '{mode}'")
    has_scales = scales_i is not None and n.has(scales_i) and not (n.const(scales_i) is not None and n.const(scales_i).size == 0)
    if scales_i is None:
        has_scales = True
    else:
        scales_c = n.const(scales_i) if has_scales else None
    has_sizes = sizes_i is not None and n.has(sizes_i)
    sizes_c = n.const(sizes_i) if has_sizes else None
    axes = n.attr("axes")
    policy = n.attr("keep_aspect_ratio_policy", "stretch")
    if rank is None and (axes is not None or policy != "stretch"):
        n.fail("Resize with axes on an input of unknown rank")
    antialias = bool(n.attr("antialias", 0))
    shape = n.static_shape(0)

    scales = sizes = None
    if has_scales and scales_c is not None:
        scales = _full([float(s) for s in scales_c.reshape(-1)], axes, rank, lambda d: 1.0)
    if has_sizes and sizes_c is not None:
        sizes = [int(s) for s in sizes_c.reshape(-1)]
        if policy != "stretch":
            if shape is None:
                n.fail("keep_aspect_ratio_policy on a dynamic input shape")
            picked = axes if axes is not None else list(range(rank))
            ratios = [sizes[i] / shape[a % rank] for i, a in enumerate(picked)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(r * shape[a % rank] + 0.5) for a in picked]
            scales = _full([r] * len(picked), axes, rank, lambda d: 1.0)
        sizes = _full(sizes, axes, rank, lambda d: shape[d] if shape else None)
        if None in sizes:
            n.fail("Resize with axes on a dynamic input shape")

    n.use("F")
    roi = n.const(roi_i) if roi_i is not None and n.has(roi_i) else None
    if coord == "tf_crop_and_resize" and not (roi_i is not None and n.has(roi_i)):
        n.fail("tf_crop_and_resize without a roi")
    if antialias:
        # torch's antialiasing follows PIL (cubic a = -0.5, its own support), not ONNX's filter
        n.fail("antialiased Resize")
    torch_mode = _interpolate_mode(n, mode, coord, rank)
    if torch_mode is not None and coord == "pytorch_half_pixel":
        # an output size of 1 samples at -0.5 in ONNX, at the centre in torch
        out_sizes = sizes or ([int(d * s) for d, s in zip(shape, scales, strict=True)] if shape and scales else None)
        if out_sizes is None or 1 in out_sizes[2:]:
            torch_mode = None
    if torch_mode is not None and (sizes is not None or scales is not None):
        mode_arg, extra = torch_mode
        if sizes is not None and policy == "stretch" and _spatial_only(sizes, shape[:2] if shape else None):
            n.emit(f"F.interpolate({x}, size={_compact(sizes[2:])}, mode={mode_arg}{extra})")
            return
        if sizes is None and _spatial_only(scales, [1.0, 1.0]):
            n.emit(f"F.interpolate({x}, scale_factor={_compact(scales[2:])}, mode={mode_arg}{extra})")
            return
        if sizes is not None and policy != "stretch" and _spatial_only(sizes, shape[:2]):
            n.emit(f"F.interpolate({x}, size={_compact(sizes[2:])}, mode={mode_arg}{extra})")
            return
    runtime = (has_sizes and sizes is None) or (not has_sizes and has_scales and scales is None)
    args = [x]
    if sizes is not None:
        args.append(f"sizes={literal(sizes)}")
        if policy != "stretch":
            args.append(f"scales={literal(scales)}")
    elif scales is not None:
        args.append(f"scales={literal(scales)}")
    elif has_sizes:
        args.append(f"sizes={n.t(sizes_i)}")
    elif has_scales:
        args.append(f"scales={n.t(scales_i)}")
    else:
        n.fail("Resize without scales or sizes")
    if runtime and axes is not None:
        args.append(f"axes={literal(axes)}")
    if runtime and policy != "stretch":
        args.append(f'keep_aspect="{policy}"')
    if mode != "nearest":
        args.append(f'mode="{mode}"')
    if coord != "half_pixel":
        args.append(f'coordinate_mode="{coord}"')
    nearest = n.attr("nearest_mode", "round_prefer_floor") if coord != "asymmetric" or n.opset >= 11 else "floor"
    if mode == "nearest" and nearest != "round_prefer_floor":
        args.append(f'nearest_mode="{nearest}"')
    if mode == "cubic" and n.attr("cubic_coeff_a", -0.75) != -0.75:
        args.append(f"cubic_a={n.gen.literal(n.attr('cubic_coeff_a'))}")
    if n.attr("exclude_outside", 0):
        args.append("exclude_outside=True")
    if coord == "tf_crop_and_resize":
        if roi is not None:
            args.append(f"roi={literal(_full_roi([float(v) for v in roi.reshape(-1)], axes, rank))}")
        else:
            if axes is not None and not runtime:
                n.fail("Resize with axes, constant sizes and a roi computed at run time")
            args.append(f"roi={n.t(roi_i)}")
        if n.attr("extrapolation_value", 0.0) != 0.0:
            args.append(f"extrapolation={n.gen.literal(n.attr('extrapolation_value'))}")
    n.emit(f"{n.helper('onnx_resize')}({', '.join(args)})")


def _spatial_only(values: list | None, batch_channels: list | None) -> bool:
    """Only the spatial axes change (F.interpolate never resizes batch or channels)."""
    return values is not None and batch_channels is not None and list(values[:2]) == list(batch_channels)


def _full_roi(roi: list[float], axes: list[int] | None, rank: int) -> list[float]:
    if axes is None:
        return roi
    k = len(axes)
    return _full(roi[:k], axes, rank, lambda d: 0.0) + _full(roi[k:], axes, rank, lambda d: 1.0)


def _compact(values: list) -> str:
    values = [float(v) if isinstance(v, float) else int(v) for v in values]
    if len(set(values)) == 1:
        return literal(values[0])
    return "(" + ", ".join(literal(v) for v in values) + ")"


GRID_MODES = {"linear": "bilinear", "bilinear": "bilinear", "nearest": "nearest", "cubic": "bicubic", "bicubic": "bicubic"}


@CONVERTERS.register("GridSample")
def grid_sample(n):
    mode = GRID_MODES.get(n.attr("mode", "linear" if n.opset >= 20 else "bilinear"))
    padding = n.attr("padding_mode", "zeros")
    if mode is None or padding not in ("zeros", "border", "reflection"):
        n.fail(f"GridSample mode '{n.attr('mode')}' / padding '{padding}'")
    if mode == "bicubic" and n.rank(0) == 5:
        n.fail("volumetric bicubic GridSample (torch has no 3-D bicubic)")
    n.use("F")
    opts = [f'mode="{mode}"'] if mode != "bilinear" else []
    if padding != "zeros":
        opts.append(f'padding_mode="{padding}"')
    opts.append(f"align_corners={bool(n.attr('align_corners', 0))}")
    n.emit(f"F.grid_sample({n.t(0)}, {n.t(1)}, {', '.join(opts)})")
