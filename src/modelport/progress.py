"""What a long command is doing right now, for the live display: the stage, and the tool inside it.

Stages are announced through the pipeline's `on_stage` callbacks; a third-party tool that works for
long inside a stage (torch.onnx.export, tf2onnx, onnx2tf, onnxsim) is announced with `doing(...)`,
so the display says "emit:tflite (onnx2tf) 12.3s" rather than staying on a stage that has ended.
Without a listener (the Python API, --quiet, no terminal) these calls cost nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

_listeners: list[Callable[[str | None], None]] = []


def activity(detail: str | None) -> None:
    """Announce what runs inside the current stage (None: nothing beyond the stage itself)."""
    for fn in list(_listeners):
        fn(detail)


@contextlib.contextmanager
def doing(detail: str) -> Iterator[None]:
    """Announce `detail` for the duration of the block."""
    activity(detail)
    try:
        yield
    finally:
        activity(None)


@contextlib.contextmanager
def listening(fn: Callable[[str | None], None]) -> Iterator[None]:
    _listeners.append(fn)
    try:
        yield
    finally:
        _listeners.remove(fn)
