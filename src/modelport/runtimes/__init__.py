"""Runners: every runtime exposes `run(feeds: dict[str, ndarray]) -> dict[str, ndarray]`.

Parity checks, `validate` and benchmarks all go through this one interface. Runners are looked
up by name and imported lazily, so a missing runtime costs nothing until it is asked for.
"""

from __future__ import annotations

import importlib
from typing import Protocol

import numpy as np

from modelport.errors import BadInputError


class Runner(Protocol):
    name: str

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


# runtime name -> "module:factory"; the factory takes the model (object or path) and options.
RUNNERS: dict[str, str] = {
    "onnxruntime": "modelport.runtimes.onnxruntime:OnnxRuntimeRunner",
    "torch": "modelport.runtimes.torch:TorchRunner",
    "tflite": "modelport.runtimes.tflite:TFLiteRunner",
    "torch_source": "modelport.runtimes.torch_source:TorchSourceRunner",
    "tensorrt": "modelport.runtimes.tensorrt:TensorRTRunner",
}


def register_runner(name: str, target: str) -> None:
    if name in RUNNERS and RUNNERS[name] != target:
        raise ValueError(f"runner '{name}' is already registered as {RUNNERS[name]}")
    RUNNERS[name] = target


def get_runner(name: str, model, **options) -> Runner:
    try:
        target = RUNNERS[name]
    except KeyError:
        raise BadInputError(f"unknown runtime '{name}'; known: {sorted(RUNNERS)}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)(model, **options)
