"""Keras zoo entries: seeded builders, `zoo build` writing model.keras, and `convert zoo:NAME`."""

from __future__ import annotations

import numpy as np
import pytest

from modelport import zoo
from modelport.zoo_builders import keras as builders

KERAS_ENTRIES = ["keras_cnn", "keras_mobilenet_v2", "keras_rnn", "keras_transformer", "keras_two_io"]


def test_entries_are_registered_as_keras():
    for name in KERAS_ENTRIES:
        entry = zoo.get(name)
        assert entry.framework == "keras" and entry.builder.startswith("modelport.zoo_builders.keras:")


def test_builders_are_seeded():
    a, b, c = builders.keras_cnn(seed=0), builders.keras_cnn(seed=0), builders.keras_cnn(seed=1)
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)
    assert any(not np.array_equal(wa, wc) for wa, wc in zip(a.get_weights(), c.get_weights(), strict=True))
    bn = [layer for layer in a.layers if type(layer).__name__ == "BatchNormalization"][0]
    assert np.abs(bn.moving_mean.numpy()).max() > 0  # BN statistics are not the trivial defaults


def test_zoo_build_writes_a_keras_file_that_converts(cli, tmp_path):
    src = tmp_path / "src"
    r = cli("zoo", "build", "keras_cnn", "-o", src, "--json")
    assert r.exit_code == 0, r
    data = r.json()
    assert data["files"] == [str(src / "model.keras")] and "model.keras" in data["convert_hint"]
    r = cli("convert", src / "model.keras", "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    assert r.json()["contract"]["inputs"][0]["layout"] == "NHWC"


@pytest.mark.parametrize("name", ["keras_two_io", "keras_mobilenet_v2", "keras_rnn"])
def test_convert_zoo_sources(cli, tmp_path, name):
    r = cli("convert", f"zoo:{name}", "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert report["source"]["framework"] == "keras"
    assert [s["name"] for s in report["contract"]["inputs"]] == [t.split(":")[0] for t in zoo.get(name).inputs]
    assert all(p["ok"] for p in report["parity"])


def test_zoo_list_shows_keras_entries(cli):
    r = cli("zoo", "list", "--json")
    assert r.exit_code == 0
    frameworks = {m["name"]: m["framework"] for m in r.json()["models"]}
    assert all(frameworks[n] == "keras" for n in KERAS_ENTRIES)
