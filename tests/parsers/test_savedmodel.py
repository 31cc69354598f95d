"""SavedModel folders: Keras `model.export` output and hand-written tf.Modules, signature choice,
the file/Python op screen, corrupt folders and `inspect`."""

from __future__ import annotations

import pytest

from modelport.parsers import SourceSpec, detect, parse
from modelport.zoo_builders import keras as builders
from tests.conftest import tree
from tests.parsers.test_keras import half_dead_keras


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import tensorflow as tf

    d = tmp_path_factory.mktemp("savedmodel")
    builders.keras_two_io().export(str(d / "two_io"), verbose=False)
    builders.keras_rnn().export(str(d / "rnn"), verbose=False)

    class Multi(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal([4, 3], seed=[1, 2]))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def project(self, x):
            return {"y": tf.matmul(x, self.w)}

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="a"),
                                      tf.TensorSpec([None, 4], tf.float32, name="b")])
        def combine(self, a, b):
            return {"sum": a + b, "prod": a * b}

    m = Multi()
    tf.saved_model.save(m, str(d / "multi"), signatures={"project": m.project, "combine": m.combine})

    marker = d / "marker.txt"

    class Writer(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            tf.io.write_file(str(marker), "pwned")
            return {"y": x * 2.0}

    w = Writer()
    tf.saved_model.save(w, str(d / "writer"), signatures={"serving_default": w.serve})
    return d, marker


def test_tensorflow_abort_during_conversion_exit_2(cli, saved, tmp_path, monkeypatch):
    """Loading, running and converting the graph happen in a child: an abort there is exit 2, no output."""
    from tests.runtimes.crash_injection import inject_crash

    d, _ = saved
    inject_crash(monkeypatch, tmp_path / "hook", "tf2onnx.convert:from_graph_def", "SIGABRT")
    r = cli("convert", d / "two_io", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "SIGABRT" in r.stderr and "two_io" in r.stderr
    assert not (tmp_path / "out").exists()


def test_sniff(saved):
    d, _ = saved
    assert detect(d / "two_io") == "savedmodel"
    assert detect(d / "two_io" / "saved_model.pb") == "savedmodel"


def test_keras_export_converts_with_parity(cli, saved, tmp_path):
    d, _ = saved
    out = tmp_path / "out"
    r = cli("convert", d / "two_io", "--to", "onnx", "-o", out, "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert report["source"]["format"] == "savedmodel"
    inputs = {s["name"]: s for s in report["contract"]["inputs"]}
    assert inputs["image"]["layout"] == "NHWC" and inputs["image"]["shape"] == ["batch", 16, 16, 3]
    assert [o["name"] for o in report["contract"]["outputs"]] == ["output_0", "output_1"]
    assert all(p["ok"] for p in report["parity"])
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "reference.npz", "report.html", "report.json"]


def test_rnn_savedmodel(saved):
    d, _ = saved
    ir = parse(d / "rnn", SourceSpec(path=d / "rnn", sample_dims={"sequence_dim1": 7}))
    assert ir.reference.inputs["sequence"].shape == (2, 7, 6)
    assert ir.reference.producer.startswith("tensorflow ") and "serving_default" in ir.reference.producer


def test_signature_choice(cli, saved, tmp_path):
    d, _ = saved
    r = cli("convert", d / "multi", "-o", tmp_path / "a")
    assert r.exit_code == 2 and "--signature" in r.stderr and "combine" in r.stderr
    r = cli("convert", d / "multi", "-o", tmp_path / "b", "--signature", "nope")
    assert r.exit_code == 2 and "nope" in r.stderr
    r = cli("convert", d / "multi", "-o", tmp_path / "c", "--signature", "combine", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert [s["name"] for s in report["contract"]["inputs"]] == ["a", "b"]
    assert [s["name"] for s in report["contract"]["outputs"]] == ["prod", "sum"]
    assert all(p["ok"] for p in report["parity"])
    ir = parse(d / "multi", SourceSpec(path=d / "multi", options={"signature": "project"}))
    assert ir.provenance["signature"] == "project" and [o.name for o in ir.outputs] == ["y"]


def test_file_writing_graph_refused(cli, saved, tmp_path):
    d, marker = saved
    r = cli("convert", d / "writer", "-o", tmp_path / "out")
    assert r.exit_code == 3, r
    assert "WriteFile" in r.stderr
    assert not marker.exists() and tree(tmp_path) == []


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_savedmodel_exit_2(cli, saved, tmp_path, damage):
    import shutil

    d, _ = saved
    bad = tmp_path / "bad"
    shutil.copytree(d / "two_io", bad)
    pb = bad / "saved_model.pb"
    raw = pb.read_bytes()
    pb.write_bytes({"truncate": raw[: len(raw) // 2], "garbage": b"\xff\xfe garbage " * 50, "empty": b""}[damage])
    r = cli("convert", bad, "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "saved_model.pb" in r.stderr and not (tmp_path / "out").exists()


def test_missing_variables_exit_2(cli, saved, tmp_path):
    import shutil

    d, _ = saved
    bad = tmp_path / "novars"
    shutil.copytree(d / "two_io", bad)
    shutil.rmtree(bad / "variables")
    r = cli("convert", bad, "-o", tmp_path / "out")
    assert r.exit_code == 2, r


def test_inspect_lists_signatures(cli, saved):
    d, _ = saved
    r = cli("inspect", d / "multi", "--json")
    assert r.exit_code == 0, r
    info = r.json()
    assert set(info["signatures"]) == {"project", "combine"}
    assert [i["name"] for i in info["signatures"]["combine"]["inputs"]] == ["a", "b"]
    assert info["ops"]


def test_from_tensorflow_spelling_accepts_a_savedmodel(cli, saved, tmp_path):
    d, _ = saved
    r = cli("convert", "-sf", "tensorflow", "-in", d / "two_io", "-df", "onnx", "-om", tmp_path / "out")
    assert r.exit_code == 0, r


def test_reference_varies_crosses_the_savedmodel_child(tmp_path):
    """SavedModel parsing runs in a child process: the finding comes back with the IR."""
    half_dead_keras().export(str(tmp_path / "sm"), verbose=False)
    ir = parse(tmp_path / "sm", SourceSpec(path=tmp_path / "sm"))
    assert ir.provenance["reference_varies"] == {"dead": False, "y": True}


def test_normalization_layer_savedmodel_converts_with_parity(tmp_path):
    from modelport.orchestration import ConvertOptions, convert
    from tests.parsers.test_keras import normalization_conv

    normalization_conv().export(str(tmp_path / "sm"), verbose=False)
    report = convert(tmp_path / "sm", tmp_path / "out", ConvertOptions(targets=["onnx"]))
    assert len(report["contract"]["inputs"]) == 1
    assert all(p["ok"] for p in report["parity"]) and report["parity"]
