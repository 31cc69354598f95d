"""What the TorchServe handler installs into the server image: one table of exact pins.

The Dockerfile builds on `pytorch/torchserve:0.12.0-cpu` / `-gpu`. Those images come from
TorchServe's `docker/build_image.sh` at v0.12.0 with its defaults: Ubuntu 20.04 (glibc 2.31),
Python 3.9 (`PYTHON_VERSION=3.9`) in `/home/venv`, torch 2.4.0 (`requirements/torch_linux.txt`,
`+cu121` on the GPU image). The handler's requirements are pinned to versions that have wheels
for that Python and platform, never to whatever this machine has installed: numpy 2.1 and later
need Python 3.10, onnxruntime 1.20 and later have no Python 3.9 wheels.

`bench/check_torchserve_pins.py` (`make check-pins`) proves the table with pip's resolver for that
Python and platform (`pip install --dry-run --python-version 3.9 --only-binary=:all: ...`); the
test suite checks that the bundles' requirements are exactly this table.
"""

from __future__ import annotations

IMAGE_PYTHON = "3.9"
IMAGE_TORCH = "2.4.0"
# glibc 2.31 (Ubuntu 20.04) runs manylinux wheels up to manylinux_2_31
IMAGE_PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                   "manylinux_2_17_x86_64", "manylinux2014_x86_64")

# (handler runtime, device) -> {distribution: exact version}
HANDLER_PINS: dict[tuple[str, str], dict[str, str]] = {
    ("onnxruntime", "cpu"): {"onnxruntime": "1.19.2", "numpy": "2.0.2"},
    ("onnxruntime", "gpu"): {"onnxruntime-gpu": "1.19.2", "numpy": "2.0.2"},  # CUDA 12 builds, as the cu121 image
    ("torch", "cpu"): {"safetensors": "0.7.0", "numpy": "2.0.2"},
    ("torch", "gpu"): {"safetensors": "0.7.0", "numpy": "2.0.2"},
}

# What onnxruntime 1.19 loads: ONNX IR version 10 (onnx 1.16) and ai.onnx opsets up to 21
ONNXRUNTIME_MAX_IR = 10
ONNXRUNTIME_MAX_OPSET = 21


def pins(runtime: str, device: str = "cpu") -> dict[str, str]:
    return dict(HANDLER_PINS[(runtime, "gpu" if device == "gpu" else "cpu")])
