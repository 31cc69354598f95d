"""package(): staging, refusal of an existing bundle, --add-version, and no half-written bundle."""

from __future__ import annotations

import json

import pytest

from modelport.errors import BadInputError, StageError
from modelport.orchestration.package import package
from modelport.packaging import PackageOptions, parse_systems
from tests.conftest import check_options_class, tree


def test_several_systems_get_a_folder_each(mlp_out, tmp_path):
    out = tmp_path / "bundle"
    report = package(mlp_out, out, "triton,torchserve,kserve")
    assert [b["system"] for b in report["bundles"]] == ["triton", "torchserve", "kserve"]
    assert (out / "triton" / "mlp" / "config.pbtxt").is_file()
    assert (out / "torchserve" / "model-store" / "mlp.mar").is_file()
    saved = json.loads((out / "report.json").read_text())
    assert saved["status"] == "ok" and saved["command"] == "package" and saved["contract"]["inputs"][0]["name"] == "features"


def test_existing_bundle_refused_without_force(mlp_out, tmp_path):
    out = tmp_path / "bundle"
    package(mlp_out, out, "triton")
    before = tree(out)
    with pytest.raises(BadInputError, match="already exists") as e:
        package(mlp_out, out, "triton")
    assert e.value.exit_code == 2 and tree(out) == before
    package(mlp_out, out, "triton", PackageOptions(force=True, model_name="other"))
    assert (out / "other").is_dir() and not (out / "mlp").exists()


def test_add_version_keeps_old_versions(mlp_out, tmp_path):
    out = tmp_path / "repo"
    package(mlp_out, out, "triton")
    report = package(mlp_out, out, "triton", PackageOptions(add_version=True))
    assert report["bundles"][0]["versions"] == [1, 2]
    assert sorted(p.name for p in (out / "mlp").iterdir()) == ["1", "2", "config.pbtxt"]


def test_failed_packaging_leaves_nothing(cli, mlp_out, tmp_path, monkeypatch):
    import modelport.packaging.torchserve as ts

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ts, "write_mar", boom)
    out = tmp_path / "bundle"
    with pytest.raises(StageError) as e:
        package(mlp_out, out, "triton,torchserve")
    assert e.value.stage == "package:torchserve" and e.value.exit_code == 1
    assert e.value.message == "stage 'package:torchserve' failed after [load, package:triton]: RuntimeError: disk full"
    assert e.value.report["status"] == "failed" and e.value.report["error"]["type"] == "StageError"
    assert tree(tmp_path) == []
    # and over an existing bundle, the old one stays as it was
    monkeypatch.undo()
    package(mlp_out, out, "triton")
    before = {p: (out / p).read_bytes() for p in tree(out) if (out / p).is_file()}
    monkeypatch.setattr(ts, "write_mar", boom)
    with pytest.raises(StageError, match=r"^stage 'package:torchserve' failed after \[load\]: RuntimeError: disk full$"):
        package(mlp_out, out, "torchserve", PackageOptions(force=True))
    assert {p: (out / p).read_bytes() for p in tree(out) if (out / p).is_file()} == before
    r = cli("package", mlp_out, "--for", "torchserve", "-o", out, "--force")  # the CLI: one line, exit 1
    assert r.exit_code == 1, r
    assert r.stderr.splitlines() == ["error: stage 'package:torchserve' failed after [load]: RuntimeError: disk full"]
    assert {p: (out / p).read_bytes() for p in tree(out) if (out / p).is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]


def test_output_inside_the_input_refused(mlp_out):
    with pytest.raises(BadInputError, match="overwrite or contain the input"):
        package(mlp_out, mlp_out / "bundle", "triton")
    assert not (mlp_out / "bundle").exists()


def test_unknown_system():
    with pytest.raises(BadInputError, match="unknown serving system"):
        parse_systems("triton,nginx")
    assert parse_systems(["kubernetes", "triton,k8s"]) == ["k8s", "triton"]


def test_package_options_are_checked_once_here():
    """The CLI only builds this class; the Python API gets the same messages."""
    check_options_class(PackageOptions, [({"device": "tpu"}, "unknown device 'tpu'; known: cpu, gpu"),
                                         ({"server": "nginx"}, "unknown server 'nginx'; known: triton, torchserve, tfserving"),
                                         ({"postprocess": "argmax"}, "unknown postprocess 'argmax'; known: none, softmax, topk=K")],
                        given={"device": "GPU", "server": "TorchServe"}, normalised={"device": "gpu", "server": "torchserve"})
