"""Translations of the two layers of SSD's detection heads: Normalize (SSD's L2 normalisation, with
its learned scales) and PriorBox (the default boxes: a constant of the feature map's and the
image's sizes, computed here as OpenCV DNN computes them). DetectionOutput, the non-maximum
suppression after them, has no translation."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from modelport.errors import BadInputError
from modelport.parsers.caffe_graph import Graph, Layer

F32 = np.float32


def _normalize(g: Graph, L: Layer) -> list[str]:
    """x over its L2 norm, sqrt(sum of x^2 + eps), taken per position over the channels
    (`across_spatial: false`) or over the whole sample, then times the layer's one blob of scales
    (one value, or one per channel; across the whole sample OpenCV takes one per value of the
    sample): OpenCV's NormalizeBBox at p = 2 (no blob: no scaling)."""
    p = L.proto.norm_param
    x, s = L.inputs[0], L.shapes[0]
    if len(s) < 2:
        raise L.error(f"Normalize takes an input with a channel axis, the input is {s}")
    axes = list(range(1, len(s))) if p.across_spatial else [1]
    reduced = [s[0], *[1 if i in axes else d for i, d in enumerate(s) if i]]
    square = g.node("Mul", [x, x], s, L.name)
    total = g.node("ReduceSum", [square, g.const(L.name, "axes", np.array(axes, np.int64))], reduced, L.name, keepdims=1)
    total = g.node("Add", [total, g.const(L.name, "eps", np.array(p.eps, F32))], reduced, L.name)
    out = g.node("Div", [x, g.node("Sqrt", [total], reduced, L.name)], s, L.name)
    if not L.weights:
        return [out]
    if len(L.weights) != 1:
        raise L.error(f"{len(L.weights)} blobs in the weights, its parameters need 1 (the scale)")
    scale = L.weights[0].values
    planes = s[1:] if p.across_spatial else s[1:2]
    if scale.size == 1:
        scale = scale.reshape([])
    elif scale.size == np.prod(L.static(planes, "a scale per value")):
        scale = scale.reshape(planes + [1] * (len(s) - 1 - len(planes)))
    else:
        where = "value of the sample" if p.across_spatial else "channel"
        raise L.error(f"blob {L.weights[0].index} (scale) has {scale.size} values, its parameters need 1 or one per "
                      f"{where} ({int(np.prod(planes))})")
    return [g.node("Mul", [out, g.const(L.name, "scale", scale.astype(F32))], s, L.name)]


def _box_sizes(p, error: Callable[[str], BadInputError]) -> tuple[list, list]:
    """The widths and heights of the boxes at each position, in OpenCV's order: for each min_size,
    a square of that size, then one of sqrt(min_size * max_size) with max_sizes (one for each
    min_size), then that min_size at each aspect ratio (1 and repeats left out, each followed by
    its inverse with flip); or the explicit widths and heights."""
    if len(p.width) != len(p.height):
        raise error(f"{len(p.width)} widths and {len(p.height)} heights")
    ratios: list = []
    for r in (F32(v) for v in p.aspect_ratio):
        if abs(float(r) - 1.0) < 1e-6 or any(abs(float(r) - float(q)) < 1e-6 for q in ratios):
            continue
        ratios.append(r)
        if p.flip:
            ratios.append(F32(1.0 / float(r)))
    if len(p.width):
        if ratios or len(p.min_size) or len(p.max_size):
            raise error("explicit widths and heights go without min_size, max_size and aspect ratios")
        return [F32(v) for v in p.width], [F32(v) for v in p.height]
    lows, highs = [F32(v) for v in p.min_size], [F32(v) for v in p.max_size]
    if not lows or not all(v > 0 for v in lows):
        raise error(f"min_size takes positive values, it has {[float(v) for v in lows]}")
    if highs and (len(highs) != len(lows) or not all(h > v for v, h in zip(lows, highs, strict=True))):
        raise error(f"max_size {[float(v) for v in highs]} needs one value above each min_size {[float(v) for v in lows]}")
    widths, heights = [], []
    for i, low in enumerate(lows):
        widths.append(low)
        heights.append(low)
        if highs:
            widths.append(F32(np.sqrt(low * highs[i])))
            heights.append(widths[-1])
        for r in ratios:
            root = F32(np.sqrt(r))
            widths.append(low * root)
            heights.append(low / root)
    return widths, heights


def _steps_and_offsets(p, error: Callable[[str], BadInputError]) -> tuple[tuple, list[tuple]]:
    """(step_y, step_x), 0 where the sizes give them, and the (y, x) offsets of the box centres."""
    for name in ("step", "step_h", "step_w"):
        if p.HasField(name) and not getattr(p, name) > 0:
            raise error(f"{name} must be positive, it is {getattr(p, name):g}")
    if p.HasField("step_h") or p.HasField("step_w"):
        if p.HasField("step") or not (p.HasField("step_h") and p.HasField("step_w")):
            raise error("step_h and step_w go together, without step")
        steps = (F32(p.step_h), F32(p.step_w))
    else:
        steps = (F32(p.step),) * 2 if p.HasField("step") else (F32(0), F32(0))
    if len(p.offset_h) or len(p.offset_w):
        if p.HasField("offset") or len(p.offset_h) != len(p.offset_w) or len(p.offset_h) > 2:
            raise error("offset_h and offset_w go together (one or two each), without offset")
        return steps, [(F32(y), F32(x)) for y, x in zip(p.offset_h, p.offset_w, strict=True)]
    return steps, [(F32(p.offset), F32(p.offset))]


def prior_boxes(p, feature_hw: tuple[int, int], image_hw: tuple[int, int],
                error: Callable[[str], BadInputError] = BadInputError) -> np.ndarray:
    """PriorBox's output for a PriorBoxParameter, a feature map and an image of these sizes, as
    OpenCV computes it (in float32, in its order): [1, 2, H*W*boxes*4], first each box's corners
    (xmin, ymin, xmax, ymax, over the image's size; for each position, row by row, each box at
    each offset), clipped to [0, 1] with clip, then the variances, the same four for every box
    (one value: all four; OpenCV needs one or four). The image size is the second bottom's, as in
    OpenCV (img_size, img_h and img_w are not read)."""
    widths, heights = _box_sizes(p, error)
    (step_y, step_x), offsets = _steps_and_offsets(p, error)
    variance = [F32(v) for v in p.variance]
    if len(variance) not in (1, 4) or not all(v > 0 for v in variance):
        raise error(f"variance takes one or four positive values, it has {[float(v) for v in variance]}")
    (fh, fw), (ih, iw) = feature_hw, image_hw
    step_y = step_y or F32(ih) / F32(fh)
    step_x = step_x or F32(iw) / F32(fw)
    rows = np.arange(fh, dtype=F32).reshape(fh, 1, 1, 1)
    cols = np.arange(fw, dtype=F32).reshape(1, fw, 1, 1)
    oy = np.array([o[0] for o in offsets], F32).reshape(1, 1, 1, -1)
    ox = np.array([o[1] for o in offsets], F32).reshape(1, 1, 1, -1)
    half_w = (np.array(widths, F32) * F32(0.5)).reshape(1, 1, -1, 1)
    half_h = (np.array(heights, F32) * F32(0.5)).reshape(1, 1, -1, 1)
    cx = np.broadcast_to((cols + ox) * step_x, (fh, fw, len(widths), len(offsets)))
    cy = np.broadcast_to((rows + oy) * step_y, (fh, fw, len(widths), len(offsets)))
    corners = np.stack([(cx - half_w) / F32(iw), (cy - half_h) / F32(ih),
                        (cx + half_w) / F32(iw), (cy + half_h) / F32(ih)], axis=-1).astype(F32).ravel()
    if p.clip:
        corners = np.clip(corners, F32(0), F32(1))
    variances = np.tile(np.array(variance * (4 // len(variance)), F32), corners.size // 4)
    return np.stack([corners, variances]).reshape(1, 2, -1)


def _prior_box(g: Graph, L: Layer) -> list[str]:
    """A constant: the boxes depend only on the two bottoms' sizes (the batch dim left out: one
    set of boxes for every sample, OpenCV's [1, 2, N] at any batch size)."""
    feature, image = L.shapes
    if len(feature) != 4 or len(image) != 4:
        raise L.error(f"PriorBox takes two 4-D NCHW bottoms, they are {feature} and {image}")
    if not all(isinstance(d, int) for d in [*feature[2:], *image[2:]]):
        raise L.error(f"the boxes need the fixed height and width of both bottoms, they are {feature} and {image} "
                      "(give them with --input)")
    boxes = prior_boxes(L.proto.prior_box_param, tuple(feature[2:]), tuple(image[2:]), L.error)
    return [g.node("Identity", [g.const(L.name, "priors", boxes)], list(boxes.shape), L.name)]


# the translations of this module by layer type (caffe_layers.CONVERTERS holds them all)
SSD: dict[str, Callable] = {"Normalize": _normalize, "PriorBox": _prior_box}
# layer types whose translation needs the inputs' spatial sizes fixed
FIXED_SIZES = {"PriorBox"}
