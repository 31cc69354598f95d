"""`modelport validate A B`: same inputs to both, exit 4 on a mismatch, --localize names the node."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """A CNN as ONNX, the same as TFLite and ORT, and an ONNX copy with one conv's weights changed."""
    from modelport.orchestration import ConvertOptions, convert
    from modelport.zoo_builders.pytorch import cnn_small

    d = tmp_path_factory.mktemp("v")
    convert(cnn_small(), d / "out", ConvertOptions(targets=["onnx", "tflite", "ort"], inputs=["x:batch,3,32,32"]))
    model = onnx.load(str(d / "out/model.onnx"))
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    target = convs[2]
    init = next(t for t in model.graph.initializer if t.name == target.input[1])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(model, str(d / "broken.onnx"))
    return d, target.name


def test_same_model_in_three_runtimes_matches(cli, variants):
    d, _ = variants
    for other in ("model.tflite", "model.ort"):
        r = cli("validate", d / "out/model.onnx", d / "out" / other, "--json")
        assert r.exit_code == 0, r
        assert r.json()["status"] == "ok" and r.json()["parity"][0]["ok"]


def test_mismatch_exit_4_and_localize(cli, variants):
    d, conv = variants
    r = cli("validate", d / "out/model.onnx", d / "broken.onnx", "--localize", "--json")
    assert r.exit_code == 4
    report = r.json()
    assert report["status"] == "failed" and report["localize"]["node"] == conv
    assert conv in r.stderr


def test_localize_scope_for_tflite_is_stated(cli, variants, tmp_path):
    d, _ = variants
    r = cli("validate", d / "broken.onnx", d / "out/model.tflite", "--localize", "--json")
    assert r.exit_code == 4 and "supported: ONNX files and the models onnxruntime and openvino run" in r.json()["localize"]["note"]


def test_user_inputs_and_bad_files(cli, variants, tmp_path):
    d, _ = variants
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.zeros((1, 3, 32, 32), np.float32))
    assert cli("validate", d / "out/model.onnx", d / "out/model.ort", "--data", npz).exit_code == 0
    assert cli("validate", d / "out/model.onnx", d / "out/model.ort", "--inputs", npz).exit_code == 0  # the older spelling
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 64)
    r = cli("validate", d / "out/model.onnx", bad)
    assert r.exit_code == 2
    r = cli("validate", d / "out/model.onnx", tmp_path / "in.npz")
    assert r.exit_code == 2 and "cannot run this kind of file" in r.stderr


@pytest.mark.parametrize("kind", ["garbage_tables", "bad_root", "truncated", "wrong_identifier"])
def test_corrupt_tflite_is_exit_2_not_a_crash(cli, variants, tmp_path, kind):
    from tests.parsers.test_tflite import _corrupt

    d, _ = variants
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(_corrupt((d / "out/model.tflite").read_bytes(), kind))
    for pair in ((d / "out/model.onnx", bad), (bad, d / "out/model.onnx")):
        r = cli("validate", *pair, "--json")
        assert r.exit_code == 2, r
        assert "bad.tflite" in r.stderr


@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGABRT"])
def test_tflite_side_runs_in_a_child(cli, variants, tmp_path, monkeypatch, sig):
    """The interpreter dying on the user's file ends validate with exit 2 naming the signal."""
    from tests.runtimes.crash_injection import inject_crash

    d, _ = variants
    inject_crash(monkeypatch, tmp_path / "hook", "modelport.runtimes.tflite:load_interpreter", sig)
    r = cli("validate", d / "out/model.onnx", d / "out/model.tflite")
    assert r.exit_code == 2, r
    assert sig in r.stderr and "model.tflite" in r.stderr
    monkeypatch.delenv("MODELPORT_TEST_CRASH")
    assert cli("validate", d / "out/model.onnx", d / "out/model.tflite").exit_code == 0


def test_outputs_paired_by_name_unless_asked_by_position(cli, tiny_onnx, tmp_path):
    """Another output name is a mismatch (exit 4 naming both); --match-by-position pairs them in order."""
    renamed = onnx.load(str(tiny_onnx))
    renamed.graph.node[-1].output[0] = "probs"
    renamed.graph.output[0].name = "probs"
    onnx.save(renamed, str(tmp_path / "renamed.onnx"))
    r = cli("validate", tiny_onnx, tmp_path / "renamed.onnx")
    assert r.exit_code == 4, r
    assert "['y'] missing" in r.stderr and "['probs']" in r.stderr and "--match-by-position" in r.stderr
    ok = cli("validate", tiny_onnx, tmp_path / "renamed.onnx", "--match-by-position", "--json")
    assert ok.exit_code == 0, ok
    assert ok.json()["parity"][0]["outputs"][0]["name"] == "y"


def test_validate_per_output_tolerance(cli, tiny_onnx, tmp_path):
    model = onnx.load(str(tiny_onnx))
    b = next(t for t in model.graph.initializer if t.name == "b")
    b.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(b) + 0.05, "b"))
    onnx.save(model, str(tmp_path / "shifted.onnx"))
    assert cli("validate", tiny_onnx, tmp_path / "shifted.onnx").exit_code == 4
    r = cli("validate", tiny_onnx, tmp_path / "shifted.onnx", "--atol", "y=0.06", "--json")
    assert r.exit_code == 0, r
    assert r.json()["parity"][0]["outputs"][0]["tolerance"]["atol"] == 0.06
    assert cli("validate", tiny_onnx, tmp_path / "shifted.onnx", "--atol", "logits=0.06").exit_code == 2


def test_data_and_value_pin_a_control_input(cli, tmp_path):
    from tests.test_samples import _control_input_model

    model = _control_input_model(tmp_path / "vad.onnx")
    r = cli("validate", model, model)
    assert r.exit_code == 2 and "reference run failed" in r.stderr and "['sr']" in r.stderr, r
    assert cli("validate", model, model, "--value", "sr=16000").exit_code == 0
    npz = tmp_path / "in.npz"
    np.savez(npz, sr=np.asarray(16000, np.int64))
    r = cli("validate", model, model, "--data", npz, "--json")
    assert r.exit_code == 0 and r.json()["status"] == "ok", r
    np.savez(npz, sr=np.asarray(16000, np.int64), rate=np.asarray(1))
    r = cli("validate", model, model, "--data", npz)
    assert r.exit_code == 2 and "'rate'" in r.stderr and "['x', 'sr']" in r.stderr, r


@pytest.fixture(scope="module")
def mlp_sources(tmp_path_factory):
    """The zoo MLP as a .pt2 source, converted to ONNX and to PyTorch code."""
    from modelport.orchestration import ConvertOptions, convert
    from modelport.zoo_builders import save_source

    d = tmp_path_factory.mktemp("src")
    save_source("mlp", d / "src")
    convert(d / "src" / "model.pt2", d / "out", ConvertOptions(targets=["onnx", "pytorch"]))
    return d


def test_validate_takes_sources_and_pytorch_code_on_either_side(cli_proc, mlp_sources, tmp_path):
    d = mlp_sources
    r = cli_proc("validate", d / "src/model.pt2", d / "out/model.onnx", "--json")
    assert r.exit_code == 0, r
    doc = r.json()
    assert doc["a"]["kind"] == "source:pytorch" and doc["b"]["kind"] == "onnx" and doc["parity"][0]["ok"]
    name = doc["parity"][0]["outputs"][0]["name"]
    npz = tmp_path / "x.npz"
    np.savez(npz, x=np.linspace(-1, 1, 3 * 32, dtype=np.float32).reshape(3, 32))
    r = cli_proc("validate", d / "out/pytorch", d / "src/model.pt2", "--trust", "--data", npz, "--atol", f"{name}=1e-5", "--json")
    assert r.exit_code == 0, r
    doc = r.json()
    assert doc["a"]["kind"] == "pytorch_code" and doc["b"]["kind"] == "source:pytorch" and doc["inputs"] == {"x": [3, 32]}
    assert doc["parity"][0]["outputs"][0]["tolerance"]["atol"] == 1e-5
    refused = cli_proc("validate", d / "out/pytorch", d / "out/model.onnx")
    assert refused.exit_code == 3 and "--trust" in refused.stderr


def test_validate_prints_the_per_output_table_on_failure(cli_proc, tiny_onnx, tmp_path):
    model = onnx.load(str(tiny_onnx))
    b = next(t for t in model.graph.initializer if t.name == "b")
    b.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(b) + 0.5, "b"))
    onnx.save(model, str(tmp_path / "shifted.onnx"))
    r = cli_proc("validate", tiny_onnx, tmp_path / "shifted.onnx")
    assert r.exit_code == 4, r
    table = r.stderr[: r.stderr.index("error:")]
    assert "max abs" in table and "cosine" in table and " y " in table and "models differ" in table


def test_validate_inputs_is_a_hidden_deprecated_spelling_of_data(cli_proc, tiny_onnx, tmp_path):
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.ones((2, 8), np.float32))
    r = cli_proc("validate", tiny_onnx, tiny_onnx, "--inputs", npz, "--json")
    assert r.exit_code == 0 and r.json()["inputs"] == {"x": [2, 8]}, r
    assert "--inputs" in r.stderr and "deprecated" in r.stderr and "--data" in r.stderr
    assert "--inputs" not in cli_proc("validate", "--help").stdout
    r = cli_proc("validate", tiny_onnx, tiny_onnx, "--input", "x:4,8")
    assert r.exit_code == 2 and "--dim" in r.stderr


def test_validate_a_keras_source_against_its_conversion(cli_proc, tmp_path):
    from modelport.orchestration import ConvertOptions, convert
    from modelport.zoo_builders import save_source

    save_source("keras_two_io", tmp_path / "src")
    source = next((tmp_path / "src").glob("*.keras"))
    convert(source, tmp_path / "out", ConvertOptions(targets=["onnx"]))
    r = cli_proc("validate", source, tmp_path / "out/model.onnx", "--json")
    assert r.exit_code == 0, r
    doc = r.json()
    assert doc["a"]["kind"] == "source:keras" and len(doc["parity"][0]["outputs"]) == 2 and doc["parity"][0]["ok"]
