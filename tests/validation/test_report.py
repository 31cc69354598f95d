"""Reports of real runs, successful and failed, validate against the published JSON schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from modelport.validation.report import SCHEMA_FILE

SCHEMA = json.loads(SCHEMA_FILE.read_text())


@pytest.fixture(scope="module")
def validator():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    return jsonschema.Draft202012Validator(SCHEMA)


def test_ok_report_validates(cli, tiny_onnx, tmp_path, validator):
    r = cli("convert", tiny_onnx, "-o", tmp_path / "o", "--json", "--layout", "NC", "--mean", "0.5", "--std", "2")
    assert r.exit_code == 0
    validator.validate(r.json())
    validator.validate(json.loads((tmp_path / "o" / "report.json").read_text()))


def test_failed_report_validates(cli, tiny_onnx, tmp_path, validator):
    r = cli("convert", tiny_onnx, "-o", tmp_path / "o", "--json", "--atol", "0", "--rtol", "0", "--min-cosine", "1.1")
    assert r.exit_code == 4
    report = r.json()
    validator.validate(report)
    assert report["status"] == "failed" and report["error"]["exit_code"] == 4


def test_schema_rejects_a_broken_report(validator):
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"schema": "modelport.report/1", "status": "maybe"})


def test_precision_fallback_and_reference_varies_reports_validate(cli, tiny_onnx, tmp_path, validator):
    ok = cli("optimize", tiny_onnx, "-o", tmp_path / "f", "--precision", "fp16", "--atol", "1e-9", "--rtol", "0",
             "--allow-precision-fallback", "--atol", "y=1e-9", "--json")
    assert ok.exit_code == 0, ok
    report = ok.json()
    validator.validate(report)
    assert report["artifacts"][0]["precision_fallback"]["requested"] == "fp16"
    assert report["contract"]["outputs"][0]["reference_varies"] is True
    assert all("tolerance" in o for hop in report["parity"] for o in hop["outputs"])
    failed = cli("convert", tiny_onnx, "--to", "ort", "-o", tmp_path / "e", "--precision", "fp16", "--atol", "1e-9",
                 "--rtol", "0", "--json")
    assert failed.exit_code == 4, failed
    validator.validate(failed.json())
    assert "_attempt" not in json.dumps(failed.json())
    bad = dict(report, warnings=[1])
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)


def _other_onnx(folder):
    """tiny_onnx's graph with other weights: same I/O, different outputs (a validate mismatch)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(folder / "tiny.onnx"))
    w = model.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 3 + 1, w.name))
    onnx.save(model, str(folder / "other.onnx"))
    return folder / "other.onnx"


def test_every_command_report_validates(cli, tiny_onnx, tmp_path, validator):
    """convert, optimize, emit, validate and package: --json output and report.json, successful and failed runs."""
    src = tiny_onnx.parent
    out = tmp_path / "conv"
    assert cli("convert", tiny_onnx, "-o", out, "-q").exit_code == 0
    runs = [
        (0, ["optimize", tiny_onnx, "-o", tmp_path / "opt"], tmp_path / "opt"),
        (2, ["optimize", src / "missing.onnx", "-o", tmp_path / "opt2"], None),
        (0, ["emit", out / "model.onnx", "--to", "ort", "-o", tmp_path / "emit"], tmp_path / "emit"),
        (2, ["emit", out / "model.onnx", "--to", "nope", "-o", tmp_path / "emit2"], None),
        (0, ["validate", tiny_onnx, out / "model.onnx"], None),
        (4, ["validate", tiny_onnx, _other_onnx(src)], None),
        (2, ["validate", tiny_onnx, src / "missing.onnx"], None),
        (0, ["package", out, "--for", "triton,torchserve", "-o", tmp_path / "pkg"], tmp_path / "pkg"),
        (0, ["package", tiny_onnx, "--for", "triton", "-o", tmp_path / "pkg_file"], tmp_path / "pkg_file"),
        (2, ["package", out, "--for", "triton", "--name", "../x", "-o", tmp_path / "pkg2"], None),
        (2, ["package", out, "--for", "triton", "--backend", "tensorrt", "-o", tmp_path / "pkg3"], None),
        (2, ["package", out, "--for", "nginx", "-o", tmp_path / "pkg4"], None),
    ]
    for code, args, folder in runs:
        r = cli(*args, "--json")
        assert r.exit_code == code, (args, r)
        report = r.json()
        validator.validate(report)
        assert report["command"] == args[0] and report["exit_code"] == code, args
        assert (report["status"] == "ok") == (code == 0) and (report["error"] is None) == (code == 0), args
        if folder is not None:
            validator.validate(json.loads((folder / "report.json").read_text()))
    pkg = json.loads((tmp_path / "pkg" / "report.json").read_text())
    assert pkg["source"]["framework"] == "onnx" and pkg["source"]["format"] == "convert output folder"
    pkg_file = json.loads((tmp_path / "pkg_file" / "report.json").read_text())
    assert pkg_file["source"]["format"] == "onnx" and len(pkg_file["source"]["sha256"]) == 64
