"""`modelport package` and `convert --package` through the CLI: outputs, --json, exit codes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import tree


def test_package_command(cli, tiny_onnx, tmp_path):
    out = tmp_path / "repo"
    r = cli("package", tiny_onnx, "--for", "triton", "-o", out, "--name", "tiny", "--max-batch", "4", "--json")
    assert r.exit_code == 0, r
    report = json.loads(r.stdout)
    assert report["bundles"][0]["max_batch_size"] == 4 and (out / "tiny" / "config.pbtxt").is_file()
    again = cli("package", tiny_onnx, "--for", "triton", "-o", out)
    assert again.exit_code == 2 and "already exists" in again.stderr
    added = cli("package", tiny_onnx, "--for", "triton", "-o", out, "--name", "tiny", "--add-version", "-q")
    assert added.exit_code == 0, added
    assert (out / "tiny" / "2" / "model.onnx").is_file() and (out / "tiny" / "1" / "model.onnx").is_file()


def test_package_bad_usage_exits_2(cli, tiny_onnx, tmp_path):
    for args in (["--for", "nginx"], ["--for", "triton", "--device", "tpu"], ["--for", "k8s", "--server", "nginx"],
                 ["--for", "torchserve", "--postprocess", "argmaxx"]):
        r = cli("package", tiny_onnx, *args, "-o", tmp_path / "b")
        assert r.exit_code == 2, (args, r)
    assert [p for p in tree(tmp_path) if not p.startswith("src")] == []


def test_convert_with_package(cli, tiny_onnx, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", tiny_onnx, "-o", out, "--package", "triton,k8s", "--json")
    assert r.exit_code == 0, r
    report = json.loads(r.stdout)
    assert [b["path"] for b in report["bundles"]] == ["packages/triton", "packages/k8s"]
    assert (out / "packages" / "triton" / "tiny" / "1" / "model.onnx").is_file()
    assert (out / "packages" / "k8s" / "k8s" / "deployment.yaml").is_file()
    bad = cli("convert", tiny_onnx, "-o", tmp_path / "o2", "--package", "nginx")
    assert bad.exit_code == 2 and not (tmp_path / "o2").exists()


def test_package_unservable_and_untrusted(cli, tmp_path):
    """tflite/ort for Triton: exit 2 naming what it takes; tracing PyTorch code without --trust: exit 3."""
    from modelport.convert import ConvertOptions, convert
    from tests.serving.conftest import write_mlp

    src = write_mlp(tmp_path / "src")
    edge = tmp_path / "edge"
    convert(src, edge, ConvertOptions(targets=["tflite", "ort"]))
    r = cli("package", edge, "--for", "triton", "-o", tmp_path / "b1")
    assert r.exit_code == 2 and "Triton takes ONNX" in r.stderr, r
    code = tmp_path / "code"
    convert(src, code, ConvertOptions(targets=["pytorch"]))
    r = cli("package", code, "--for", "triton", "-o", tmp_path / "b2")
    assert r.exit_code == 3 and "--trust" in r.stderr, r
    r = cli("package", code, "--for", "triton", "--trust", "-o", tmp_path / "b3", "--json")
    assert r.exit_code == 0, r
    assert json.loads(r.stdout)["bundles"][0]["platform"] == "pytorch_libtorch"
    assert (tmp_path / "b3" / "mlp" / "1" / "model.pt").is_file()
    r = cli("package", code, "--for", "torchserve", "-o", tmp_path / "b4", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["bundles"][0]["runtime"] == "torch", r
    assert [p for p in tree(tmp_path) if p.startswith(("b1", "b2"))] == []


@pytest.mark.tf
def test_package_tfserving_leaves_its_input_untouched(cli, tiny_onnx, tmp_path):
    """The `cli` fixture hashes the convert output before `package` and fails the test if a byte changed."""
    out = tmp_path / "out"
    assert cli("convert", tiny_onnx, "-o", out, "-q").exit_code == 0
    r = cli("package", out, "--for", "tfserving", "-o", tmp_path / "tfs", "-q")
    assert r.exit_code == 0, r
    assert (tmp_path / "tfs" / "tiny" / "1" / "saved_model.pb").is_file()
