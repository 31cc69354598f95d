"""TF Serving: SavedModel versions with the contract's signature names, models.config, parity."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.packaging import PackageOptions
from modelport.packaging.bundle import load_artifacts
from modelport.packaging.tfserving import SIGNATURE, package, run_signature, signature_specs
from modelport.validation import Tolerance, compare

pytestmark = pytest.mark.tf


def test_onnx_to_savedmodel_keeps_names_and_parity(cnn_out, tmp_path):
    arts = load_artifacts(cnn_out)
    b = package(arts, tmp_path, PackageOptions(model_name="cnn"))
    version = tmp_path / "cnn" / "1"
    assert (version / "saved_model.pb").is_file() and (version / "variables").is_dir()
    import tensorflow as tf

    loaded = tf.saved_model.load(str(version))
    fn = loaded.signatures[SIGNATURE]
    _, kwargs = fn.structured_input_signature
    assert list(kwargs) == ["input"] and kwargs["input"].shape.as_list() == [None, 3, 64, 64]  # still NCHW
    assert list(fn.structured_outputs) == ["output"]
    feeds = arts.sample_inputs(batch=3)
    result = compare(arts.reference_outputs(feeds), run_signature(version, feeds), Tolerance(1e-4, 1e-3, 0.9999), hop="tfs")
    assert result.ok, result.summary()
    config = (tmp_path / "models.config").read_text()
    assert "name: 'cnn'" in config and "base_path: '/models/cnn'" in config
    assert "/v1/models/cnn:predict" in (tmp_path / "README.md").read_text()
    assert b.details["signature"] == SIGNATURE


def test_keras_savedmodel_source_and_multi_model_config(tmp_path, mlp_out):
    import keras

    inp = keras.Input((6,), name="pixels")
    out = keras.layers.Dense(3, name="logits")(inp)
    model = keras.Model(inp, out)
    model.export(str(tmp_path / "exported"), verbose=False)
    arts = load_artifacts(tmp_path / "exported")
    assert [s.name for s in arts.inputs] == ["pixels"] and arts.inputs[0].shape == ["batch", 6]
    repo = tmp_path / "repo"
    repo.mkdir()
    package(arts, repo, PackageOptions(model_name="keras_mlp"))
    package(load_artifacts(mlp_out), repo, PackageOptions())
    config = (repo / "models.config").read_text()
    assert "name: 'keras_mlp'" in config and "name: 'mlp'" in config
    x = np.ones((2, 6), np.float32)
    want = model(x).numpy()
    got = run_signature(repo / "keras_mlp" / "1", {"pixels": x})
    (name,) = got
    np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)
    ins, outs = signature_specs(repo / "keras_mlp" / "1")
    assert [s.name for s in ins] == ["pixels"]


def test_tflite_and_ort_are_refused_before_tensorflow_loads(mlp_edge_out, tmp_path):
    from modelport.errors import BadInputError

    with pytest.raises(BadInputError, match=r"TF Serving cannot serve .*ORT-format.*TFLite.*TF Serving takes a SavedModel"):
        package(load_artifacts(mlp_edge_out), tmp_path, PackageOptions())
    assert not (tmp_path / "models.config").exists()


def test_square_channels_first_output_keeps_its_layout(tmp_path):
    """A [batch, 8, 8, 8] output has the same shape NCHW and NHWC: the signature still returns the
    source's NCHW numbers (onnx2tf computes it channels-last; the values, not the shape, decide)."""
    import torch

    from modelport.orchestration import ConvertOptions, convert

    class SquareMap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, image):
            return self.conv(image)

    torch.manual_seed(2)
    model = SquareMap().eval()
    out = tmp_path / "out"
    convert(model, out, ConvertOptions(inputs=["image:batch,3,8,8"], output_names=["fmap"]))
    arts = load_artifacts(out)
    package(arts, tmp_path / "tfs", PackageOptions(model_name="square"))
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = run_signature(tmp_path / "tfs" / "square" / "1", {"image": x})
    assert list(got) == ["fmap"] and got["fmap"].shape == (2, 8, 8, 8)
    np.testing.assert_allclose(got["fmap"], want, atol=1e-4, rtol=1e-3)
