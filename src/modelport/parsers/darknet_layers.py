"""Darknet sections translated to ONNX nodes (opset 17, NCHW), one function per section type, the
way OpenCV DNN's darknet importer reads them: OpenCV is the reference runtime of a Darknet source,
so where darknet and OpenCV differ (a shortcut's channels, a dropout's scale) OpenCV's reading is
the one translated.

- [convolutional]: Conv (`pad=1` means size/2, else `padding`), batch norm folded into the
  weights with darknet's eps 1e-6: W' = W·γ/√(σ²+ε), b' = β − μ·γ/√(σ²+ε).
- [maxpool]: MaxPool with darknet's asymmetric padding: `padding` (default size−1) split
  floor(p/2) before and ceil(p/2) after, so size=2 stride=1 keeps the size (yolov3-tiny).
- [route]: Identity or Concat of the listed layers, then the `group_id`-th of `groups` channel
  slices (yolov4-tiny). [shortcut]: alpha·previous + `from`, channels of the previous layer kept.
- [yolo]: OpenCV's region layer decode: per cell and anchor a row (x, y, w, h, objectness,
  class scores × objectness); x, y are ((σ(t) − 0.5)·scale_x_y + 0.5 + cell) / grid, w, h are
  exp(t)·anchor / image size (new_coords=1: raw t, and t²·4·anchor), and a class score not above
  `thresh` is 0. Rows are ordered cell by cell (row-major), anchor fastest: [batch, cells, 5 + C].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from modelport.errors import BadInputError

BN_EPS = 1e-6
ACTIVATIONS = ("linear", "leaky", "relu", "logistic", "swish", "mish")


@dataclass
class Section:
    """One cfg section: its index among the layers (the [net] section not counted), type and options."""

    index: int
    kind: str
    options: dict[str, str]
    line: int

    @property
    def where(self) -> str:
        return f"layer {self.index} [{self.kind}]"

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.options.get(key)
        if value is None:
            if default is None:
                raise BadInputError(f"{self.where} (line {self.line}) needs '{key}'")
            return default
        try:
            return int(value)
        except ValueError:
            raise BadInputError(f"{self.where} (line {self.line}): '{key}={value}' is not an integer") from None

    def real(self, key: str, default: float) -> float:
        value = self.options.get(key)
        if value is None:
            return default
        try:
            return float(value)
        except ValueError:
            raise BadInputError(f"{self.where} (line {self.line}): '{key}={value}' is not a number") from None

    def numbers(self, key: str, kind=int) -> list:
        value = self.options.get(key, "")
        try:
            return [kind(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise BadInputError(f"{self.where} (line {self.line}): '{key}={value}' is not a list of numbers") from None

    def word(self, key: str, default: str) -> str:
        return self.options.get(key, default).strip()


@dataclass
class Blob:
    """A layer's output: its tensor name and its shape past the batch ([C, H, W] or [N])."""

    name: str
    shape: tuple[int, ...]


@dataclass
class Graph:
    """The ONNX nodes and initializers built so far, and each layer's output."""

    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    layers: list[Blob] = field(default_factory=list)

    def const(self, name: str, value) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        """A node named `name`; its output tensor is `name:0` (the contract's output names stay free)."""
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [f"{name}:0"], name=name, **attrs))
        return f"{name}:0"


def weights_needed(section: Section, shape: tuple[int, ...]) -> list[tuple[str, int]]:
    """The tensors a section reads from the weights file, in file order: (what, float count)."""
    if section.kind == "convolutional":
        filters, size, groups = section.integer("filters"), section.integer("size"), section.integer("groups", 1)
        tensors = [("biases", filters)]
        if section.integer("batch_normalize", 0):
            tensors += [("scales", filters), ("rolling_mean", filters), ("rolling_variance", filters)]
        return [*tensors, ("weights", filters * (shape[0] // groups) * size * size)]
    if section.kind == "connected":
        out = section.integer("output", 1)
        tensors = [("biases", out)]
        if section.integer("batch_normalize", 0):
            tensors += [("scales", out), ("rolling_mean", out), ("rolling_variance", out)]
        return [*tensors, ("weights", out * int(np.prod(shape)))]
    return []


def _folded(weights: np.ndarray, blobs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Weights and bias with the batch norm (if any) folded in, in float64 and then back to float32."""
    if "scales" not in blobs:
        return weights, blobs["biases"]
    factor = blobs["scales"].astype(np.float64) / np.sqrt(blobs["rolling_variance"].astype(np.float64) + BN_EPS)
    w = weights.astype(np.float64) * factor.reshape(-1, *([1] * (weights.ndim - 1)))
    b = blobs["biases"].astype(np.float64) - blobs["rolling_mean"].astype(np.float64) * factor
    return w.astype(np.float32), b.astype(np.float32)


def _previous(g: Graph, s: Section, image: Blob) -> Blob:
    return g.layers[-1] if g.layers else image


def _spatial(s: Section, blob: Blob) -> tuple[int, int, int]:
    if len(blob.shape) != 3:
        raise BadInputError(f"{s.where} needs a [C, H, W] input, the layer before gives {list(blob.shape)}")
    return blob.shape


def convolutional(g: Graph, s: Section, image: Blob, blobs: dict[str, np.ndarray]) -> Blob:
    src = _previous(g, s, image)
    c, h, w = _spatial(s, src)
    filters, size, stride, groups = s.integer("filters"), s.integer("size"), s.integer("stride", 1), s.integer("groups", 1)
    pad = size // 2 if s.integer("pad", 0) else s.integer("padding", 0)
    if filters <= 0 or size <= 0 or stride <= 0 or groups <= 0 or c % groups or filters % groups:
        raise BadInputError(f"{s.where}: filters={filters} size={size} stride={stride} groups={groups} do not fit "
                            f"{c} input channels")
    weights, bias = _folded(blobs["weights"].reshape(filters, c // groups, size, size), blobs)
    name = f"conv_{s.index}"
    wname, bname = g.const(f"{name}.weight", weights), g.const(f"{name}.bias", bias)
    out = g.node("Conv", [src.name, wname, bname], name, kernel_shape=[size, size], strides=[stride, stride],
                 pads=[pad] * 4, group=groups)
    return Blob(out, (filters, (h + 2 * pad - size) // stride + 1, (w + 2 * pad - size) // stride + 1))


def connected(g: Graph, s: Section, image: Blob, blobs: dict[str, np.ndarray]) -> Blob:
    src = _previous(g, s, image)
    out_n = s.integer("output", 1)
    n = int(np.prod(src.shape))
    weights, bias = _folded(blobs["weights"].reshape(out_n, n), blobs)
    name = f"fullyConnected_{s.index}"
    flat = g.node("Flatten", [src.name], f"{name}/flat", axis=1) if len(src.shape) != 1 else src.name
    out = g.node("Gemm", [flat, g.const(f"{name}.weight", weights), g.const(f"{name}.bias", bias)], name, transB=1)
    return Blob(out, (out_n,))


def maxpool(g: Graph, s: Section, image: Blob, blobs) -> Blob:
    src = _previous(g, s, image)
    c, h, w = _spatial(s, src)
    size, stride = s.integer("size", 2), s.integer("stride", 2)
    padding = s.integer("padding", size - 1)
    if size <= 0 or stride <= 0 or padding < 0 or padding >= 2 * size:
        raise BadInputError(f"{s.where}: size={size} stride={stride} padding={padding} has no translation")
    before, after = padding // 2, padding - padding // 2
    out = g.node("MaxPool", [src.name], f"pool_{s.index}", kernel_shape=[size, size], strides=[stride, stride],
                 pads=[before, before, after, after])
    return Blob(out, (c, (h + padding - size) // stride + 1, (w + padding - size) // stride + 1))


def avgpool(g: Graph, s: Section, image: Blob, blobs) -> Blob:
    src = _previous(g, s, image)
    c, _, _ = _spatial(s, src)
    return Blob(g.node("GlobalAveragePool", [src.name], f"avgpool_{s.index}"), (c, 1, 1))


def softmax(g: Graph, s: Section, image: Blob, blobs) -> Blob:
    src = _previous(g, s, image)
    if s.integer("groups", 1) != 1:
        raise BadInputError(f"{s.where}: groups={s.integer('groups')} has no translation (OpenCV takes groups=1 only)")
    return Blob(g.node("Softmax", [src.name], f"softmax_{s.index}", axis=1), src.shape)


def dropout(g: Graph, s: Section, image: Blob, blobs) -> Blob:
    src = _previous(g, s, image)
    return Blob(g.node("Identity", [src.name], f"identity_{s.index}"), src.shape)


def _absolute(s: Section, index: int, count: int) -> int:
    """A layer reference (negative: relative to this layer) as an index of an earlier layer."""
    target = index + s.index if index < 0 else index
    if not 0 <= target < s.index or target >= count:
        raise BadInputError(f"{s.where} refers to layer {index}, which is not an earlier layer")
    return target


def route(g: Graph, s: Section, image: Blob, blobs) -> Blob:
    refs = s.numbers("layers")
    if not refs:
        raise BadInputError(f"{s.where} (line {s.line}) needs 'layers'")
    sources = [g.layers[_absolute(s, r, len(g.layers))] for r in refs]
    if any(len(b.shape) != 3 or b.shape[1:] != sources[0].shape[1:] for b in sources):
        raise BadInputError(f"{s.where}: layers {refs} have shapes {[list(b.shape) for b in sources]}, which do not "
                            "concatenate on channels")
    name = f"route_{s.index}"
    channels = sum(b.shape[0] for b in sources)
    if len(sources) == 1:
        out = g.node("Identity", [sources[0].name], f"{name}/in")
    else:
        out = g.node("Concat", [b.name for b in sources], f"{name}/in", axis=1)
    groups, group_id = s.integer("groups", 1), s.integer("group_id", 0)
    if groups <= 0 or channels % groups or not 0 <= group_id < groups:
        raise BadInputError(f"{s.where}: groups={groups} group_id={group_id} do not fit {channels} channels")
    part = channels // groups
    if groups > 1:
        starts, ends = g.const(f"{name}/starts", np.array([group_id * part])), g.const(f"{name}/ends", np.array([(group_id + 1) * part]))
        out = g.node("Slice", [out, starts, ends, g.const(f"{name}/axes", np.array([1]))], f"{name}/slice")
    return Blob(g.node("Identity", [out], name), (part, *sources[0].shape[1:]))


def shortcut(g: Graph, s: Section, image: Blob, blobs) -> Blob:
    src = _previous(g, s, image)
    text = s.options.get("from", "").strip()
    if not text or "," in text:
        raise BadInputError(f"{s.where} (line {s.line}): from={text or '(missing)'} has no translation (one layer only)")
    other = g.layers[_absolute(s, s.integer("from"), len(g.layers))]
    if s.real("beta", 0.0) != 0 or s.word("weights_type", "none") != "none":
        raise BadInputError(f"{s.where}: a weighted shortcut (beta, weights_type) has no translation")
    if len(src.shape) != 3 or len(other.shape) != 3 or src.shape[1:] != other.shape[1:]:
        raise BadInputError(f"{s.where}: layer shapes {list(src.shape)} and {list(other.shape)} do not add")
    name = f"shortcut_{s.index}"
    first, added = src.name, other.name
    alpha = s.real("alpha", 1.0)
    if alpha != 1.0:
        first = g.node("Mul", [first, g.const(f"{name}/alpha", np.array(alpha, np.float32))], f"{name}/scaled")
    c, extra = src.shape[0], other.shape[0] - src.shape[0]
    if extra > 0:  # OpenCV keeps the previous layer's channels: the rest of `from` is dropped
        added = g.node("Slice", [added, g.const(f"{name}/s", np.array([0])), g.const(f"{name}/e", np.array([c])),
                                 g.const(f"{name}/a", np.array([1]))], f"{name}/from")
    elif extra < 0:  # ... and `from` adds to its first channels only
        added = g.node("Pad", [added, g.const(f"{name}/pads", np.array([0, 0, 0, 0, 0, -extra, 0, 0]))], f"{name}/from")
    return Blob(g.node("Add", [first, added], name), src.shape)


def upsample(g: Graph, s: Section, image: Blob, blobs) -> Blob:
    src = _previous(g, s, image)
    c, h, w = _spatial(s, src)
    stride = s.integer("stride", 1)
    if stride <= 0 or s.real("scale", 1.0) != 1.0:
        raise BadInputError(f"{s.where}: stride={stride} scale={s.options.get('scale', 1)} has no translation")
    name = f"upsample_{s.index}"
    scales = g.const(f"{name}/scales", np.array([1, 1, stride, stride], np.float32))
    out = g.node("Resize", [src.name, "", scales], name, mode="nearest", coordinate_transformation_mode="asymmetric",
                 nearest_mode="floor")
    return Blob(out, (c, h * stride, w * stride))


def yolo(g: Graph, s: Section, image: Blob, blobs) -> Blob:
    src = _previous(g, s, image)
    c, rows, cols = _spatial(s, src)
    classes, num = s.integer("classes", -1), s.integer("num", -1)
    anchors, mask = s.numbers("anchors", float), s.numbers("mask")
    if classes <= 0 or num <= 0 or len(anchors) != 2 * num or not mask or any(not 0 <= m < num for m in mask):
        raise BadInputError(f"{s.where}: classes={classes} num={num} with {len(anchors)} anchor values and mask "
                            f"{mask} do not describe a yolo layer")
    if c != (5 + classes) * len(mask):
        raise BadInputError(f"{s.where}: the layer before gives {c} channels, a yolo layer of {len(mask)} anchors and "
                            f"{classes} classes takes {(5 + classes) * len(mask)}")
    if s.real("nms_threshold", 0.0) > 0:
        raise BadInputError(f"{s.where}: nms_threshold={s.options['nms_threshold']} (OpenCV's suppression inside the "
                            "layer) has no translation; set it to 0 and suppress after the model")
    new_coords = s.integer("new_coords", 0)
    if new_coords not in (0, 1):
        raise BadInputError(f"{s.where}: new_coords={new_coords} has no translation")
    used = np.array([anchors[2 * m: 2 * m + 2] for m in mask], np.float32)
    _, img_h, img_w = image.shape
    return Blob(_decode(g, f"yolo_{s.index}", src.name, rows, cols, used, classes, thresh=s.real("thresh", 0.2),
                        scale_xy=s.real("scale_x_y", 1.0), new_coords=bool(new_coords), norm=(img_w, img_h)),
                (rows * cols * len(mask), 5 + classes))


def _decode(g: Graph, name: str, x: str, rows: int, cols: int, anchors: np.ndarray, classes: int, *, thresh: float,
            scale_xy: float, new_coords: bool, norm: tuple[int, int]) -> str:
    """OpenCV's region-layer decode of one head as ONNX nodes (the module docstring gives the math)."""
    a = len(anchors)
    cells = rows * cols * a
    nhwc = g.node("Transpose", [x], f"{name}/nhwc", perm=[0, 2, 3, 1])
    t = g.node("Reshape", [nhwc, g.const(f"{name}/shape", np.array([0, cells, 5 + classes]))], f"{name}/rows")
    split = g.const(f"{name}/split", np.array([2, 2, 1, classes]))
    parts = [f"{name}/{p}" for p in ("txy", "twh", "tobj", "tcls")]
    from onnx import helper

    g.nodes.append(helper.make_node("Split", [t, split], parts, name=f"{name}/split", axis=2))
    txy, twh, tobj, tcls = parts
    yy, xx = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    grid = np.repeat(np.stack([xx, yy], -1).reshape(-1, 1, 2), a, axis=1).reshape(1, cells, 2).astype(np.float32)
    prior = np.tile(anchors, (rows * cols, 1)).reshape(1, cells, 2)
    half = g.const(f"{name}/half", np.array(0.5, np.float32))
    xy = txy if new_coords else g.node("Sigmoid", [txy], f"{name}/sxy")
    xy = g.node("Sub", [xy, half], f"{name}/xy0")
    xy = g.node("Mul", [xy, g.const(f"{name}/scale_xy", np.array(scale_xy, np.float32))], f"{name}/xy1")
    xy = g.node("Add", [xy, half], f"{name}/xy2")
    xy = g.node("Add", [xy, g.const(f"{name}/grid", grid)], f"{name}/xy3")
    xy = g.node("Div", [xy, g.const(f"{name}/cells", np.array([cols, rows], np.float32))], f"{name}/xy")
    if new_coords:
        wh = g.node("Mul", [twh, twh], f"{name}/wh0")
        wh = g.node("Mul", [wh, g.const(f"{name}/four", np.array(4, np.float32))], f"{name}/wh1")
    else:
        wh = g.node("Exp", [twh], f"{name}/wh1")
    wh = g.node("Mul", [wh, g.const(f"{name}/anchors", prior)], f"{name}/wh2")
    wh = g.node("Div", [wh, g.const(f"{name}/image", np.array(norm, np.float32))], f"{name}/wh")
    obj = tobj if new_coords else g.node("Sigmoid", [tobj], f"{name}/obj")
    cls = tcls if new_coords else g.node("Sigmoid", [tcls], f"{name}/cls0")
    prob = g.node("Mul", [obj, cls], f"{name}/prob")
    keep = g.node("Greater", [prob, g.const(f"{name}/thresh", np.array(thresh, np.float32))], f"{name}/keep")
    cls = g.node("Where", [keep, prob, g.const(f"{name}/zero", np.array(0, np.float32))], f"{name}/cls")
    return g.node("Concat", [xy, wh, obj, cls], name, axis=2)


def activation(g: Graph, s: Section, blob: Blob) -> Blob:
    """The section's `activation` applied to its output (OpenCV applies it after any section)."""
    kind = s.word("activation", "linear")
    if kind == "linear":
        return blob
    name = f"{blob.name}/{kind}"
    if kind == "leaky":
        out = g.node("LeakyRelu", [blob.name], name, alpha=0.1)
    elif kind == "relu":
        out = g.node("Relu", [blob.name], name)
    elif kind == "logistic":
        out = g.node("Sigmoid", [blob.name], name)
    elif kind == "swish":
        out = g.node("Mul", [blob.name, g.node("Sigmoid", [blob.name], f"{name}/sigmoid")], name)
    elif kind == "mish":
        soft = g.node("Softplus", [blob.name], f"{name}/softplus")
        out = g.node("Mul", [blob.name, g.node("Tanh", [soft], f"{name}/tanh")], name)
    else:
        raise BadInputError(f"{s.where}: activation={kind} has no translation (known: {', '.join(ACTIVATIONS)})")
    return Blob(out, blob.shape)


# section type -> translation (weights, where a section has them, come in `blobs`)
TRANSLATIONS = {
    "convolutional": convolutional, "connected": connected, "maxpool": maxpool, "avgpool": avgpool,
    "softmax": softmax, "dropout": dropout, "route": route, "shortcut": shortcut, "upsample": upsample,
    "yolo": yolo,
}
