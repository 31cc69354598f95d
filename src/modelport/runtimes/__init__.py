"""Runners: every runtime exposes `run(feeds: dict[str, ndarray]) -> dict[str, ndarray]` and
`input_specs() -> list[TensorSpec]` (what to feed it; dynamic dims symbolic).

Parity checks, `validate` and benchmarks all go through this one interface. Runners are looked
up by name and imported lazily, so a missing runtime costs nothing until it is asked for.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from modelport.ir import TensorSpec
from modelport.registry import Registry


class Runner(Protocol):
    name: str

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def input_specs(self) -> list[TensorSpec]: ...


# runtime name -> "module:factory"; the factory takes the model (object or path) and options.
RUNNERS = Registry("runtime", {
    "onnxruntime": "modelport.runtimes.onnxruntime:OnnxRuntimeRunner",
    "torch": "modelport.runtimes.torch:TorchRunner",
    "tflite": "modelport.runtimes.tflite:TFLiteRunner",
    "torch_source": "modelport.runtimes.torch_source:TorchSourceRunner",
    "tensorrt": "modelport.runtimes.tensorrt:TensorRTRunner",
    "savedmodel": "modelport.runtimes.savedmodel:SavedModelRunner",
    "openvino": "modelport.runtimes.openvino:OpenVINORunner",
})
register_runner = RUNNERS.register


def get_runner(name: str, model, **options) -> Runner:
    return RUNNERS.load(name)(model, **options)
