"""The second TFLite route for ONNX-side sources: the IR's generated PyTorch code converted by
litert-torch. A model onnx2tf cannot take (GroupNormalization, CastLike; two inputs, one float64,
two outputs) reaches TFLite under `--route auto` with parity in LiteRT and the contract at the
file's signature; `--route native` takes the route alone; an op either converter cannot take is
exit 2 naming it, with nothing written."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes.tflite import load_interpreter
from tests.emitters.models import bitwise_model, det_model, groupnorm_model, save_onnx


@pytest.fixture(scope="module")
def groupnorm(tmp_path_factory):
    """(source path, output folder, report) of `groupnorm_model` converted with `--route auto`."""
    src = save_onnx(groupnorm_model(), tmp_path_factory.mktemp("gn"), "groupnorm.onnx")
    out = tmp_path_factory.mktemp("gn_out") / "out"
    return src, out, convert(src, out, ConvertOptions(targets=["tflite"]))


def test_auto_falls_back_to_generated_code_when_onnx2tf_cannot(groupnorm):
    _, out, report = groupnorm
    art = report["artifacts"][0]
    assert (art["route"], art["route_asked"], art["route_converter"]) == ("native", "auto", "PyTorch code + litert-torch")
    assert art["route_notes"] == ["onnx route not taken: onnx2tf cannot convert CastLike x1, GroupNormalization x1"]
    assert "modelport PyTorch code" in art["converter"] and art["precision"] == "fp32"
    assert report["parity"][-1]["hop"] == "onnx→tflite (native, end to end)" and report["parity"][-1]["ok"]
    assert art["contract_check"]["fixed_dims"] == {n: {"batch": 1} for n in ("image", "gain", "features", "score")}
    assert not list(out.rglob("*.py"))  # the generated code was a step, not an artifact


def test_the_file_keeps_the_contract_and_computes_the_source(groupnorm):
    import onnxruntime as ort

    src, out, _ = groupnorm
    interp = load_interpreter(out / "model.tflite")
    sig = interp.get_signature_list()
    assert list(sig) == ["serving_default"]
    assert sig["serving_default"] == {"inputs": ["gain", "image"], "outputs": ["features", "score"]}  # listed sorted
    assert [d["name"] for d in interp.get_input_details()] == ["image", "gain"]
    assert [d["dtype"] for d in interp.get_input_details()] == [np.float32, np.float64]  # float64 kept, as the contract
    rng = np.random.default_rng(7)
    feeds = {"image": rng.standard_normal((1, 3, 8, 8)).astype(np.float32), "gain": np.array([[1.5]])}
    got = interp.get_signature_runner("serving_default")(**feeds)
    want = dict(zip(["features", "score"], ort.InferenceSession(str(src)).run(None, feeds), strict=True))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_route_native_takes_it_alone(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "--to", "tflite", "--route", "native", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    art = report["artifacts"][0]
    assert (art["route"], art["route_asked"], art["route_converter"]) == ("native", "native", "PyTorch code + litert-torch")
    assert [p["hop"] for p in report["parity"]] == ["onnx→onnx (IR)", "onnx→tflite (native, end to end)"]
    assert report["parity"][-1]["ok"]
    sig = load_interpreter(tmp_path / "out" / "model.tflite").get_signature_list()["serving_default"]
    assert sig == {"inputs": ["x"], "outputs": ["y"]}


def test_an_op_the_code_generator_lacks_is_exit_2_naming_it(cli, tmp_path):
    src = save_onnx(det_model(), tmp_path / "src", "det.onnx")
    r = cli("convert", src, "--to", "tflite", "--route", "native", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "PyTorch code + litert-torch cannot convert to tflite: the PyTorch code generator has no converter for Det x1" in r.stderr
    assert not (tmp_path / "out").exists()


def test_an_op_with_no_tflite_builtin_is_exit_2_naming_it_and_both_converters(cli, tmp_path):
    src = save_onnx(bitwise_model(), tmp_path / "src", "bits.onnx")
    r = cli("convert", src, "--to", "tflite", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    text = " ".join(r.stderr.split())
    assert "litert-torch could not convert the model: no TFLite builtin for TF Select ops: BitwiseAnd" in text
    assert "onnx route not taken: onnx2tf cannot convert BitwiseAnd x1" in text
    assert not (tmp_path / "out").exists()
