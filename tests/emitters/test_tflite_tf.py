"""The native TFLite route for TensorFlow sources (TFLiteConverter on the Keras model or the
SavedModel's signature): chosen by `--route auto`, files named and laid out as the contract says,
the TFLite precisions, and the route recorded in the report."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.emitters.tflite_options import TFLiteOptions
from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes.tflite import load_interpreter


@pytest.fixture(scope="module")
def keras_files(tmp_path_factory):
    """A Functional CNN and a Sequential MLP saved as `.keras`, the CNN also as a SavedModel
    (`model.export`), with a sample input each."""
    import keras

    keras.utils.set_random_seed(0)
    d = tmp_path_factory.mktemp("tfsrc")
    inp = keras.Input((16, 16, 3), name="image")
    y = keras.layers.Conv2D(8, 3, activation="relu")(inp)
    y = keras.layers.Dense(4, name="probs")(keras.layers.GlobalAveragePooling2D()(y))
    functional = keras.Model(inp, y)
    functional.save(d / "functional.keras")
    functional.export(str(d / "exported"), verbose=False)
    sequential = keras.Sequential([keras.Input((10,), name="features"), keras.layers.Dense(8, activation="relu"),
                                   keras.layers.Dense(3)])
    sequential.save(d / "sequential.keras")
    rng = np.random.default_rng(1)
    return d, {"functional": (functional, rng.standard_normal((3, 16, 16, 3)).astype(np.float32)),
               "sequential": (sequential, rng.standard_normal((3, 10)).astype(np.float32))}


def _run(path, **feeds):
    it = load_interpreter(path)
    return it, it.get_signature_runner("serving_default")(**feeds)


def test_keras_functional_goes_native_by_default(keras_files, tmp_path):
    d, models = keras_files
    model, x = models["functional"]
    report = convert(d / "functional.keras", tmp_path / "out", ConvertOptions(targets=["tflite"]))
    (art,) = report["artifacts"]
    assert (art["route"], art["route_asked"], art["route_converter"]) == ("native", "auto", "TFLiteConverter")
    assert art["converter"].startswith("TensorFlow") and "keras source" in art["converter"]
    assert art["contract_check"]["fixed_dims"] == {}  # the batch stays dynamic
    assert report["parity"][-1]["hop"] == "keras→tflite (native, end to end)" and report["parity"][-1]["ok"]
    it, got = _run(tmp_path / "out" / "model.tflite", image=x)  # a batch of 3: the sample had 2
    assert it.get_signature_list() == {"serving_default": {"inputs": ["image"], "outputs": ["probs"]}}
    np.testing.assert_allclose(got["probs"], model.predict(x, verbose=0), atol=1e-5)


def test_keras_sequential_fp16_and_int8_calibrated_integer_io(keras_files, tmp_path):
    d, models = keras_files
    model, x = models["sequential"]
    report = convert(d / "sequential.keras", tmp_path / "fp16", ConvertOptions(targets=["tflite"], precision="fp16",
                                                                              route="native"))
    (art,) = report["artifacts"]
    assert (art["route"], art["precision"], art["quantization"]) == ("native", "fp16", "float16 weights")
    calib = tmp_path / "calib.npz"
    np.savez(calib, features=np.random.default_rng(2).standard_normal((16, 10)).astype(np.float32))
    report = convert(d / "sequential.keras", tmp_path / "int8", ConvertOptions(
        targets=["tflite"], precision="int8", calibration=str(calib), route="native", target_options={"tflite": TFLiteOptions(io_dtype="int8")}))
    (art,) = report["artifacts"]
    assert art["route"] == "native" and art["io_dtype"] == "int8" and report["parity"][-1]["ok"]
    details = load_interpreter(tmp_path / "int8" / "model.tflite").get_input_details()
    assert details[0]["dtype"] == np.int8


def test_savedmodel_source_reaches_tflite_and_savedmodel_natively(keras_files, tmp_path):
    import tensorflow as tf

    d, models = keras_files
    model, x = models["functional"]
    out = tmp_path / "out"
    report = convert(d / "exported", out, ConvertOptions(targets=["tflite", "savedmodel"]))
    assert [(a["target"], a["route"]) for a in report["artifacts"]] == [("tflite", "native"), ("savedmodel", "native")]
    assert all(p["ok"] for p in report["parity"])
    (name,) = [s["name"] for s in report["contract"]["inputs"]]
    (oname,) = [s["name"] for s in report["contract"]["outputs"]]
    _, got = _run(out / "model.tflite", **{name: x})
    np.testing.assert_allclose(got[oname], model.predict(x, verbose=0), atol=1e-5)
    fn = tf.saved_model.load(str(out / "saved_model")).signatures["serving_default"]
    np.testing.assert_allclose(fn(**{name: tf.constant(x)})[oname].numpy(), model.predict(x, verbose=0), atol=1e-5)
