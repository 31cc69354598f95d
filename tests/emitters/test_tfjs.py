"""The tfjs target: TF.js graph models (model.json + shards) from PyTorch through the SavedModel's
ONNX route and from Keras/SavedModel natively, each run in Node.js by @tensorflow/tfjs (installed
by `make setup`), fed and read through model.json's signature; fp16 and uint8 weights; ops TF.js
cannot run and a missing Node.js or TF.js refused before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from modelport.errors import MissingDependencyError, UnsupportedError
from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes.tfjs import TFJSRunner


def _model_json(folder):
    return json.loads((folder / "tfjs" / "model.json").read_text())


def _weight_bytes(folder) -> int:
    return sum(p.stat().st_size for p in (folder / "tfjs").glob("group1-shard*.bin"))


def _signature_names(doc) -> tuple[list[str], list[str]]:
    return list(doc["signature"]["inputs"]), list(doc["signature"]["outputs"])


def _cnn():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3, padding=1),
                               torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10)).eval()


def test_pytorch_cnn_fp32_and_uint8_run_in_node(tmp_path, cli):
    import torch

    module = _cnn()
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    got = {}
    for precision in ("fp32", "uint8"):
        out = tmp_path / precision
        report = convert(module, out, ConvertOptions(targets=["tfjs"], inputs=["pixels:batch,3,8,8"], output_names=["scores"],
                                                     precision=precision))
        (art,) = report["artifacts"]
        assert (art["target"], art["route"], art["runtime"], art["precision"]) == ("tfjs", "onnx", "tfjs", precision)
        assert art["path"] == "tfjs/model.json" and report["parity"][-1]["ok"], report["parity"][-1]
        doc = _model_json(out)
        assert doc["format"] == "graph-model" and _signature_names(doc) == (["pixels"], ["scores"])
        quantised = [w for w in doc["weightsManifest"][0]["weights"] if "quantization" in w]
        assert bool(quantised) == (precision == "uint8")
        assert all(w["quantization"]["dtype"] == "uint8" and "scale" in w["quantization"] for w in quantised)
        got[precision] = TFJSRunner(out / "tfjs" / "model.json").run({"pixels": x})["scores"]
        assert got[precision].shape == (2, 10) and got[precision].dtype == np.float32
    np.testing.assert_allclose(got["fp32"], want, atol=1e-4, rtol=1e-4)
    assert not np.array_equal(got["uint8"], got["fp32"])  # the uint8 weights really are what ran
    np.testing.assert_allclose(got["uint8"], want, atol=0.05 * np.abs(want).max())
    assert _weight_bytes(tmp_path / "uint8") < 0.3 * _weight_bytes(tmp_path / "fp32")

    model_json = tmp_path / "fp32" / "tfjs" / "model.json"
    r = cli("inspect", model_json, "--json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["format"] == "tfjs-graph-model" and [i["name"] for i in info["inputs"]] == ["pixels"]
    assert info["outputs"][0]["name"] == "scores" and info["precision"] == "fp32" and "Conv2D" in info["ops"]
    r = cli("validate", model_json, tmp_path / "uint8" / "tfjs" / "model.json", "--precision", "uint8", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["b"]["io"].startswith("TF.js 4.22.0 in Node.js")


def test_keras_transformer_encoder_natively_fp32_and_fp16(tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    tokens = keras.Input((6, 16), name="tokens")
    h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(tokens, tokens)
    h = keras.layers.LayerNormalization()(tokens + h)
    f = keras.layers.Dense(32, activation="gelu")(h)
    h = keras.layers.LayerNormalization()(h + keras.layers.Dense(16)(f))
    model = keras.Model(tokens, keras.layers.Dense(4, name="logits")(h))
    src = tmp_path / "src" / "encoder.keras"
    src.parent.mkdir()
    model.save(src)
    x = np.random.default_rng(1).standard_normal((3, 6, 16)).astype(np.float32)
    want = model.predict(x, verbose=0)
    for precision in ("fp32", "fp16"):
        out = tmp_path / precision
        report = convert(src, out, ConvertOptions(targets=["tfjs"], precision=precision))
        (art,) = report["artifacts"]
        assert art["route"] == "native" and art["converter"].startswith("Keras") and report["parity"][-1]["ok"]
        doc = _model_json(out)
        ins, outs = _signature_names(doc)
        assert ins == ["tokens"] and outs == art["signature"]["outputs"] and len(outs) == 1
        got = TFJSRunner(out / "tfjs").run({"tokens": x})[outs[0]]
        np.testing.assert_allclose(got, want, atol=1e-4 if precision == "fp32" else 2e-2)
        dtypes = {(w.get("quantization") or {}).get("dtype") for w in doc["weightsManifest"][0]["weights"]}
        assert ("float16" in dtypes) == (precision == "fp16")
    assert 0.45 < _weight_bytes(tmp_path / "fp16") / _weight_bytes(tmp_path / "fp32") < 0.6


def test_two_inputs_two_outputs_keep_the_contract_names(tmp_path):
    import torch

    class TwoByTwo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(5, 5)

        def forward(self, left, right):
            return self.proj(left) + right, (left * right).sum(-1, keepdim=True)

    torch.manual_seed(0)
    module = TwoByTwo().eval()
    out = tmp_path / "out"
    report = convert(module, out, ConvertOptions(targets=["tfjs"], inputs=["left:batch,5", "right:batch,5"],
                                                 output_names=["mixed", "dot"]))
    assert report["parity"][-1]["ok"]
    doc = _model_json(out)
    assert sorted(doc["signature"]["inputs"]) == ["left", "right"] and sorted(doc["signature"]["outputs"]) == ["dot", "mixed"]
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal((4, 5)).astype(np.float32) for _ in range(2))
    got = TFJSRunner(out / "tfjs" / "model.json").run({"left": a, "right": b})
    with torch.no_grad():
        mixed, dot = module(torch.from_numpy(a), torch.from_numpy(b))
    np.testing.assert_allclose(got["mixed"], mixed.numpy(), atol=1e-5)
    np.testing.assert_allclose(got["dot"], dot.numpy(), atol=1e-5)


def test_savedmodel_source_with_int64_ids_and_weights_over_one_shard(tmp_path):
    """A SavedModel source (native route): int64 token ids (TF.js feeds int32) into a 5 MB
    embedding, so the weights span two 4 MiB shards that TF.js must join."""
    import tensorflow as tf

    class Embed(tf.Module):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(3)
            self.table = tf.Variable(rng.standard_normal((20000, 64)).astype(np.float32))
            self.head = tf.Variable(rng.standard_normal((64, 3)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.int64, name="ids")])
        def serve(self, ids):
            pooled = tf.reduce_mean(tf.gather(self.table, ids), axis=1)
            return {"scores": tf.matmul(pooled, self.head)}

    module = Embed()
    src = tmp_path / "embed_model"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    out = tmp_path / "out"
    report = convert(src, out, ConvertOptions(targets=["tfjs"], route="native"))
    (art,) = report["artifacts"]
    assert art["route"] == "native" and art["shards"] == 2 and report["parity"][-1]["ok"]
    doc = _model_json(out)
    assert doc["signature"]["inputs"]["ids"]["dtype"] == "DT_INT64" and doc["weightsManifest"][0]["paths"] == [
        "group1-shard1of2.bin", "group1-shard2of2.bin"]
    ids = np.random.default_rng(4).integers(0, 20000, (2, 5)).astype(np.int64)
    got = TFJSRunner(out / "tfjs" / "model.json").run({"ids": ids})["scores"]
    np.testing.assert_allclose(got, module.serve(tf.constant(ids))["scores"].numpy(), atol=1e-4, rtol=1e-4)


def _determinant_saved_model(folder):
    import tensorflow as tf

    class Det(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3, 3], tf.float32, name="m")])
        def serve(self, m):
            return {"det": tf.linalg.det(m) * 2.0}

    module = Det()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})
    return folder


def test_an_op_tfjs_cannot_run_is_exit_2_naming_it(tmp_path, cli):
    src = _determinant_saved_model(tmp_path / "det_model")
    r = cli("convert", src, "--to", "tfjs", "--route", "native", "-o", tmp_path / "out")
    assert r.exit_code == 2
    assert "MatrixDeterminant" in r.stderr and "TF.js cannot run" in r.stderr
    assert not (tmp_path / "out" / "tfjs").exists()
    import tensorflow as tf

    from modelport.emitters.tfjs_graph import convert_saved_model

    with pytest.raises(UnsupportedError, match=r"MatrixDeterminant \(1: "):  # the writer itself, on the SavedModel
        convert_saved_model(tf, src, tmp_path / "direct")
    assert not (tmp_path / "direct").exists()


@pytest.mark.parametrize("variable, value, named", [("MODELPORT_TFJS_DIR", "empty", "@tensorflow/tfjs"),
                                                    ("MODELPORT_NODE", "/nonexistent/node", "Node.js")])
def test_missing_node_or_tfjs_is_exit_5_before_any_work(tmp_path, cli, monkeypatch, tiny_onnx, variable, value, named):
    if value == "empty":
        (tmp_path / "empty").mkdir()
        value = str(tmp_path / "empty")
    monkeypatch.setenv(variable, value)
    r = cli("convert", tiny_onnx, "--to", "tfjs", "-o", tmp_path / "out")
    assert r.exit_code == 5, r.stderr
    assert named in r.stderr and "make setup" in r.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(MissingDependencyError, match=named.replace(".", r"\.")):
        TFJSRunner(tmp_path / "model.json")


def test_a_bad_model_json_is_refused_naming_the_file(tmp_path, cli):
    layers = tmp_path / "layers" / "model.json"
    layers.parent.mkdir()
    layers.write_text(json.dumps({"format": "layers-model", "modelTopology": {}}))
    r = cli("inspect", layers)
    assert r.exit_code == 2 and "not a TF.js graph model (format 'layers-model'" in r.stderr and str(layers) in r.stderr
    escaping = tmp_path / "escaping" / "model.json"
    escaping.parent.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"\0" * 4)
    escaping.write_text(json.dumps({"format": "graph-model", "modelTopology": {"node": []},
                                    "weightsManifest": [{"paths": ["../outside.bin"], "weights": []}]}))
    r = cli("inspect", escaping)
    assert r.exit_code == 3 and "is not a file name beside model.json" in r.stderr
    missing = tmp_path / "missing" / "model.json"
    missing.parent.mkdir()
    missing.write_text(json.dumps({"format": "graph-model", "modelTopology": {"node": []},
                                   "weightsManifest": [{"paths": ["group1-shard1of1.bin"], "weights": []}]}))
    r = cli("validate", missing, missing)
    assert r.exit_code == 2 and "weight shard group1-shard1of1.bin is missing" in r.stderr
