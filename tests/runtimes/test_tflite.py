"""The LiteRT runner: by signature where asked, else inputs matched by name whatever the feed order, per-input transposes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelport.errors import BadInputError
from modelport.runtimes.tflite import TFLiteRunner
from tests.tflite_models import write_int8_io_tflite, write_two_input_tflite


@pytest.fixture(scope="module")
def two_input_tflite(tmp_path_factory):
    return write_two_input_tflite(tmp_path_factory.mktemp("tfl") / "two.tflite")


def test_feed_order_and_transpose(two_input_tflite):
    from modelport.runtimes import get_runner

    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4, 2)).astype(np.float32)
    b = rng.standard_normal((3, 2)).astype(np.float32)
    expected = a.sum(axis=1) * 10 + b
    r = get_runner("tflite", two_input_tflite)
    assert r.signatures == {}  # a file without a SignatureDef runs by its tensors' names
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


def test_int8_io_quantised_by_the_runner(tmp_path):
    """A full-integer file with int8 I/O (TF's converter): float feeds are quantised with the input's
    scale/zero point, outputs dequantised, and describe() reports both dtypes."""
    from modelport.runtimes import get_runner

    r = get_runner("tflite", write_int8_io_tflite(tmp_path / "q.tflite"))
    info = r.describe()
    (i,), (o,) = info["inputs"], info["outputs"]
    assert (i["tensor_dtype"], i["dtype"], o["tensor_dtype"], o["dtype"]) == ("int8", "float32", "int8", "float32")
    x = np.random.default_rng(1).uniform(-1, 1, (1, 8)).astype(np.float32)
    y = next(iter(r.run({"x": x}).values()))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, x * 2 + 1, atol=4 * o["quantization"][0] + 2 * i["quantization"][0])



@pytest.fixture(scope="module")
def signed_tflite(tmp_path_factory):
    return write_two_input_tflite(tmp_path_factory.mktemp("tfl") / "signed.tflite", signature=True)


def test_signature_runner_returns_the_signatures_output_names(signed_tflite):
    from modelport.runtimes import get_runner

    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 4, 2)).astype(np.float32), rng.standard_normal((2, 2)).astype(np.float32)
    for options in ({"signature": "serving_default"}, {}):  # named, or the file's only signature matching the feeds
        out = get_runner("tflite", signed_tflite, **options).run({"b": b, "a": a})
        assert list(out) == ["y"]
        np.testing.assert_allclose(out["y"], a.sum(axis=1) * 10 + b, rtol=1e-5)
    with pytest.raises(BadInputError, match="no signature 'serve'"):
        get_runner("tflite", signed_tflite, signature="serve")
    with pytest.raises(BadInputError, match="signature 'serving_default' takes"):
        get_runner("tflite", signed_tflite, signature="serving_default").run({"a": a, "c": b})


def _batch_one_graph(path: Path) -> Path:
    """A file whose signature takes x[-1,8] while a Reshape inside fixes the batch at 1 (XNNPack
    cannot reshape it for batch 2: 'XNNPack delegate failed to reshape runtime')."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def f(x):
        return {"y": tf.reshape(tf.nn.relu(x), [1, 2, 4]) * 2.0}

    path.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()]).convert())
    return path


def test_graph_fixed_at_batch_one_is_exit_2_naming_the_input(cli, tmp_path):
    path = _batch_one_graph(tmp_path / "b1.tflite")
    runner = TFLiteRunner(path)
    assert runner.run({"x": np.ones((1, 8), np.float32)})
    with pytest.raises(BadInputError, match=r"'x' at \[2, 8\] \(the file's graph is built for \[1, 8\]\).*RESHAPE"):
        runner.run({"x": np.ones((2, 8), np.float32)})
    np.savez(tmp_path / "x.npz", x=np.ones((2, 8), np.float32))
    r = cli("validate", path, path, "--data", tmp_path / "x.npz")
    assert r.exit_code == 2 and "the file's graph is built for [1, 8]" in r.stderr, r.stderr
