"""Reports of real runs, successful and failed, validate against the published JSON schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from modelport.validation.report import SCHEMA_FILE, Findings

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


# --- the run record is built through Report's methods, and Run ends every command -------------

MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "sort", "reverse"}


def _touches_data(node) -> bool:
    """Whether an expression chain (a.b[c].d…) goes through a `.data` / `._data` attribute."""
    import ast

    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute) and node.attr in ("data", "_data"):
            return True
        node = node.func if isinstance(node, ast.Call) else node.value
    return False


def report_writes(root=None) -> list[str]:
    """`file:line` of every write into a report document outside validation/report.py: item or
    attribute stores and deletes through `.data`, mutating calls on it, and aliases of it."""
    import ast
    from pathlib import Path

    root = root or Path(__file__).resolve().parents[2] / "src" / "modelport"
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "validation/report.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            bad = False
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                # `x.data = v` replaces an attribute (a flatbuffer's bytes, say): Report.data is a property
                # without a setter, so only stores *through* `.data` (or into `._data`) can write a report
                bad = any(isinstance(t, (ast.Subscript, ast.Attribute)) and _touches_data(t)
                          and not (isinstance(t, ast.Attribute) and t.attr == "data" and not _touches_data(t.value))
                          for t in targets)
                value = getattr(node, "value", None)
                bad |= isinstance(value, ast.Attribute) and value.attr in ("data", "_data")  # an alias to write through
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                bad = _touches_data(node.func.value)
            elif isinstance(node, ast.Attribute) and node.attr == "_data":
                bad = True
            if bad:
                found.append((str(path.relative_to(root)), node.lineno))
    return [f"{file}:{line}" for file, line in sorted(found)]


def test_only_report_methods_write_the_report():
    """The schema lives in one module: orchestration, stages and CLI call Report's methods."""
    assert report_writes() == []


def test_report_writes_are_found(tmp_path):
    (tmp_path / "w.py").write_text("def f(report, run):\n    report.data['source'] = 1\n    report.data['stages'].extend([])\n"
                                   "    d = run.data\n    report.data['stages'][-1].update(x=1)\n    del report.data['a']\n")
    assert report_writes(tmp_path) == ["w.py:2", "w.py:3", "w.py:4", "w.py:5", "w.py:6"]
    (tmp_path / "w.py").write_text("def f(buffer, report):\n    buffer.data = b''\n    report.data.x = 1\n")
    assert report_writes(tmp_path) == ["w.py:3"]


def test_report_data_is_a_read_only_view():
    from modelport.validation.report import Report

    report = Report("convert")
    with pytest.raises(TypeError):
        report.data["source"] = {}
    report.record(Findings(source={"path": "m.onnx"}))
    copy = report.to_dict()
    copy["source"]["path"] = "other"
    assert report.data["source"] == {"path": "m.onnx"}


def test_run_attaches_the_finished_report_to_the_error():
    from modelport.errors import BadInputError
    from modelport.validation.report import Run

    original = BadInputError("no such file", path="m.onnx")
    with pytest.raises(BadInputError) as e:
        with Run("convert") as report:
            with report.stage("parse"):
                pass
            raise original
    err = e.value
    assert err is not original and err.__cause__ is original and original.report is None
    assert str(err) == err.message == "m.onnx: no such file"
    doc = err.report
    assert doc["command"] == "convert" and doc["status"] == "failed" and doc["exit_code"] == 2
    assert doc["error"] == err.to_dict() and [s["name"] for s in doc["stages"]] == ["parse"]


def test_an_inner_run_ends_first_and_its_report_is_kept(validator):
    from modelport.errors import ValidationError
    from modelport.validation.report import Run

    outer = Run("convert")
    with pytest.raises(ValidationError) as e:
        with outer:
            with Run("convert") as inner:
                inner.record(Findings(warnings=["seen by the inner run only"]))
                raise ValidationError("parity failed")
    assert e.value.report["warnings"] == ["seen by the inner run only"] and outer.document is e.value.report
    validator.validate(e.value.report)


def test_run_of_a_bug_and_of_a_missing_framework(validator):
    from modelport.errors import MissingDependencyError
    from modelport.validation.report import Run

    run = Run("emit")
    with pytest.raises(ZeroDivisionError):
        with run:
            1 / 0  # noqa: B018
    assert run.document["exit_code"] == 1 and run.document["error"]["type"] == "ZeroDivisionError"
    validator.validate(run.document)
    with pytest.raises(MissingDependencyError) as e:
        with Run("emit"):
            raise ImportError("No module named 'tensorflow'", name="tensorflow")
    assert e.value.exit_code == 5 and e.value.report["exit_code"] == 5 and "tf" in e.value.message
    assert isinstance(e.value.__cause__, ImportError)


def test_run_finishes_a_successful_report():
    from modelport.validation.report import Run

    run = Run("zoo build")
    with run as report:
        report.record(Findings(files=["model.pt2"]))
    assert run.document["status"] == "ok" and run.document["exit_code"] == 0 and run.document["files"] == ["model.pt2"]
