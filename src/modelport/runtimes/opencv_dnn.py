"""OpenCV's DNN module as a runner: the reference runtime of Caffe and Darknet sources.

OpenCV reads both formats itself (`cv2.dnn.readNetFromCaffe`, `readNetFromDarknet`; 5.0 dropped
both readers, 4.14 has them: the `opencv` extra pins it). The net runs on OpenCV's own CPU
backend at fp32, one input blob per name; outputs come back under the names asked for, which are
the layers' names in the source file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import MissingDependencyError
from modelport.ir import TensorSpec
from modelport.runtimes.base import Runner

READERS = {"caffe": "readNetFromCaffe", "darknet": "readNetFromDarknet"}


def load_net(kind: str, network: Path, weights: Path):
    """An OpenCV DNN net of `kind` ('caffe' or 'darknet') from its network file and its weights,
    on OpenCV's CPU backend at fp32."""

    cv2 = require("cv2", purpose=f"{kind.capitalize()} sources (OpenCV DNN is their reference runtime)")
    reader = getattr(cv2.dnn, READERS[kind], None)
    if reader is None:  # OpenCV 5 has neither reader

        raise MissingDependencyError(f"OpenCV {cv2.__version__} has no {READERS[kind]} (5.0 dropped it)",
                                     hint='pip install "modelport[opencv]" (opencv-python-headless 4.14)')
    net = reader(str(network), str(weights))
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    return net


class OpenCVRunner(Runner):
    """A loaded OpenCV DNN net: `inputs` are the contract's input specs (their names are the net's
    input names, in order), `outputs` the layer names whose blobs are the model's outputs."""

    name = "opencv"
    distribution = "opencv-python-headless"
    imports = ("cv2",)

    def __init__(self, net, inputs: list[TensorSpec], outputs: list[str], *,
                 rename: Callable[[str], str] | None = None):
        self.net = net
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.rename = rename or (lambda name: name)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for spec in self.inputs:
            self.net.setInput(np.ascontiguousarray(feeds[spec.name], dtype=np.float32), spec.name)
        blobs = self.net.forward(self.outputs)
        return {self.rename(name): np.array(blob) for name, blob in zip(self.outputs, blobs, strict=True)}

    def input_specs(self) -> list[TensorSpec]:
        return list(self.inputs)
