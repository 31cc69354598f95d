"""Keras sources: .keras and .h5 files and keras.Model objects converted with parity against Keras,
the config screen (Lambda, foreign modules, TorchModuleWrapper, TFSMLayer), corrupt files, the
missing-TensorFlow hint, MMdnn spellings and clean --json output."""

from __future__ import annotations

import json
import sys
import zipfile

import numpy as np
import pytest

from modelport.errors import UnsafeInputError
from modelport.parsers import SourceSpec, detect, parse
from modelport.parsers.keras_safety import find_unsafe, read_config
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.zoo_builders import keras as builders
from tests.conftest import tree


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("keras")
    models = {
        "cnn": builders.keras_cnn(),
        "rnn": builders.keras_rnn(),
        "transformer": builders.keras_transformer(),
        "two_io": builders.keras_two_io(),
    }
    for name, m in models.items():
        m.save(d / f"{name}.keras")
    models["cnn"].save(d / "cnn.h5")
    models["two_io"].save(d / "two_io.h5")
    return d, models


def _parity(report: dict) -> list[float]:
    return [o["max_abs"] for p in report["parity"] for o in p["outputs"]]


def test_sniffing_finds_keras_files(files):
    d, _ = files
    assert detect(d / "cnn.keras") == "keras"
    assert detect(d / "cnn.h5") == "keras"


@pytest.mark.parametrize("name", ["cnn.keras", "cnn.h5", "rnn.keras", "transformer.keras", "two_io.h5"])
def test_convert_files_with_parity(cli, files, tmp_path, name):
    d, _ = files
    out = tmp_path / "out"
    r = cli("convert", d / name, "--to", "onnx", "-o", out, "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert (out / "model.onnx").is_file() and (out / "report.json").is_file()
    assert report["source"]["framework"] == "keras"
    assert all(p["ok"] for p in report["parity"]) and max(_parity(report)) < 1e-4


def test_nhwc_input_kept_and_batch_dynamic(files):
    d, models = files
    ir = parse(d / "cnn.keras", SourceSpec(path=d / "cnn.keras"))
    (image,) = ir.inputs
    assert image.layout == "NHWC" and image.shape == ["batch", 32, 32, 3]
    x = np.random.default_rng(1).standard_normal((5, 32, 32, 3)).astype(np.float32)
    got = OnnxRuntimeRunner(ir.model).run({"image": x})["logits"]
    np.testing.assert_allclose(got, models["cnn"].predict(x, verbose=0), atol=1e-4)


def test_two_inputs_two_outputs_keep_names(files):
    d, models = files
    ir = parse(d / "two_io.keras", SourceSpec(path=d / "two_io.keras"))
    assert [s.name for s in ir.inputs] == ["image", "meta"]
    assert [s.name for s in ir.outputs] == ["logits", "score"]
    assert ir.reference.producer.startswith("keras ")
    want = models["two_io"].predict([ir.reference.inputs["image"], ir.reference.inputs["meta"]], verbose=0)
    np.testing.assert_allclose(ir.reference.outputs["score"], want[1], rtol=1e-6)


def test_int_token_inputs_and_rnn_time_axis(files):
    d, _ = files
    ir = parse(d / "transformer.keras", SourceSpec(path=d / "transformer.keras"))
    assert ir.inputs[0].dtype == "int32" and ir.reference.inputs["tokens"].dtype == np.int32
    ir = parse(d / "rnn.keras", SourceSpec(path=d / "rnn.keras"))
    assert ir.inputs[0].shape == ["batch", "sequence_dim1", 6]
    out = OnnxRuntimeRunner(ir.model).run({"sequence": np.ones((3, 11, 6), np.float32)})
    assert out["scores"].shape == (3, 3)


def test_input_and_output_renames(cli, files, tmp_path):
    d, _ = files
    out = tmp_path / "out"
    r = cli("convert", d / "two_io.keras", "-o", out, "--input-names", "pixels,features", "--outputs", "cls,prob",
            "--input", "pixels:n,16,16,3", "--input", "meta:n,8", "--dim", "n=3", "--json")
    assert r.exit_code == 0, r
    contract = r.json()["contract"]
    assert [s["name"] for s in contract["inputs"]] == ["pixels", "features"]
    assert contract["inputs"][0]["shape"] == ["n", 16, 16, 3] and contract["sample_dims"] == {"n": 3}
    assert [s["name"] for s in contract["outputs"]] == ["cls", "prob"]


def test_keras_model_object(files):

    _, models = files
    ir = parse(models["cnn"], SourceSpec())
    assert ir.provenance["format"] == "keras.Model"


def test_mmdnn_spelling(cli, files, tmp_path):
    d, _ = files
    out = tmp_path / "out"
    r = cli("convert", "-sf", "keras", "-iw", d / "cnn.h5", "-df", "onnx", "-om", out)
    assert r.exit_code == 0, r
    assert (out / "model.onnx").is_file()


# --- safety ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lambda_files(tmp_path_factory):
    import keras

    d = tmp_path_factory.mktemp("lambda")
    marker = d / "marker"
    fn = eval(f"lambda x: x * float(__import__('pathlib').Path({str(marker)!r}).write_text('pwned') > 0)")
    x_in = keras.Input((4,), name="x")
    model = keras.Model(x_in, keras.layers.Dense(2)(keras.layers.Lambda(fn, name="evil_lambda")(x_in)))
    model.save(d / "evil.keras")
    model.save(d / "evil.h5")
    benign = keras.Model(x_in, keras.layers.Lambda(lambda x: x * 2.0, name="double")(x_in))
    benign.save(d / "benign.keras")
    marker.unlink()
    return d, marker


@pytest.mark.parametrize("name", ["evil.keras", "evil.h5"])
def test_lambda_refused_before_keras_runs_it(cli, lambda_files, tmp_path, name):
    d, marker = lambda_files
    out = tmp_path / "out"
    r = cli("convert", d / name, "-o", out)
    assert r.exit_code == 3, r
    assert "evil_lambda" in r.stderr and "Lambda" in r.stderr
    assert not marker.exists() and not out.exists()
    assert tree(tmp_path) == []


def test_trust_allows_a_lambda(cli, lambda_files, tmp_path):
    d, _ = lambda_files
    assert cli("convert", d / "benign.keras", "-o", tmp_path / "a").exit_code == 3
    r = cli("convert", d / "benign.keras", "-o", tmp_path / "b", "--trust", "--json")
    assert r.exit_code == 0, r
    assert all(p["ok"] for p in r.json()["parity"])


def _handmade_keras(path, layer: dict):
    """A .keras archive whose config holds `layer`; no weights needed, it must never load."""
    config = {
        "module": "keras", "class_name": "Sequential",
        "config": {"name": "seq", "layers": [
            {"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [None, 4], "name": "x"}},
            layer,
        ]},
    }
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", json.dumps(config))
        z.writestr("metadata.json", json.dumps({"keras_version": "3.15.1"}))
    return path


@pytest.mark.parametrize("layer, words", [
    ({"module": "os", "class_name": "system", "config": {"name": "shell", "command": "touch x"}}, ["shell", "'os'"]),
    ({"module": "keras.layers", "class_name": "TFSMLayer", "config": {"name": "sm", "filepath": "/tmp"}}, ["sm", "TFSMLayer"]),
    ({"module": "keras.layers", "class_name": "TorchModuleWrapper", "config": {"name": "tw", "module": "x"}}, ["tw", "TorchModuleWrapper"]),
    ({"module": "keras.layers", "class_name": "Dense", "config": {"name": "d", "units": 2, "activation": {
        "module": "keras.config", "class_name": "function", "config": "enable_unsafe_deserialization"}}},
     ["'d'", "enable_unsafe_deserialization"]),
    ({"module": "mypkg.layers", "class_name": "Custom", "config": {"name": "c"}, "registered_name": "mypkg>Custom"},
     ["'c'", "mypkg"]),
])
def test_config_screen_names_the_layer(cli, tmp_path, layer, words):
    src = _handmade_keras(tmp_path / "bad.keras", layer)
    r = cli("convert", src, "-o", tmp_path / "out")
    assert r.exit_code == 3, r
    for w in words:
        assert w in r.stderr
    assert not (tmp_path / "out").exists()


def test_real_models_pass_the_screen(files):
    d, _ = files
    for name in ("cnn.keras", "cnn.h5", "rnn.keras", "transformer.keras", "two_io.h5"):
        assert find_unsafe(read_config(d / name)) == [], name


def test_old_keras_refused(monkeypatch):
    from modelport import deps
    from modelport.parsers import keras_safety

    monkeypatch.setattr(deps, "version_of", lambda m: "3.11.2")
    with pytest.raises(UnsafeInputError, match="3.11.2"):
        keras_safety.check_keras_version()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "no_config"])
def test_corrupt_keras_files_exit_2(cli, files, tmp_path, damage):
    d, _ = files
    raw = (d / "cnn.keras").read_bytes()
    bad = tmp_path / "bad.keras"
    if damage == "truncate":
        bad.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        bad.write_bytes(b"not a model at all" * 10)
    else:
        with zipfile.ZipFile(bad, "w") as z:
            z.writestr("other.txt", "x")
    r = cli("convert", bad, "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "bad.keras" in r.stderr and not (tmp_path / "out").exists()


def test_truncated_h5_exit_2(cli, files, tmp_path):
    d, _ = files
    raw = (d / "cnn.h5").read_bytes()
    bad = tmp_path / "bad.h5"
    bad.write_bytes(raw[: len(raw) // 3])
    r = cli("convert", bad, "-o", tmp_path / "out")
    assert r.exit_code == 2, r


def test_missing_tensorflow_gives_exit_5(cli, files, tmp_path, monkeypatch):
    d, _ = files
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    r = cli("convert", d / "cnn.keras", "-o", tmp_path / "out")
    assert r.exit_code == 5, r
    assert 'modelport[tf]' in r.stderr


def test_inspect_reads_the_config(cli, files, lambda_files):
    d, _ = files
    r = cli("inspect", d / "two_io.keras", "--json")
    assert r.exit_code == 0, r
    info = r.json()
    assert [i["name"] for i in info["inputs"]] == ["image", "meta"]
    assert info["ops"]["Dense"] >= 2
    r = cli("inspect", lambda_files[0] / "evil.h5", "--json")
    assert r.exit_code == 0 and "evil_lambda" in " ".join(r.json()["refused_without_trust"])


def test_json_stdout_is_one_document(cli_proc, files, tmp_path):
    d, _ = files
    r = cli_proc("convert", d / "cnn.keras", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    report = json.loads(r.stdout)  # nothing TensorFlow printed may land on stdout
    assert report["status"] == "ok"


def half_dead_keras():
    """`y` depends on the input; `dead` is a Dense layer with zero kernel (the same for any input)."""
    import keras

    x = keras.Input((8,), name="x")
    y = keras.layers.Dense(4, name="y")(x)
    dead = keras.layers.Dense(3, kernel_initializer="zeros", bias_initializer="ones", name="dead")(x)
    return keras.Model(x, {"y": y, "dead": dead})


def test_reference_varies_keras_file(tmp_path):
    model = half_dead_keras()
    model.save(tmp_path / "m.keras")
    ir = parse(tmp_path / "m.keras", SourceSpec(path=tmp_path / "m.keras"))
    assert ir.provenance["reference_varies"] == {"dead": False, "y": True}


def test_trace_error_keeps_its_reason(cli, tmp_path):
    """A spec that fits the declared dims but not the model's computation: the trace's own reason, one line."""
    import keras

    x = keras.Input(shape=(None,), name="x")
    y = keras.layers.Dense(3)(keras.layers.Reshape((2, 4))(x))
    keras.Model(x, y).save(tmp_path / "reshape.keras")
    r = cli("convert", tmp_path / "reshape.keras", "--input", "x:1,7", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot trace" in lines[0] and "in user code" not in lines[0], r.stderr
    assert "reshape" in lines[0].lower() and "7" in lines[0], r.stderr


def normalization_conv():
    """Normalization → Conv2D: the layer's mean and variance are tensors the traced function captures."""
    import keras

    norm = keras.layers.Normalization(mean=[0.485, 0.456, 0.406], variance=[0.05, 0.06, 0.07])
    return keras.Sequential([keras.Input((16, 16, 3)), norm, keras.layers.Conv2D(4, 3)])


def test_normalization_layer_converts_with_parity(tmp_path):
    from modelport.orchestration import ConvertOptions, convert

    normalization_conv().save(tmp_path / "norm.keras")
    report = convert(tmp_path / "norm.keras", tmp_path / "out", ConvertOptions(targets=["onnx"]))
    assert len(report["contract"]["inputs"]) == 1
    assert all(p["ok"] for p in report["parity"]) and report["parity"]


# --- MMdnn's Keras form: architecture JSON + weights -------------------------------------------


@pytest.fixture(scope="module")
def json_pairs(tmp_path_factory):
    """The same kind of CNN as an architecture JSON + weights from Keras 3 (`.weights.h5`
    saved, handed over as `weights.h5`) and from Keras 2 (tf.keras: `save_weights("w.h5")`),
    with each model's own prediction on one input."""
    import shutil

    import keras
    import tf_keras

    d = tmp_path_factory.mktemp("json")
    x = np.random.default_rng(3).standard_normal((2, 16, 16, 3)).astype(np.float32)
    pairs = {}
    for name, lib in (("keras3", keras), ("keras2", tf_keras)):
        inp = lib.Input((16, 16, 3), name="image")
        y = lib.layers.Conv2D(8, 3, activation="relu")(inp)
        y = lib.layers.Dense(4, name="probs")(lib.layers.GlobalAveragePooling2D()(y))
        model = lib.Model(inp, y)
        (d / f"{name}.json").write_text(model.to_json())
        if lib is keras:
            model.save_weights(d / "k3.weights.h5")
            shutil.move(d / "k3.weights.h5", d / f"{name}_weights.h5")
        else:
            model.save_weights(str(d / f"{name}_weights.h5"))
        pairs[name] = (d / f"{name}.json", d / f"{name}_weights.h5", model.predict(x, verbose=0))
    return pairs, x


@pytest.mark.parametrize("name", ["keras3", "keras2"])
def test_json_and_weights_is_a_source(cli, json_pairs, tmp_path, name):
    """`-in model.json -iw weights.h5`: the weights really load (the ONNX model gives the original
    model's numbers, not a random init's)."""
    pairs, x = json_pairs
    arch, weights, want = pairs[name]
    out = tmp_path / "out"
    r = cli("convert", "-in", arch, "-iw", weights, "-df", "onnx", "-om", out, "--json")
    assert r.exit_code == 0, r
    assert r.json()["source"]["format"] == "keras json + weights"
    got = OnnxRuntimeRunner(out / "model.onnx").run({"image": x})
    np.testing.assert_allclose(next(iter(got.values())), want, atol=1e-5)


def test_json_without_weights_and_json_with_a_lambda(cli, json_pairs, tmp_path):
    pairs, _ = json_pairs
    arch, weights, _ = pairs["keras3"]
    r = cli("convert", arch, "-o", tmp_path / "a")
    assert r.exit_code == 2 and "needs its weights" in r.stderr, r
    config = json.loads(arch.read_text())
    config["config"]["layers"].append({"module": "keras.layers", "class_name": "Lambda",
                                       "config": {"name": "evil_lambda", "function": "x"}})
    bad = tmp_path / "evil.json"
    bad.write_text(json.dumps(config))
    r = cli("convert", "-in", bad, "-iw", weights, "-o", tmp_path / "b")
    assert r.exit_code == 3 and "evil_lambda" in r.stderr, r
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.fixture(scope="module")
def applications_h5(tmp_path_factory):
    """keras.applications models saved as legacy .h5: a small ConvNeXt (its `LayerScale` layer) and
    MobileNetV3Small (`x + 3.0` recorded as operations named like the merge layers)."""
    import keras
    from keras.src.applications.convnext import ConvNeXt

    d = tmp_path_factory.mktemp("applications_h5")
    keras.utils.set_random_seed(0)
    ConvNeXt(depths=[1, 1, 1, 1], projection_dims=[8, 16, 24, 32], layer_scale_init_value=0.5, weights=None,
             input_shape=(32, 32, 3), classes=5, name="convnext_small_test").save(d / "convnext.h5")
    keras.applications.MobileNetV3Small(weights=None, input_shape=(32, 32, 3), classes=5).save(d / "mobilenet_v3.h5")
    return d


@pytest.mark.parametrize("name", ["convnext.h5", "mobilenet_v3.h5"])
def test_keras_applications_h5_convert_with_parity(cli, applications_h5, tmp_path, name):
    r = cli("convert", applications_h5 / name, "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.stderr
    report = r.json()
    assert report["source"]["format"] == "keras h5"
    assert all(p["ok"] for p in report["parity"]) and max(_parity(report)) < 1e-4
