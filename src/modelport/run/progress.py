"""What a long command is doing right now, for the live display: the stage, and the tool inside it.

Stages are announced through the pipeline's `on_stage` callbacks; a third-party tool that works for
long inside a stage (torch.onnx.export, tf2onnx, onnx2tf, onnxsim) is announced with `doing(...)`,
so the display says "emit:tflite (onnx2tf) 12.3s" rather than staying on a stage that has ended.
A loop over a large model's tensors (writing, reading weights) names the tensor it is at with
`tick(...)`: "emit:onnx (writing model.layers.3.mlp.up_proj.weight 41/290) 8.2s".
Without a listener (the Python API, --quiet, no terminal) these calls cost nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

_listeners: list[Callable[[str | None], None]] = []
TICK_SECONDS = 0.1  # a loop's position is passed on at most this often (and always its first and last step)
_last_tick = 0.0


def activity(detail: str | None) -> None:
    """Announce what runs inside the current stage (None: nothing beyond the stage itself)."""
    for fn in list(_listeners):
        fn(detail)


def tick(verb: str, name: str, index: int, total: int) -> None:
    """Announce step `index` (from 0) of `total` of a loop: "{verb} {name} ({index + 1}/{total})"."""
    global _last_tick
    if not _listeners:
        return
    now = time.monotonic()
    if 0 < index < total - 1 and now - _last_tick < TICK_SECONDS:
        return
    _last_tick = now
    activity(f"{verb} {name} ({index + 1}/{total})")


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
