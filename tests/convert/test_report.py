"""Reports of real runs, successful and failed, validate against the published JSON schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import modelport.convert as convert_pkg

SCHEMA = json.loads((Path(convert_pkg.__file__).parent / "report.schema.json").read_text())


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
