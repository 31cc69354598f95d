"""`modelport convert` end to end through the CLI: outputs, report, exit codes, bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from tests.conftest import tree


@pytest.fixture(scope="module")
def cnn_source(tmp_path_factory) -> Path:
    from modelport.zoo_builders import save_source

    d = tmp_path_factory.mktemp("cnn") / "src"
    save_source("cnn_small", d)
    return d


def test_convert_pt2_writes_model_and_report(cli, cnn_source, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", cnn_source / "model.pt2", "--input", "input:batch,3,64,64", "--layout", "NCHW",
            "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225", "--to", "onnx", "-o", out)
    assert r.exit_code == 0, r
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "reference.npz", "report.html", "report.json"]
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "modelport.report/1" and report["status"] == "ok"
    spec = report["contract"]["inputs"][0]
    assert spec == {"name": "input", "dtype": "float32", "shape": ["batch", 3, 64, 64], "layout": "NCHW",
                    "preprocess": {"scale": None, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "channel_order": None}}
    assert [p["hop"] for p in report["parity"]] == ["pytorch→onnx (IR)", "pytorch→onnx (end to end)"]
    assert all(p["ok"] for p in report["parity"])
    o = report["parity"][-1]["outputs"][0]
    assert o["max_abs"] < 1e-4 and o["cosine"] > 0.9999
    assert report["source"]["sha256"] and report["tool"]["onnxruntime"]
    # the model really has a dynamic batch
    model = onnx.load(out / "model.onnx")
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    y = OnnxRuntimeRunner(out / "model.onnx").run({"input": np.zeros((3, 3, 64, 64), np.float32)})
    assert y["output"].shape == (3, 10)


def test_mmdnn_spelling(cli, cnn_source, tmp_path):
    out = tmp_path / "mm"
    r = cli("convert", "-sf", "pytorch", "-iw", cnn_source / "model.safetensors", "-in", "zoo:cnn_small",
            "-df", "onnx", "-om", out, "--inputShape", "1,3,64,64", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert report["contract"]["inputs"][0]["shape"] == [1, 3, 64, 64]
    assert (out / "model.onnx").exists()


def test_zoo_source_and_transformer(cli, tmp_path):
    r = cli("convert", "zoo:bert_tiny", "-o", tmp_path / "bert", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert [s["name"] for s in report["contract"]["inputs"]] == ["input_ids", "attention_mask"]
    assert {o["name"] for o in report["parity"][-1]["outputs"]} == {"last_hidden_state", "pooler_output"}


def test_existing_output_needs_force(cli, tiny_onnx, tmp_path):
    out = tmp_path / "out"
    assert cli("convert", tiny_onnx, "-o", out).exit_code == 0
    before = (out / "model.onnx").read_bytes()
    r = cli("convert", tiny_onnx, "-o", out)
    assert r.exit_code == 2 and "--force" in r.stderr
    r = cli("convert", tiny_onnx, "-o", out, "--force")
    assert r.exit_code == 0
    assert (out / "model.onnx").read_bytes() == before  # a rerun is byte-identical


@pytest.mark.parametrize("where", ["input-folder", "input-file", "parent-of-input-folder"])
def test_output_over_input_refused_before_any_write(cli, tiny_onnx, where):
    src = tiny_onnx.parent
    before = tree(src.parent)
    out = {"input-folder": src, "input-file": tiny_onnx, "parent-of-input-folder": src.parent}[where]
    r = cli("convert", tiny_onnx, "-o", out, "--force")
    assert r.exit_code == 2 and "would overwrite or contain the input" in r.stderr
    assert tree(src.parent) == before


def test_output_beside_the_input_is_fine(cli, tiny_onnx):
    r = cli("convert", tiny_onnx, "-o", tiny_onnx.parent / "out")
    assert r.exit_code == 0 and tiny_onnx.exists()


def test_parity_failure_exits_4_and_removes_output(cli, cnn_source, tmp_path):
    out = tmp_path / "strict"
    r = cli("convert", cnn_source / "model.pt2", "--input", "input:batch,3,64,64", "-o", out,
            "--atol", "0", "--rtol", "0", "--json")
    assert r.exit_code == 4, r
    assert not out.exists() and list(tmp_path.iterdir()) == []
    report = r.json()
    assert report["status"] == "failed" and report["error"]["type"] == "ValidationError"
    assert report["parity"][0]["outputs"][0]["max_abs"] > 0


@pytest.mark.parametrize("args,code,text", [
    (["--input", "x:1x8x?x"], 2, "bad shape"),
    (["--input", "image:1x8"], 2, "the model's inputs are ['x']"),
    (["--to", "caffe"], 2, "unknown target"),
])
def test_bad_specs(cli, tiny_onnx, tmp_path, args, code, text):
    r = cli("convert", tiny_onnx, "-o", tmp_path / "o", *args)
    assert r.exit_code == code and text in r.stderr, r
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("content,name", [(b"", "empty.onnx"), (b"\x08\x07\x12\x03abc\x3a\xff\xff", "trunc.onnx"),
                                          (b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 9\n", "model.pt")])
def test_bad_files_exit_2(cli, tmp_path, content, name):
    src = tmp_path / "in"
    src.mkdir()
    p = src / name
    p.write_bytes(content)
    r = cli("convert", p, "-o", tmp_path / "o", "--input", "x:1x8")
    assert r.exit_code == 2, r
    assert str(p) in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() and p.read_bytes() == content


def test_unsafe_pickle_exits_3(cli, tmp_path):
    import torch

    from tests.parsers.test_pytorch import Marker

    marker = tmp_path / "marker"
    p = tmp_path / "evil.pt"
    torch.save(Marker(marker), p)
    r = cli("convert", p, "--input", "x:1x32", "-o", tmp_path / "o")
    assert r.exit_code == 3 and "unsafe pickle global" in r.stderr
    assert not marker.exists() and not (tmp_path / "o").exists()


def test_external_data_outside_folder_exits_3(cli, tmp_path):
    from tests.test_onnx_io import external_model

    inner = tmp_path / "m"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    r = cli("convert", external_model(inner, "../secret.bin"), "-o", tmp_path / "o")
    assert r.exit_code == 3 and "outside the model folder" in r.stderr
    assert not (tmp_path / "o").exists()


def test_external_data_past_end_exits_2(cli, tmp_path):
    from tests.test_onnx_io import external_model

    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    r = cli("convert", external_model(tmp_path, "w.bin", length=10**12), "-o", tmp_path / "o")
    assert r.exit_code == 2 and "past the end" in r.stderr


def test_json_is_one_document_on_stdout(cli_proc, tiny_onnx, tmp_path):
    r = cli_proc("convert", tiny_onnx, "-o", tmp_path / "o", "--json")
    assert r.exit_code == 0, r
    assert json.loads(r.stdout)["status"] == "ok"


def test_json_stdout_clean_with_torch_export(cli_proc, tmp_path):
    """The torch exporter prints progress lines; none may reach stdout."""
    r = cli_proc("convert", "zoo:mlp", "-o", tmp_path / "o", "--json")
    assert r.exit_code == 0, r
    assert json.loads(r.stdout)["status"] == "ok"


def test_contract_travels_inside_the_onnx_file(cli, tmp_path):
    """A modelport-written model.onnx carries its contract; converting it again keeps it."""
    first = tmp_path / "first"
    assert cli("convert", "zoo:bert_tiny", "-o", first).exit_code == 0
    model = onnx.load(first / "model.onnx")
    stored = json.loads({p.key: p.value for p in model.metadata_props}["modelport.contract"])
    assert stored["inputs"][0]["value_range"] == [0, 1000]
    again = cli("convert", first / "model.onnx", "-o", tmp_path / "second", "--json").json()
    assert again["contract"]["inputs"] == json.loads((first / "report.json").read_text())["contract"]["inputs"]
    assert again["contract"]["sample_dims"] == {"batch": 2, "sequence": 16}


def test_unnamed_options_apply_to_the_models_inputs_by_position(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "-o", tmp_path / "o", "--inputShape", "3,8", "--layout", "NC", "--mean", "0.5", "--json")
    assert r.exit_code == 0, r
    spec = r.json()["contract"]["inputs"][0]
    assert (spec["name"], spec["shape"], spec["layout"], spec["preprocess"]["mean"]) == ("x", [3, 8], "NC", [0.5])
    r = cli("convert", tiny_onnx, "-o", tmp_path / "p", "--inputShape", "3,8", "--inputShape", "1,2")
    assert r.exit_code == 2 and "2 input specs given, the model has 1" in r.stderr


def _constant_output_onnx(folder: Path) -> Path:
    """y = relu(x @ w) depends on x; c = x * 0 + 1 does not (a reference that proves nothing)."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    zero = numpy_helper.from_array(np.zeros((8,), np.float32), "zero")
    one = numpy_helper.from_array(np.ones((8,), np.float32), "one")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Relu", ["mm"], ["y"]),
         helper.make_node("Mul", ["x", "zero"], ["z"]), helper.make_node("Add", ["z", "one"], ["c"])],
        "const", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, ["batch", 8])], initializer=[w, zero, one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "const.onnx"))
    return folder / "const.onnx"


def test_reference_that_ignores_its_input_is_recorded_and_warned(cli, tmp_path):
    src = _constant_output_onnx(tmp_path / "src")
    r = cli("convert", src, "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    varies = {o["name"]: o.get("reference_varies") for o in r.json()["contract"]["outputs"]}
    assert varies == {"y": True, "c": False}
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "['c']" in warnings[0] and "'y'" not in warnings[0]
    assert r.json()["warnings"] == [warnings[0][len("warning: "):]]


def test_reference_that_ignores_its_input_fails_under_strict(cli, tmp_path):
    src = _constant_output_onnx(tmp_path / "src")
    r = cli("convert", src, "--to", "onnx", "-o", tmp_path / "out", "--strict")
    assert r.exit_code == 4, r
    assert "['c']" in r.stderr and "--strict" in r.stderr
    assert not (tmp_path / "out").exists()


def test_normal_model_reference_varies(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "--to", "onnx", "-o", tmp_path / "out", "--strict", "--json")
    assert r.exit_code == 0, r
    assert [o["reference_varies"] for o in r.json()["contract"]["outputs"]] == [True]
    assert r.json()["warnings"] == [] and "warning" not in r.stderr


def test_per_output_tolerance_and_unknown_output_name(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "--to", "onnx", "-o", tmp_path / "out", "--atol", "y=0.5", "--rtol", "0", "--json")
    assert r.exit_code == 0, r
    hop = r.json()["parity"][-1]
    assert hop["tolerance"]["outputs"] == {"y": {"atol": 0.5}} and hop["tolerance"]["rtol"] == 0
    assert hop["outputs"][0]["tolerance"]["atol"] == 0.5 and hop["outputs"][0]["tolerance"]["rtol"] == 0
    bad = cli("convert", tiny_onnx, "--to", "onnx", "-o", tmp_path / "bad", "--atol", "probs=0.1")
    assert bad.exit_code == 2 and "probs" in bad.stderr and "'y'" in bad.stderr
    assert not (tmp_path / "bad").exists()
    assert cli("convert", tiny_onnx, "-o", tmp_path / "bad2", "--min-cosine", "y=abc").exit_code == 2


TIMINGS = ("started", "seconds", "peak_rss")


def without_timings(value):
    """report.json minus its wall-clock and memory measurements, the only fields a rerun may change."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


@pytest.mark.parametrize("command", ["convert", "emit"])
def test_rerun_is_byte_identical_for_every_target(cli, cnn_source, tiny_onnx, tmp_path, command):
    """Every target that runs on this machine, written twice into two folders: the same bytes. The
    PyTorch source takes every target; the ONNX source takes those with a native route from a PyTorch
    source (which the PyTorch source's run may take instead), so that their ONNX routes are written
    twice as well. The other targets' ONNX routes start from the same IR in both cases."""
    from modelport.emitters import EMITTERS
    from modelport.emitters.routes import native_routes

    # TensorRT engines need a GPU; ort-genai is for decoder LMs (--task text-generation, tests/orchestration)
    every = [t for t in EMITTERS if t not in ("tensorrt", "ort-genai")]
    native_from_torch = [t for t in every if f"pytorch→{t}" in native_routes()]
    assert {"tflite", "executorch", "coreml"} <= set(native_from_torch)
    args = {"convert": ("convert", cnn_source / "model.pt2", "--input", "input:batch,3,64,64", "--to", ",".join(every), "-q"),
            "emit": ("emit", tiny_onnx, "--to", ",".join(native_from_torch), "-q")}[command]
    for name in ("a", "b"):
        r = cli(*args, "-o", tmp_path / name)
        assert r.exit_code == 0, r
    files = tree(tmp_path / "a")
    expected = {"convert": {"model.onnx", "model.ort", "model.tflite", "pytorch/model.py", "model.pte"},
                "emit": {"model.tflite", "model.pte"}}[command]
    assert files == tree(tmp_path / "b") and expected <= set(files), files
    routes = {a["target"]: a.get("route") for a in json.loads((tmp_path / "a" / "report.json").read_text())["artifacts"]}
    assert set(routes) >= set(native_from_torch), routes
    differ = [f for f in files if (tmp_path / "a" / f).is_file() and f not in ("report.json", "report.html")
              and (tmp_path / "a" / f).read_bytes() != (tmp_path / "b" / f).read_bytes()]
    assert differ == []
    a, b = (json.loads((tmp_path / n / "report.json").read_text()) for n in ("a", "b"))
    assert without_timings(a) == without_timings(b)


# --- routes (--route auto|native|onnx) ---------------------------------------------------------


@pytest.fixture(scope="module")
def keras_cnn_file(tmp_path_factory) -> Path:
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3), name="image")
    y = keras.layers.Conv2D(4, 3, activation="relu")(inp)
    model = keras.Model(inp, keras.layers.Dense(2, name="probs")(keras.layers.GlobalAveragePooling2D()(y)))
    path = tmp_path_factory.mktemp("kcnn") / "cnn.keras"
    model.save(path)
    return path


def test_route_is_in_the_report_and_the_table(cli, keras_cnn_file, tmp_path):
    """MMdnn's `-df tensorflow` is the savedmodel target; each artifact's route is in report.json and
    in the terminal's artifacts table."""
    out = tmp_path / "out"
    r = cli("convert", keras_cnn_file, "-df", "tflite,tensorflow", "--route", "native", "-o", out)
    assert r.exit_code == 0, r
    report = json.loads((out / "report.json").read_text())
    assert [(a["target"], a["route"], a["route_asked"]) for a in report["artifacts"]] == [
        ("tflite", "native", "native"), ("savedmodel", "native", "native")]
    assert sorted(p.name for p in out.iterdir()) == ["model.tflite", "reference.npz", "report.html", "report.json", "saved_model"]
    assert "route" in r.stderr and "native" in r.stderr
    import jsonschema

    from modelport.validation.report import SCHEMA_FILE

    jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(report)
    report["artifacts"][0]["route"] = "teleport"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(report)


def test_route_native_where_there_is_none_and_unknown_route_are_exit_2(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "--to", "savedmodel", "--route", "native", "-o", tmp_path / "a", "--json")
    assert r.exit_code == 2, r
    assert "no native route from a onnx source to savedmodel" in r.json()["error"]["message"]
    r = cli("emit", tiny_onnx, "--to", "tflite", "--route", "fastest", "-o", tmp_path / "b")
    assert r.exit_code == 2 and "unknown route 'fastest'; known: auto, native, onnx" in r.stderr, r
    assert tree(tmp_path) == ["src", "src/tiny.onnx"]
