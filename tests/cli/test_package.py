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
    from modelport.orchestration import ConvertOptions, convert
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


def _hashes(root) -> dict[str, str]:
    """sha256 of every file under `root`, by relative path (a new or vanished file shows too)."""
    import hashlib
    from pathlib import Path

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


@pytest.mark.tf
def test_package_tfserving_leaves_the_convert_output_untouched(cli, tmp_path):
    """onnx2tf simplifies the file it is handed and saves it back: it must get a copy, never OUT/model.onnx."""
    from tests.serving.conftest import write_mlp

    src = write_mlp(tmp_path / "src")
    out = tmp_path / "out"
    assert cli("convert", src, "-o", out, "-q").exit_code == 0
    before = _hashes(tmp_path)
    r = cli("package", out, "--for", "tfserving,triton", "-o", tmp_path / "bundles", "-q")
    assert r.exit_code == 0, r
    after = {k: v for k, v in _hashes(tmp_path).items() if not k.startswith("bundles/")}
    assert after == before
    triton = tmp_path / "bundles" / "triton" / "mlp" / "1" / "model.onnx"
    assert triton.read_bytes() == (out / "model.onnx").read_bytes()
    assert not [p for p in tree(tmp_path / "bundles") if ".onnx2tf-" in p]


@pytest.mark.tf
def test_convert_package_bundles_ship_the_validated_model(cli, tmp_path):
    """With tfserving packaged first, Triton and TorchServe still get the model.onnx the run validated."""
    import zipfile

    from tests.serving.conftest import write_mlp

    src = write_mlp(tmp_path / "src")
    before = _hashes(tmp_path / "src")
    plain = tmp_path / "plain"
    assert cli("convert", src, "-o", plain, "-q").exit_code == 0
    out = tmp_path / "out"
    r = cli("convert", src, "-o", out, "--package", "tfserving,triton,torchserve", "-q")
    assert r.exit_code == 0, r
    assert _hashes(tmp_path / "src") == before
    validated = (plain / "model.onnx").read_bytes()  # reruns are byte-identical: the file validation ran on
    assert (out / "model.onnx").read_bytes() == validated
    assert (out / "packages" / "triton" / "mlp" / "1" / "model.onnx").read_bytes() == validated
    with zipfile.ZipFile(out / "packages" / "torchserve" / "model-store" / "mlp.mar") as z:
        assert z.read("model.onnx") == validated
    assert not [p for p in tree(out) if ".onnx2tf-" in p]


def test_torchscript_tracing_leaves_the_code_folder_untouched(cli, tmp_path, monkeypatch):
    """Tracing imports model.py; the import (and its __pycache__) happens on a copy inside the staging folder."""
    import sys

    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as for a user without PYTHONDONTWRITEBYTECODE
    from modelport.orchestration import ConvertOptions, convert
    from tests.serving.conftest import write_mlp

    src = write_mlp(tmp_path / "src")
    code = tmp_path / "code"
    convert(src, code, ConvertOptions(targets=["pytorch"]))
    assert not (code / "pytorch" / "__pycache__").exists()  # validating the code imported it without writing bytecode
    before = _hashes(code)
    r = cli("package", code, "--for", "triton", "--trust", "-o", tmp_path / "b", "-q")
    assert r.exit_code == 0, r
    assert _hashes(code) == before
    assert not [p for p in tree(tmp_path / "b") if ".torchscript-" in p]


@pytest.mark.parametrize("system", ["triton", "torchserve", "tfserving", "k8s"])
@pytest.mark.parametrize("name", ["../escape", "a/b", "ABS", "x\0y", "", ".", "..", "a\\b"])
def test_names_that_are_not_one_path_component_exit_2(cli, tiny_onnx, tmp_path, system, name):
    """`--name` becomes a folder and file name: `..`, `/`, absolute paths, NUL, empty are refused before any write."""
    outside = tmp_path / "outside"
    name = str(outside / "escape") if name == "ABS" else name
    r = cli("package", tiny_onnx, "--for", system, "-o", tmp_path / "deep" / "b", "--name", name)
    assert r.exit_code == 2, r
    assert "--name" in r.stderr
    assert [p for p in tree(tmp_path) if not p.startswith("src")] == []
    assert not (tmp_path.parent / "escape").exists() and not (tmp_path.parent / "escape.request.json").exists()


def test_zoo_names_are_checked(cli, tmp_path):
    for args in (["build", "../x", "-o", tmp_path / "z"], ["fetch", "../x", "--cache-dir", tmp_path / "c"]):
        r = cli("zoo", *args)
        assert r.exit_code == 2 and "zoo name" in r.stderr, r
    assert tree(tmp_path) == []


@pytest.mark.tf
def test_package_rerun_is_byte_identical_for_every_system(cli, cli_proc, tmp_path):
    """The same convert output packaged twice for every system into two folders, each run its own
    process as a user's rerun is: the same bytes (the .mar's members carry a fixed time stamp, the
    SavedModel's fingerprint a uuid derived from its content)."""
    from modelport.packaging import PACKAGERS
    from tests.serving.conftest import write_mlp

    src = write_mlp(tmp_path / "src")
    out = tmp_path / "out"
    assert cli("convert", src, "--to", "onnx,pytorch", "-o", out, "-q").exit_code == 0
    systems = ",".join(PACKAGERS)
    for name in ("a", "b"):
        r = cli_proc("package", out, "--for", systems, "-o", tmp_path / name, "-q")
        assert r.exit_code == 0, r
    files = tree(tmp_path / "a")
    assert files == tree(tmp_path / "b") and any(f.endswith(".mar") for f in files)
    assert any(f.endswith("fingerprint.pb") for f in files)
    differ = [f for f in files if (tmp_path / "a" / f).is_file() and f not in ("report.json", "report.html")
              and (tmp_path / "a" / f).read_bytes() != (tmp_path / "b" / f).read_bytes()]
    assert differ == []
