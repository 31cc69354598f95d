import json

import numpy as np


def test_optimize_writes_model_and_report(cli, tiny_onnx, tmp_path):
    out = tmp_path / "out"
    r = cli("optimize", tiny_onnx, "-o", out, "--json")
    assert r.exit_code == 0, r
    rep = json.loads((out / "report.json").read_text())
    assert rep["command"] == "optimize" and rep["status"] == "ok"
    rows = [s for s in rep["stages"] if s.get("pass")]
    assert [s["pass"] for s in rows] == ["shape", "fold", "dce", "cleanup", "fuse", "simplify"]
    fuse = next(s for s in rows if s["pass"] == "fuse")
    assert fuse["status"] == "applied" and fuse["nodes_before"] == 3 and fuse["nodes_after"] == 2
    assert {"size_before", "size_after", "seconds", "parity"} <= set(fuse)
    assert (out / "model.onnx").is_file()


def test_int8_static_from_npz(cli, tiny_onnx, tmp_path):
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
    r = cli("optimize", tiny_onnx, "-o", tmp_path / "q", "--precision", "int8", "--calibration", tmp_path / "calib.npz", "--json")
    assert r.exit_code == 0, r
    rep = r.json()
    row = next(s for s in rep["stages"] if s.get("pass") == "int8-static")
    assert row["status"] == "applied" and row["details"]["calibration"]["samples"] == 16
    assert rep["artifacts"][0]["precision"] == "int8"


def test_strict_exit_4_leaves_no_output(cli, tiny_onnx, tmp_path):
    r = cli("optimize", tiny_onnx, "-o", tmp_path / "s", "--precision", "int8", "--accuracy-budget", "max_abs<=1e-9", "--strict")
    assert r.exit_code == 4, r
    assert not (tmp_path / "s").exists()


def test_convert_with_optimize_level(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "--to", "onnx", "-o", tmp_path / "c", "--optimize", "basic", "--json")
    assert r.exit_code == 0, r
    assert [s["pass"] for s in r.json()["stages"] if s.get("pass")] == ["shape", "fold", "dce", "cleanup"]
    bad = cli("convert", tiny_onnx, "-o", tmp_path / "d", "--optimize", "turbo")
    assert bad.exit_code == 2
