"""Calibration data for static INT8 quantisation.

Two forms the user gives (`--calibration`):
- an `.npz` holding one array per model input, keyed by input name. An array with the input's
  rank is split along axis 0 into samples of the model's batch size (1 when the batch is dynamic);
  an array with one more axis than the input is a stack of ready samples.
- a folder of images (`.png`, `.jpg`, `.jpeg`, `.bmp`; names starting with "." are skipped) for
  a model with one 4-D float input laid out NCHW or NHWC (the input's `layout`; NCHW when none).
  Each image is read as 8-bit RGB (palette and grayscale expanded, alpha dropped; grayscale for a
  one-channel input; 16-bit and float images are refused), channels reversed to BGR when the
  input's preprocessing says so, resized (bilinear) to the input's height and width, scaled by
  the input's `scale` (default 1/255), minus `mean` and divided by `std` when given (one value,
  or one per channel in the input's channel order), and laid out as the input's layout.
  A dynamic height or width takes its size from the sample dims (`--dim NAME=SIZE`, or a concrete
  `--input` shape); with neither, the folder is refused rather than calibrating at a guessed size.
  A fixed batch of N stacks N images per sample (a remainder is dropped); a dynamic batch is 1.
  At most `MAX_IMAGES` images are used, in sorted name order.

Without either, `--optimize auto` calibrates its static INT8 candidate on `sample_calibration`:
input sets drawn like the reference's sample inputs, none of them the reference's own, so the
candidate is judged on inputs it was not calibrated on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError, UnsafeInputError
from modelport.ir import IRModel
from modelport.reference.samples import bind_dims, make_inputs

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}
FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64"}
MAX_IMAGES = 256


def load_calibration(source: str | Path | None, ir: IRModel) -> list[dict[str, np.ndarray]]:
    if not source:
        raise BadInputError("static INT8 quantisation needs calibration data", hint="pass --calibration DATA.npz or an image folder")
    path = Path(source)
    if path.is_dir():
        return _images(path, ir)
    if path.suffix.lower() == ".npz" and path.is_file():
        return _npz(path, ir)
    raise BadInputError("calibration data must be an .npz file or a folder of images", path=path)


SAMPLE_SETS = 8


def sample_calibration(ir: IRModel, count: int = SAMPLE_SETS) -> list[dict[str, np.ndarray]]:
    """`count` input sets drawn like the reference's samples (`samples.make_inputs`, variants the
    reference and its second set do not use), at the reference's shapes. An input the reference
    holds constant (a value pinned with `--value`, a mask of ones) keeps the reference's array: a
    random value there could be one the model cannot take."""

    ref = ir.reference.inputs if ir.reference is not None else {}
    dims = bind_dims(ir.inputs, ref, ir.sample_dims)
    sets = []
    for k in range(count):
        feeds = make_inputs(ir.inputs, dims, variant=2 + k)
        for name, value in ref.items():
            value = np.asarray(value)
            if name in feeds and (value.size == 0 or (value == value.flat[0]).all()):
                feeds[name] = value
        sets.append(feeds)
    return sets


def _npz(path: Path, ir: IRModel) -> list[dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise BadInputError(f"cannot read calibration data: {e}", path=path) from None
    missing = [s.name for s in ir.inputs if s.name not in arrays]
    if missing:
        raise BadInputError(f"calibration data lacks inputs {missing} (it has {sorted(arrays)})", path=path)
    per_input: dict[str, list[np.ndarray]] = {}
    for spec in ir.inputs:
        a = arrays[spec.name]
        rank = len(spec.shape)
        if a.ndim == rank + 1:
            samples = [a[i] for i in range(a.shape[0])]
        elif a.ndim == rank:
            b = spec.shape[0] if rank and isinstance(spec.shape[0], int) else 1
            samples = [a[i:i + b] for i in range(0, a.shape[0] - b + 1, b)] if rank else [a]
        else:
            raise BadInputError(f"calibration array '{spec.name}' has rank {a.ndim}; the input has rank {rank}", path=path)
        per_input[spec.name] = [s.astype(spec.dtype if spec.dtype != "bfloat16" else "float32") for s in samples]
    n = min(len(v) for v in per_input.values())
    if n == 0:
        raise BadInputError("calibration data holds no samples", path=path)
    return [{k: v[i] for k, v in per_input.items()} for i in range(n)]


def _describe(ir: IRModel) -> str:
    return ", ".join(f"{s.name} {s.dtype} {list(s.shape)}" for s in ir.inputs) or "none"


def _image_geometry(folder: Path, ir: IRModel):
    """(spec, layout, batch, channels, height, width) of the one image input, or BadInputError."""
    specs = ir.inputs
    if len(specs) != 1 or specs[0].dtype not in FLOAT_DTYPES or len(specs[0].shape) != 4:
        raise BadInputError(f"image calibration needs a model with one 4-D float input; this model's inputs are "
                            f"{_describe(ir)}", path=folder, hint="give an .npz of named inputs instead")
    spec = specs[0]
    layout = spec.layout or "NCHW"
    if layout not in ("NCHW", "NHWC"):
        raise BadInputError(f"image calibration needs an NCHW or NHWC input; '{spec.name}' is {layout}", path=folder)
    n_ax, c_ax, h_ax, w_ax = (0, 1, 2, 3) if layout == "NCHW" else (0, 3, 1, 2)
    size = {}
    for axis, what in ((h_ax, "height"), (w_ax, "width")):
        d = spec.shape[axis]
        if isinstance(d, str):
            if d not in ir.sample_dims:
                example = ["1", "3", "224", "224"] if layout == "NCHW" else ["1", "224", "224", "3"]
                raise BadInputError(f"input '{spec.name}' has a dynamic {what} ('{d}'); image calibration needs a size",
                                    path=folder, hint=f"pass --dim {d}=SIZE or --input {spec.name}:{'x'.join(example)}")
            d = ir.sample_dims[d]
        size[what] = int(d)
    c = spec.shape[c_ax]
    channels = int(ir.sample_dims.get(c, 3)) if isinstance(c, str) else c
    if channels not in (1, 3):
        raise BadInputError(f"image calibration needs 1 or 3 channels; input '{spec.name}' has {channels}", path=folder)
    batch = spec.shape[n_ax] if isinstance(spec.shape[n_ax], int) else 1
    return spec, layout, batch, channels, size["height"], size["width"]


def _channel_values(values, channels: int, what: str, folder: Path) -> np.ndarray | None:
    if not values:
        return None
    if len(values) not in (1, channels):
        raise BadInputError(f"preprocessing {what} has {len(values)} values; the input has {channels} channels", path=folder)
    return np.asarray(values, np.float32)


def image_files(folder: Path) -> list[Path]:
    """The calibration images of `folder`, sorted by name, at most `MAX_IMAGES`."""
    try:
        files = [p for p in folder.iterdir()
                 if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") and p.is_file()]
    except OSError as e:
        raise BadInputError(f"cannot list the calibration folder: {e.strerror or e}", path=folder) from None
    return sorted(files)[:MAX_IMAGES]


def _images(folder: Path, ir: IRModel) -> list[dict[str, np.ndarray]]:

    image_mod = require("PIL.Image", purpose="image calibration data")
    spec, layout, batch, channels, h, w = _image_geometry(folder, ir)
    files = image_files(folder)
    if not files:
        raise BadInputError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in the calibration folder", path=folder)
    if len(files) < batch:
        raise BadInputError(f"{len(files)} images for a fixed batch of {batch}: calibration needs at least {batch}",
                            path=folder)
    pre = spec.preprocess
    scale = pre.scale if pre and pre.scale is not None else 1.0 / 255.0
    mean = _channel_values(pre.mean if pre else None, channels, "mean", folder)
    std = _channel_values(pre.std if pre else None, channels, "std", folder)
    bgr = bool(pre and pre.channel_order == "BGR" and channels == 3)
    dtype = spec.dtype if spec.dtype != "bfloat16" else "float32"
    images = []
    for f in files[:len(files) // batch * batch]:
        try:
            with image_mod.open(f) as im:
                if im.mode in ("I", "F") or im.mode.startswith("I;"):
                    raise BadInputError(f"calibration image is {im.mode} (16-bit or float); give 8-bit images", path=f)
                im = im.convert("L" if channels == 1 else "RGB").resize((w, h), image_mod.BILINEAR)
                arr = np.asarray(im, dtype=np.float32).reshape(h, w, channels)
        except image_mod.DecompressionBombError as e:
            raise UnsafeInputError(f"calibration image refused: {e}", path=f) from None
        except (OSError, ValueError, SyntaxError) as e:
            raise BadInputError(f"cannot read calibration image: {e}", path=f) from None
        if bgr:
            arr = arr[..., ::-1]
        arr = arr * np.float32(scale)
        if mean is not None:
            arr = arr - mean
        if std is not None:
            arr = arr / std
        images.append(arr.transpose(2, 0, 1) if layout == "NCHW" else arr)
    return [{spec.name: np.ascontiguousarray(np.stack(images[i:i + batch])).astype(dtype)}
            for i in range(0, len(images), batch)]
