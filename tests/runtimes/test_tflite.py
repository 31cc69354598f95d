"""The LiteRT runner: inputs matched by name whatever the feed order, per-input transposes."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.errors import BadInputError


@pytest.fixture(scope="module")
def two_input_tflite(tmp_path_factory):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, 4, 2], tf.float32, name="a"), tf.TensorSpec([None, 2], tf.float32, name="b")])
    def f(a, b):
        return {"y": tf.reduce_sum(a, axis=1) * 10.0 + b}

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()])
    path = tmp_path_factory.mktemp("tfl") / "two.tflite"
    path.write_bytes(conv.convert())
    return path


def test_feed_order_and_transpose(two_input_tflite):
    from modelport.runtimes import get_runner

    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4, 2)).astype(np.float32)
    b = rng.standard_normal((3, 2)).astype(np.float32)
    expected = a.sum(axis=1) * 10 + b
    r = get_runner("tflite", two_input_tflite)
    for feeds in ({"a": a, "b": b}, {"b": b, "a": a}):
        np.testing.assert_allclose(next(iter(r.run(feeds).values())), expected, rtol=1e-5)
    # the caller holds `a` as (batch, 2, 4): the runner transposes that input only
    r = get_runner("tflite", two_input_tflite, input_transpose={"a": [0, 2, 1]})
    out = r.run({"b": b, "a": np.ascontiguousarray(a.transpose(0, 2, 1))})
    np.testing.assert_allclose(next(iter(out.values())), expected, rtol=1e-5)


def test_wrong_input_count(two_input_tflite):
    from modelport.runtimes import get_runner

    with pytest.raises(BadInputError, match="takes 2"):
        get_runner("tflite", two_input_tflite).run({"x": np.zeros((1, 2), np.float32)})
