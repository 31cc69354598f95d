"""TFLite → TFLite: a `.tflite` source asked `--to tflite` is emitted again from its own graph. At
fp32 the file computes the source's numbers bit for bit, with the source's ops and weights, under
the contract's names (a signature added to a file that had none); fp16 and int8 re-quantise the
weights with ai-edge-quantizer and are validated in LiteRT; a quantised source asked to be
quantised again is exit 2 naming why. The source file is never changed (the `cli` fixture checks)."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.runtimes.tflite import load_interpreter
from tests.tflite_models import write_dense_tflite, write_int8_io_tflite, write_two_input_tflite


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return write_dense_tflite(tmp_path_factory.mktemp("dense") / "dense.tflite")


def _convert(cli, src, out, *args):
    r = cli("convert", src, "--to", "tflite", "-o", out, "--json", *args)
    assert r.exit_code == 0, r
    return r.json()


def _ops(path) -> list[str]:
    return [d["op_name"] for d in load_interpreter(path)._get_ops_details()]


def _weights(path) -> list[tuple[str, tuple]]:
    interp = load_interpreter(path)
    return sorted((np.dtype(d["dtype"]).name, tuple(d["shape"])) for d in interp.get_tensor_details() if len(d["shape"]) == 2)


def test_fp32_re_emission_keeps_the_graph_and_its_numbers(cli, dense, tmp_path):
    report = _convert(cli, dense, tmp_path / "out")
    art = report["artifacts"][0]
    assert (art["route"], art["route_asked"], art["route_converter"]) == ("native", "auto", "TFLite re-emission")
    assert art["converter"] == "TFLite re-emission (the source's flatbuffer, its graph unchanged)"
    assert (art["precision"], art["quantization"]) == ("fp32", "none") and report["parity"][-1]["ok"]
    assert report["parity"][-1]["hop"] == "tflite→tflite (native, end to end)"
    made = tmp_path / "out" / "model.tflite"
    assert _ops(made) == _ops(dense) == ["FULLY_CONNECTED", "FULLY_CONNECTED"]
    assert _weights(made) == _weights(dense)
    x = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)
    got = load_interpreter(made).get_signature_runner("serving_default")(x=x)
    want = load_interpreter(dense).get_signature_runner(art["source_signature"])(x=x)
    assert list(got) == ["y"] and np.array_equal(got["y"], want["y"])  # bit for bit
    assert load_interpreter(made).get_input_details()[0]["shape_signature"].tolist() == [-1, 16]  # dynamic batch kept


def test_a_file_without_a_signature_gets_one_under_the_contract_names(cli, tmp_path):
    (tmp_path / "src").mkdir()
    src = write_two_input_tflite(tmp_path / "src" / "two.tflite")
    report = _convert(cli, src, tmp_path / "out")
    art = report["artifacts"][0]
    assert art["route_converter"] == "TFLite re-emission" and art["source_signature"] is None
    assert report["parity"][-1]["ok"] and art["contract_check"]["fixed_dims"] == {}
    (out_name,) = [o["name"] for o in report["contract"]["outputs"]]
    interp = load_interpreter(tmp_path / "out" / "model.tflite")
    assert interp.get_signature_list() == {"serving_default": {"inputs": ["a", "b"], "outputs": [out_name]}}
    assert [d["name"] for d in interp.get_input_details()] == ["a", "b"]
    assert [d["name"] for d in interp.get_output_details()] == [out_name]
    a, b = np.ones((2, 4, 2), np.float32), np.full((2, 2), 0.5, np.float32)
    got = interp.get_signature_runner("serving_default")(a=a, b=b)[out_name]
    np.testing.assert_array_equal(got, np.full((2, 2), 40.5, np.float32))


@pytest.mark.parametrize(("precision", "dtype", "words"), [("fp16", "float16", "float16 weights"),
                                                           ("int8", "int8", "dynamic range")])
def test_fp16_and_int8_re_quantise_the_weights_and_validate(cli, dense, tmp_path, precision, dtype, words):
    report = _convert(cli, dense, tmp_path / "out", "--precision", precision)
    art = report["artifacts"][0]
    assert (art["route_converter"], art["precision"]) == ("TFLite re-emission", precision)
    assert words in art["quantization"] and "ai-edge-quantizer" in art["converter"]
    assert report["parity"][-1]["ok"] and report["parity"][-1]["hop"] == "tflite→tflite (native, end to end)"
    made = tmp_path / "out" / "model.tflite"
    assert {t for t, _ in _weights(made)} >= {dtype}  # the weight matrices are stored in the new type
    assert made.stat().st_size < dense.stat().st_size
    sig = load_interpreter(made).get_signature_list()["serving_default"]
    assert sig == {"inputs": ["x"], "outputs": ["y"]}


def test_a_quantised_source_is_not_quantised_again(cli, tmp_path):
    (tmp_path / "src").mkdir()
    src = write_int8_io_tflite(tmp_path / "src" / "q.tflite")
    r = cli("convert", src, "--to", "tflite", "--route", "native", "--precision", "fp16", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "the TFLite file is quantised already" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_source_with_integer_io_keeps_it(cli, tmp_path):
    """A full-integer file (int8 input and output) re-emitted at fp32: the same int8 tensors, compared
    as stored against the source's own int8 reference."""
    (tmp_path / "src").mkdir()
    src = write_int8_io_tflite(tmp_path / "src" / "q.tflite")
    report = _convert(cli, src, tmp_path / "out")
    art = report["artifacts"][0]
    assert (art["route_converter"], art["io_dtype"]) == ("TFLite re-emission", "int8") and report["parity"][-1]["ok"]
    assert report["parity"][-1]["outputs"][0]["max_abs"] == 0
    interp = load_interpreter(tmp_path / "out" / "model.tflite")
    assert [np.dtype(d["dtype"]).name for d in interp.get_input_details() + interp.get_output_details()] == ["int8", "int8"]
