"""The savedmodel target: from a PyTorch source through the ONNX route (onnx2tf), from Keras through
Keras's export (native), each loaded as a user would (`tf.saved_model.load`, the signature called by
the contract's names); fp16/int8 refused before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.errors import BadInputError
from modelport.orchestration import ConvertOptions, convert


def _signature(folder):
    import tensorflow as tf

    return tf.saved_model.load(str(folder)).signatures["serving_default"]


def test_pytorch_cnn_to_savedmodel_by_the_onnx_route(tmp_path):
    import tensorflow as tf
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                 torch.nn.Linear(4 * 8 * 8, 3)).eval()
    out = tmp_path / "out"
    report = convert(module, out, ConvertOptions(targets=["savedmodel"], inputs=["pixels:batch,3,8,8"], output_names=["scores"]))
    (art,) = report["artifacts"]
    assert (art["target"], art["route"], art["runtime"]) == ("savedmodel", "onnx", "savedmodel")
    assert art["route_notes"] == ["no native route from pytorch to savedmodel"]
    assert art["signature"] == {"key": "serving_default", "inputs": ["pixels"], "outputs": ["scores"]}
    assert report["parity"][-1]["hop"] == "pytorch→savedmodel (end to end)" and report["parity"][-1]["ok"]
    x = np.random.default_rng(0).standard_normal((3, 3, 8, 8)).astype(np.float32)  # channels-first, as the source
    got = _signature(out / "saved_model")(pixels=tf.constant(x))["scores"].numpy()
    with torch.no_grad():
        np.testing.assert_allclose(got, module(torch.from_numpy(x)).numpy(), atol=1e-5)


def test_keras_sequential_exported_natively_and_by_onnx(tmp_path):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,), name="features"), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2, name="out")])
    src = tmp_path / "src" / "seq.keras"
    src.parent.mkdir()
    model.save(src)
    x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)
    for route, converter in (("auto", "Keras"), ("onnx", "onnx2tf")):
        out = tmp_path / route
        report = convert(src, out, ConvertOptions(targets=["savedmodel"], route=route))
        (art,) = report["artifacts"]
        assert art["route"] == ("native" if route == "auto" else "onnx") and report["parity"][-1]["ok"]
        assert art["converter"].startswith(converter)
        (oname,) = art["signature"]["outputs"]
        got = _signature(out / "saved_model")(features=tf.constant(x))[oname].numpy()
        np.testing.assert_allclose(got, model.predict(x, verbose=0), atol=1e-5)


def test_savedmodel_is_fp32_only(tmp_path):
    import torch

    with pytest.raises(BadInputError, match="fp32 only"):
        convert(torch.nn.Linear(4, 2).eval(), tmp_path / "out", ConvertOptions(targets=["onnx", "savedmodel"], inputs=["x:2,4"],
                                                                            precision="fp16"))
    assert not (tmp_path / "out").exists()


# Loads the artifact as a plain `pip install tensorflow` does (Keras 3, no tf_keras; TensorFlow's
# loader imports tf_keras by itself for an optimizer it finds, so here it cannot).
PLAIN_TF_LOAD = """
import json, sys
sys.modules["tf_keras"] = None
import numpy as np
import tensorflow as tf
folder, x = sys.argv[1], np.asarray(json.loads(sys.argv[2]), dtype=np.float32)
out = tf.saved_model.load(folder).signatures["serving_default"](features=tf.constant(x))
names = [name for name, _ in tf.train.list_variables(folder + "/variables/variables") if "VARIABLE_VALUE" in name]
print(json.dumps({"out": {k: v.numpy().tolist() for k, v in out.items()}, "variables": names}))
"""


@pytest.mark.tf
def test_savedmodel_with_optimizer_re_saved_with_serving_variables_only(tmp_path):
    """A SavedModel saved while training (tf_keras, legacy Adam after one step: slot variables in
    its object graph) comes out as the signature and its four weights, which plain TensorFlow loads."""
    import json
    import subprocess
    import sys

    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.Input((6,), name="features"), tf_keras.layers.Dense(4, activation="relu"),
                                 tf_keras.layers.Dense(2, name="out")])
    model.compile(optimizer=tf_keras.optimizers.legacy.Adam(), loss="mse")
    model.fit(np.ones((4, 6), np.float32), np.ones((4, 2), np.float32), epochs=1, verbose=0)
    src = tmp_path / "trained"
    tf.saved_model.save(model, str(src))
    out = tmp_path / "out"
    report = convert(src, out, ConvertOptions(targets=["savedmodel"]))
    (art,) = report["artifacts"]
    assert art["route"] == "native" and report["parity"][-1]["ok"]
    x = np.random.default_rng(2).standard_normal((3, 6)).astype(np.float32)
    child = subprocess.run([sys.executable, "-c", PLAIN_TF_LOAD, str(out / "saved_model"), json.dumps(x.tolist())],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-1500:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(np.asarray(got["out"]["out"]), model.predict(x, verbose=0), atol=1e-5)
    assert len(got["variables"]) == 4 and not any("ptimizer" in n for n in got["variables"]), got["variables"]
