"""tf_common: tf2onnx's graph optimizers run with the graphs they replaced freed first
(optimizers_collecting), and the optimizer table and the collector are left as they were."""

from __future__ import annotations

import gc
import weakref

import pytest

from modelport.parsers.tf_common import import_tf2onnx, optimizers_collecting


class Node:
    """A stand-in for a graph tf2onnx's optimizers replaced: a cycle only a full collection frees."""

    def __init__(self):
        self.graph = self


def test_each_optimizer_starts_on_a_full_collection():
    import_tf2onnx()
    from tf2onnx import optimizer

    listed = optimizer._get_optimizers
    names = list(listed())
    gc.disable()  # no automatic collection: only the optimizer's start may free the cycle
    try:
        with optimizers_collecting():
            table = optimizer._get_optimizers()
            assert list(table) == names
            dead = Node()
            ref = weakref.ref(dead)
            del dead
            assert ref() is not None
            started = table[names[0]]()
            assert ref() is None
            assert type(started) is listed()[names[0]]
    finally:
        gc.enable()
    assert optimizer._get_optimizers is listed
    assert gc.get_freeze_count() == 0


def test_the_table_and_the_collector_are_restored_when_the_conversion_fails():
    import_tf2onnx()
    from tf2onnx import optimizer

    listed = optimizer._get_optimizers
    with pytest.raises(RuntimeError, match="conversion failed"), optimizers_collecting():
        assert gc.get_freeze_count() > 0
        raise RuntimeError("conversion failed")
    assert optimizer._get_optimizers is listed
    assert gc.get_freeze_count() == 0
