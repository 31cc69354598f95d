"""Calibration data for static INT8 quantisation.

Two forms:
- an `.npz` holding one array per model input, keyed by input name. An array with the input's
  rank is split along axis 0 into samples of the model's batch size (1 when the batch is dynamic);
  an array with one more axis than the input is a stack of ready samples.
- a folder of images (`.png`, `.jpg`, `.jpeg`, `.bmp`) for a model with one 4-D float input:
  each image is read as RGB (BGR when the input's preprocessing says so), resized (bilinear) to
  the input's height and width, scaled by the input's `scale` (default 1/255), normalised with
  its `mean`/`std` when given, and laid out as NCHW (or NHWC when the input's layout says so).
  At most `MAX_IMAGES` images are used, in sorted name order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.errors import BadInputError
from modelport.ir import IRModel

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}
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


def _images(folder: Path, ir: IRModel) -> list[dict[str, np.ndarray]]:
    from modelport.deps import require

    image_mod = require("PIL.Image", purpose="image calibration data")
    floats = [s for s in ir.inputs if s.dtype.startswith("float")]
    if len(ir.inputs) != 1 or len(floats) != 1 or len(floats[0].shape) != 4:
        raise BadInputError("image calibration needs a model with one 4-D float input; give an .npz instead", path=folder)
    spec = floats[0]
    layout = spec.layout or "NCHW"
    dims = spec.concrete_shape(ir.sample_dims, default=1)
    h, w = (dims[2], dims[3]) if layout == "NCHW" else (dims[1], dims[2])
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())[:MAX_IMAGES]
    if not files:
        raise BadInputError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in the calibration folder", path=folder)
    pre = spec.preprocess
    scale = pre.scale if pre and pre.scale is not None else 1.0 / 255.0
    samples = []
    for f in files:
        try:
            with image_mod.open(f) as im:
                arr = np.asarray(im.convert("RGB").resize((w, h), image_mod.BILINEAR), dtype=np.float32)
        except OSError as e:
            raise BadInputError(f"cannot read calibration image: {e}", path=f) from None
        if pre and pre.channel_order == "BGR":
            arr = arr[..., ::-1]
        arr = arr * scale
        if pre and pre.mean:
            arr = arr - np.asarray(pre.mean, np.float32)
        if pre and pre.std:
            arr = arr / np.asarray(pre.std, np.float32)
        if layout == "NCHW":
            arr = arr.transpose(2, 0, 1)
        samples.append({spec.name: np.ascontiguousarray(arr[None]).astype(spec.dtype)})
    return samples
