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
