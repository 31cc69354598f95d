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


def _conv_weight_through_identity(folder):
    """A Conv whose weight comes from a node: onnxruntime's quantiser fails ("Expected w2 to be an initializer")."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["w2"]), helper.make_node("Conv", ["x", "w2", "b"], ["y"], pads=[1, 1, 1, 1])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8, 8])], initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "conv.onnx"))
    return folder / "conv.onnx"


def _float_types(path):
    import onnx

    return {i.data_type for i in onnx.load(str(path)).graph.initializer if i.data_type in (1, 10)}


def test_fp16_that_cannot_hold_parity_exits_4(cli, tiny_onnx, tmp_path):
    # a tolerance FP16 cannot meet: the pass is rolled back, and the requested precision is not delivered
    r = cli("optimize", tiny_onnx, "-o", tmp_path / "o", "--precision", "fp16", "--atol", "1e-9", "--rtol", "0")
    assert r.exit_code == 4, r
    assert "--precision fp16 cannot be delivered" in r.stderr and "max_abs=" in r.stderr
    assert "--allow-precision-fallback" in r.stderr
    assert not (tmp_path / "o").exists()


def test_fp16_fallback_when_allowed_says_fp32(cli, tiny_onnx, tmp_path):
    out = tmp_path / "o"
    r = cli("optimize", tiny_onnx, "-o", out, "--precision", "fp16", "--atol", "1e-9", "--rtol", "0",
            "--allow-precision-fallback", "--json")
    assert r.exit_code == 0, r
    art = r.json()["artifacts"][0]
    assert art["precision"] == "fp32" and art["requested_precision"] == "fp16"
    assert "fp16" in art["precision_fallback"]["reason"] and "max_abs=" in art["precision_fallback"]["reason"]
    assert any(line.startswith("warning:") and "fp16" in line and "fp32" in line for line in r.stderr.splitlines())
    assert _float_types(out / "model.onnx") == {1}  # the file really is FP32


def test_fp16_delivered_reports_requested_and_delivered(cli, tiny_onnx, tmp_path):
    r = cli("optimize", tiny_onnx, "-o", tmp_path / "o", "--precision", "fp16", "--json")
    assert r.exit_code == 0, r
    art = r.json()["artifacts"][0]
    assert art["precision"] == art["requested_precision"] == "fp16" and "precision_fallback" not in art
    assert _float_types(tmp_path / "o" / "model.onnx") == {10}


def test_int8_quantiser_error_exits_4_or_falls_back_when_allowed(cli, tmp_path):
    src = _conv_weight_through_identity(tmp_path / "src")
    r = cli("optimize", src, "-o", tmp_path / "q", "--level", "none", "--precision", "int8")
    assert r.exit_code == 4, r
    assert "--precision int8 cannot be delivered" in r.stderr and "to be an initializer" in r.stderr
    assert not (tmp_path / "q").exists()
    ok = cli("optimize", src, "-o", tmp_path / "q", "--level", "none", "--precision", "int8", "--allow-precision-fallback", "--json")
    assert ok.exit_code == 0, ok
    art = ok.json()["artifacts"][0]
    assert art["precision"] == "fp32" and art["requested_precision"] == "int8"
    assert "to be an initializer" in art["precision_fallback"]["reason"]


def test_emitter_precision_error_exits_4_or_falls_back(cli, tmp_path):
    """convert/emit with an ort target apply the precision in the optimisation stage, as with onnx: same promise."""
    src = _conv_weight_through_identity(tmp_path / "src")
    r = cli("emit", src, "--to", "ort", "-o", tmp_path / "e", "--precision", "int8")
    assert r.exit_code == 4, r
    assert "int8 cannot be delivered" in r.stderr and not (tmp_path / "e").exists()
    ok = cli("emit", src, "--to", "ort", "-o", tmp_path / "e", "--precision", "int8", "--allow-precision-fallback", "--json")
    assert ok.exit_code == 0, ok
    art = ok.json()["artifacts"][0]
    assert (art["target"], art["precision"], art["requested_precision"]) == ("ort", "fp32", "int8")
    assert [p["ok"] for p in ok.json()["parity"]] == [True, True]
    tight = cli("convert", src, "--to", "ort", "-o", tmp_path / "c", "--precision", "fp16", "--atol", "1e-9", "--rtol", "0")
    assert tight.exit_code == 4 and "fp16 cannot be delivered within tolerance: pass 'fp16'" in tight.stderr, tight


def test_auto_skips_a_precision_it_cannot_build(cli, tmp_path):
    """auto explores precisions: one the quantiser cannot build is no candidate, not a failure."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(_conv_weight_through_identity(tmp_path / "src")))
    # the weight scales with a second input: no pass can fold it into an initializer
    model.graph.node[0].CopyFrom(helper.make_node("Mul", ["w", "s"], ["w2"]))
    model.graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [1]))
    src = tmp_path / "src" / "scaled.onnx"
    onnx.save(model, str(src))
    r = cli("optimize", src, "-o", tmp_path / "a", "--level", "auto", "--json")
    assert r.exit_code == 0, r
    variants = [v["variant"] for v in r.json()["optimize"]["variants"]]
    not_built = {v["variant"]: v["reason"] for v in r.json()["optimize"]["not_built"]}
    assert "int8-dynamic" not in variants and "to be an initializer" in not_built["int8-dynamic"]
    # fp16 is built; at the sweep's constant frames (no declared range) its output overflows half
    # precision (Inf where fp32 is finite), which rules it out as a candidate, not the run
    assert "fp16" in variants or "Inf" in not_built["fp16"]
    r = cli("optimize", src, "-o", tmp_path / "b", "--level", "auto", "--no-structured-samples", "--json")
    assert r.exit_code == 0 and "fp16" in [v["variant"] for v in r.json()["optimize"]["variants"]], r


def test_precision_pass_named_in_passes_is_a_request_too(cli, tiny_onnx, tmp_path):
    r = cli("optimize", tiny_onnx, "-o", tmp_path / "p", "--passes", "fold,fp16", "--atol", "1e-9", "--rtol", "0")
    assert r.exit_code == 4, r
    assert "--precision fp16 cannot be delivered" in r.stderr and not (tmp_path / "p").exists()


def test_optimize_with_sample_data(cli, tmp_path):
    from tests.test_samples import _control_input_model

    model = _control_input_model(tmp_path / "vad.onnx")
    assert cli("optimize", model, "-o", tmp_path / "bad").exit_code == 2
    npz = tmp_path / "in.npz"
    np.savez(npz, sr=np.asarray(16000, np.int64))
    r = cli("optimize", model, "--data", npz, "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["contract"]["given_inputs"] == ["sr"], r


def test_optimize_prints_each_pass_once(cli_proc, tiny_onnx, tmp_path):
    r = cli_proc("optimize", tiny_onnx, "--level", "extended", "-o", tmp_path / "o")
    assert r.exit_code == 0, r
    passes = [s["pass"] for s in json.loads((tmp_path / "o" / "report.json").read_text())["stages"] if "pass" in s]
    assert passes
    for name in passes:
        assert sum(1 for line in r.stderr.splitlines() if f" {name} " in line or f":{name} " in line) == 1, (name, r.stderr)


def test_auto_without_a_budget_uses_the_default_it_prints_and_records(cli_proc, tiny_onnx, tmp_path):
    r = cli_proc("optimize", tiny_onnx, "--level", "auto", "-o", tmp_path / "a")
    assert r.exit_code == 0, r
    assert "within cosine>=0.999 (the default budget; set --accuracy-budget)" in " ".join(r.stderr.split())
    selection = json.loads((tmp_path / "a" / "report.json").read_text())["optimize"]
    assert selection["budget"] == "cosine>=0.999" and selection["budget_default"] is True
    assert {v["budget"] for v in selection["variants"]} == {"cosine>=0.999"}
    r = cli_proc("optimize", tiny_onnx, "--level", "auto", "--accuracy-budget", "max_abs<=0.5", "-o", tmp_path / "b", "--json")
    assert r.exit_code == 0, r
    assert r.json()["optimize"]["budget"] == "max_abs<=0.5" and r.json()["optimize"]["budget_default"] is False
