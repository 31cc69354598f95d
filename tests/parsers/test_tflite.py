"""TFLite sources: conversion with parity against the LiteRT interpreter, signature names, and the
crash-isolated first load (corrupt flatbuffers, a child killed by a signal, wrong identifiers)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from modelport.errors import BadInputError
from modelport.parsers import SourceSpec, detect, parse
from modelport.parsers.tflite import probe, run_isolated
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.zoo_builders import keras as builders
from tests.conftest import tree


@pytest.fixture(scope="module")
def tflites(tmp_path_factory):
    import tensorflow as tf

    d = tmp_path_factory.mktemp("tflite")
    for name, model in (("cnn", builders.keras_cnn()), ("two_io", builders.keras_two_io())):
        model.export(str(d / f"{name}_sm"), verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(str(d / f"{name}_sm"))
        (d / f"{name}.tflite").write_bytes(converter.convert())
    return d


def test_sniff(tflites):
    assert detect(tflites / "cnn.tflite") == "tflite"


def test_convert_with_parity(cli, tflites, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", tflites / "cnn.tflite", "--to", "onnx", "-o", out, "--json")
    assert r.exit_code == 0, r
    report = r.json()
    (spec,) = report["contract"]["inputs"]
    assert spec["name"] == "image" and spec["layout"] == "NHWC" and spec["shape"] == ["batch", 32, 32, 3]
    assert report["contract"]["outputs"][0]["name"] == "output_0"
    assert all(p["ok"] for p in report["parity"])
    assert (out / "model.onnx").is_file()


def test_two_io_signature_names_and_references(tflites):
    from modelport.runtimes import get_runner

    path = tflites / "two_io.tflite"
    ir = parse(path, SourceSpec(path=path))
    assert sorted(s.name for s in ir.inputs) == ["image", "meta"]
    assert sorted(o.name for o in ir.outputs) == ["output_0", "output_1"]
    assert "interpreter" in ir.reference.producer
    # computed in the child on a second sample set, renamed with the outputs
    assert ir.provenance["reference_varies"] == {"output_0": True, "output_1": True}
    # the references are the interpreter's own outputs on the sample inputs
    runner = get_runner("tflite", path)
    again = runner.run({k: ir.reference.inputs[k] for k in ("image", "meta")})
    assert sorted(v.shape for v in again.values()) == sorted(v.shape for v in ir.reference.outputs.values())
    for v in again.values():
        assert any(np.array_equal(v, ref) for ref in ir.reference.outputs.values())
    onnx_out = OnnxRuntimeRunner(ir.model).run(ir.reference.inputs)
    for name, ref in ir.reference.outputs.items():
        np.testing.assert_allclose(onnx_out[name], ref, atol=1e-4)


def test_child_killed_by_signal_is_a_bad_input(tmp_path):
    with pytest.raises(BadInputError, match="SIGSEGV"):
        run_isolated("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", [], path=tmp_path / "x.tflite")
    with pytest.raises(BadInputError, match="SIGABRT"):
        run_isolated("import os; os.abort()", [], path=tmp_path / "x.tflite")
    with pytest.raises(BadInputError, match="did not finish"):
        run_isolated("import time; time.sleep(30)", [], path=tmp_path / "x.tflite", timeout=1)


@pytest.mark.parametrize("target,sig", [("tf2onnx.convert:from_tflite", "SIGSEGV"),
                                        ("modelport.runtimes.tflite:load_interpreter", "SIGABRT")])
def test_crash_during_conversion_exit_2_names_signal(cli, tflites, tmp_path, monkeypatch, target, sig):
    """tf2onnx's own read of the flatbuffer, like the interpreter's, happens in the child: a crash
    there ends the run with exit 2 naming the signal, and nothing is written."""
    from tests.runtimes.crash_injection import inject_crash

    inject_crash(monkeypatch, tmp_path / "hook", target, sig)
    src = tmp_path / "src" / "cnn.tflite"
    src.parent.mkdir()
    src.write_bytes((tflites / "cnn.tflite").read_bytes())
    r = cli("convert", src, "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert sig in r.stderr and "cnn.tflite" in r.stderr
    assert not (tmp_path / "out").exists()
    assert [p for p in tree(tmp_path) if not p.startswith("hook")] == ["src", "src/cnn.tflite"]


def _corrupt(raw: bytes, kind: str) -> bytes:
    if kind == "garbage_tables":
        # valid root offset and 'TFL3' identifier, the tables behind them garbage
        return raw[:8] + bytes((i * 37 + 11) % 256 for i in range(len(raw) - 8))
    if kind == "bad_root":
        return struct.pack("<I", 0x7FFFFFF0) + raw[4:]
    if kind == "truncated":
        return raw[: len(raw) // 2]
    if kind == "wrong_identifier":
        return raw[:4] + b"XXXX" + raw[8:]
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["garbage_tables", "bad_root", "truncated", "wrong_identifier"])
def test_corrupt_flatbuffer_exit_2_without_output(cli, tflites, tmp_path, kind):
    bad = tmp_path / "src" / "bad.tflite"
    bad.parent.mkdir()
    bad.write_bytes(_corrupt((tflites / "cnn.tflite").read_bytes(), kind))
    out = tmp_path / "out"
    r = cli("convert", bad, "-o", out)
    assert r.exit_code == 2, r
    assert "bad.tflite" in r.stderr
    assert tree(tmp_path) == ["src", "src/bad.tflite"]


def test_inspect(cli, tflites):
    r = cli("inspect", tflites / "two_io.tflite", "--json")
    assert r.exit_code == 0, r
    info = r.json()
    assert info["signatures"] == ["serving_default"]
    assert sorted(i["name"] for i in info["inputs"]) == ["image", "meta"]
    assert info["ops"]


def test_json_stdout_is_one_document(cli_proc, tflites, tmp_path):
    r = cli_proc("convert", tflites / "cnn.tflite", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    import json

    assert json.loads(r.stdout)["status"] == "ok"


def test_int8_io_source_keeps_integer_io(tmp_path):
    """A full-integer .tflite with int8 I/O: the IR takes and returns int8 like the file, and the
    references are the interpreter's raw int8 outputs, so parity is exact."""
    from tests.tflite_models import write_int8_io_tflite

    path = write_int8_io_tflite(tmp_path / "q.tflite")
    ir = parse(path, SourceSpec(path=path))
    assert ir.inputs[0].dtype == "int8" and ir.outputs[0].dtype == "int8"
    ref = next(iter(ir.reference.outputs.values()))
    assert ref.dtype == np.int8
    got = OnnxRuntimeRunner(ir.model).run(ir.reference.inputs)
    np.testing.assert_array_equal(got[ir.outputs[0].name], ref)


def test_given_inputs_reach_the_child_reference_run(tflites):
    """--value/--data travel to the child process that computes the TFLite references."""
    path = tflites / "two_io.tflite"
    ir = parse(path, SourceSpec(path=path, given={"meta": np.asarray(0.5)}))
    meta = ir.reference.inputs["meta"]
    assert meta.dtype == np.float32 and meta.size and (meta == 0.5).all()
    assert ir.provenance["reference_varies"] == {"output_0": True, "output_1": True}  # the image stays random
    with pytest.raises(BadInputError, match=r"'rate'.*\['image', 'meta'\]|'rate'.*\['meta', 'image'\]"):
        parse(path, SourceSpec(path=path, given={"rate": np.asarray(1)}))


def _gelu_tflite(path, *, approximate: bool):
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32, name="x")])
    def f(x):
        return {"y": tf.nn.gelu(x * 3.0, approximate=approximate)}

    path.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()]).convert())
    return path


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_builtin_converts_with_parity(tmp_path, approximate):
    path = _gelu_tflite(tmp_path / "gelu.tflite", approximate=approximate)
    assert "GELU" in probe(path, SourceSpec(path=path))["ops"]
    ir = parse(path, SourceSpec(path=path))
    assert not [n.op_type for n in ir.model.graph.node if n.op_type.startswith("TFL_")]
    got = OnnxRuntimeRunner(ir.model).run(ir.reference.inputs)
    (name,) = ir.reference.outputs
    np.testing.assert_allclose(got[name], ir.reference.outputs[name], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name, op", [("mediapipe/selfie_segmentation", "Convolution2DTransposeBias"),
                                      ("mediapipe/face_detection_full_range_sparse", "DENSIFY")])
def test_mediapipe_tflite_specific_ops_convert_with_parity(cli, tmp_path, name, op):
    """A mediapipe custom op (transposed convolution with bias) and sparse weights behind DENSIFY ops."""
    from tests.wheel_models import wheel_model

    path = wheel_model(name, tmp_path / "src")
    r = cli("convert", path, "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.stderr
    report = r.json()
    assert report["parity"] and all(p["ok"] for p in report["parity"])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_keras_recurrent_tflite_converts_with_parity(cli, tmp_path, kind):
    """A Keras LSTM becomes TFLite's fused UNIDIRECTIONAL_SEQUENCE_LSTM with variable (dataless)
    state tensors; a GRU becomes a WHILE loop."""
    import tensorflow as tf
    import tf_keras

    tf.random.set_seed(0)
    x = tf_keras.Input((7, 4), batch_size=1, name="x")
    model = tf_keras.Model(x, tf_keras.layers.Dense(3)(getattr(tf_keras.layers, kind)(6)(x)))
    path = tmp_path / f"{kind}.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    r = cli("convert", path, "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.stderr
    report = r.json()
    assert report["parity"] and all(p["ok"] for p in report["parity"])


def test_dynamic_range_quantised_source_is_judged_at_its_own_precision(cli, tflites, tmp_path):
    """A dynamic-range quantised file (int8 weights, float I/O): LiteRT's hybrid kernels quantise the
    activations to int8 at run time, tf2onnx's IR computes in float. The IR hop was judged with the
    fp32 tolerance and failed (exit 4, max abs 0.014 against an effective atol of 1.5e-4); the parser
    records the source's precision and every hop is judged with the int8 defaults, which the report
    says (the source's `source_precision`, each parity entry's tolerance `basis`, a warning)."""
    from tests.tflite_models import write_dynamic_range_tflite, write_int8_io_tflite

    path = write_dynamic_range_tflite(tmp_path / "dr.tflite")
    out = tmp_path / "out"
    r = cli("convert", path, "--to", "onnx", "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    report = r.json()
    assert report["source"]["source_precision"] == "int8-dynamic-range"
    ir_hop = next(p for p in report["parity"] if p["hop"].endswith("(IR)"))
    assert ir_hop["ok"] and ir_hop["tolerance"]["min_cosine"] == 0.98
    assert "int8 defaults" in ir_hop["tolerance"]["basis"] and "int8-dynamic-range" in ir_hop["tolerance"]["basis"]
    (y,) = ir_hop["outputs"]
    assert y["max_abs"] > 1e-4 * y["tolerance"]["scale"]  # what the fp32 tolerance refused: int8 error, not a bug
    assert y["cosine"] > 0.99
    assert all(p["ok"] and "basis" in p["tolerance"] for p in report["parity"])
    assert any("dynamic-range quantised: 2 op(s)" in w for w in report["warnings"])
    assert any("judged against the source's outputs with the int8 defaults" in w for w in report["warnings"])
    assert (out / "model.onnx").is_file()
    # a float file and a full-integer one compute as their tensors say: judged as before
    assert probe(tflites / "cnn.tflite", SourceSpec(path=tflites / "cnn.tflite"))["precision"][0] is None
    q = write_int8_io_tflite(tmp_path / "q.tflite")
    assert probe(q, SourceSpec(path=q))["precision"][0] is None
