"""`modelport batch --emit k8s-job`: the Indexed Job, its index table, the pods' commands and entry point."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from modelport.orchestration.batch import load_manifest
from tests.conftest import tree

K8S_VERSION = "1.37.0"  # the schemas kubernetes-validate ships, offline
IMAGE = "registry.example.com:5000/ml/modelport:1.4"


def _manifest(folder: Path, text: str | None = None) -> Path:
    (folder / "sub").mkdir(exist_ok=True)
    for name in ("a.onnx", "sub/b.onnx", "inputs.npz"):
        (folder / name).write_bytes(b"x")
    m = folder / "models.yaml"
    m.write_text(text or (
        "defaults:\n  to: [onnx, ort]\n  timeout: 600\n  memory: 1GiB\n"
        "models:\n"
        "  - source: a.onnx\n"
        "  - {source: sub/b.onnx, name: bee, data: inputs.npz, precision: fp16, resources: {cpus: 2}}\n"
        "  - {source: zoo:cnn_small, input: ['input:batch,3,64,64'], timeout: 1200, memory: 3GiB,\n"
        "     tolerances: {atol: 0.001, outputs: {probs: {atol: 0.1}}}}\n"))
    return m


def _emit(cli, m: Path, out: Path, *extra) -> tuple[dict, dict]:
    r = cli("batch", m, "-o", out, "--emit", "k8s-job", "--image", IMAGE, *extra)
    assert r.exit_code == 0, r
    return yaml.safe_load((out / "configmap.yaml").read_text()), yaml.safe_load((out / "job.yaml").read_text())


def test_the_job_and_configmap_validate_against_the_kubernetes_schema(cli, tmp_path):
    configmap, job = _emit(cli, _manifest(tmp_path), tmp_path / "k8s", "--jobs", "2", "--namespace", "ml", "--pvc", "fleet")
    for doc in (configmap, job):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    spec = job["spec"]
    assert (job["apiVersion"], job["kind"], job["metadata"]["namespace"]) == ("batch/v1", "Job", "ml")
    assert spec["completionMode"] == "Indexed" and spec["completions"] == 3 and spec["parallelism"] == 2
    assert spec["backoffLimitPerIndex"] == 0 and "maxFailedIndexes" not in spec  # no retry; every other index still runs
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert {v["name"]: v for v in pod["volumes"]} == {
        "data": {"name": "data", "persistentVolumeClaim": {"claimName": "fleet"}},
        "manifest": {"name": "manifest", "configMap": {"name": configmap["metadata"]["name"]}}}
    (c,) = pod["containers"]
    assert c["image"] == IMAGE
    assert c["command"] == ["python", "-m", "modelport.orchestration.batch_k8s", "/etc/modelport/manifest.yaml", "/data/out"]
    assert sorted(tree(tmp_path / "k8s")) == ["configmap.yaml", "index.tsv", "job.yaml"]


def test_the_schema_check_catches_a_broken_job(cli, tmp_path):
    _, job = _emit(cli, _manifest(tmp_path), tmp_path / "k8s")
    job["spec"]["completionMode"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_the_index_table_follows_the_manifest_order_and_is_stable(cli, tmp_path):
    m = _manifest(tmp_path)
    configmap, _ = _emit(cli, m, tmp_path / "k8s")
    _emit(cli, m, tmp_path / "again")
    table = (tmp_path / "k8s" / "index.tsv").read_text()
    assert table == configmap["data"]["index.tsv"] == (tmp_path / "again" / "index.tsv").read_text()
    rows = [line.split("\t") for line in table.splitlines()]
    assert rows[0] == ["index", "name", "command"]
    assert [(i, n) for i, n, _ in rows[1:]] == [("0", "a"), ("1", "bee"), ("2", "cnn_small")]
    pod_manifest = yaml.safe_load(configmap["data"]["manifest.yaml"])
    assert [e["name"] for e in pod_manifest["models"]] == ["a", "bee", "cnn_small"]


def test_the_command_of_index_i_is_what_the_local_executor_runs_for_model_i(cli, tmp_path):
    m = _manifest(tmp_path)
    configmap, _ = _emit(cli, m, tmp_path / "k8s")
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(configmap["data"]["manifest.yaml"])
    local, pods = load_manifest(m), load_manifest(pod_file)
    local_out = tmp_path / "out"
    table = [line.split("\t") for line in (tmp_path / "k8s" / "index.tsv").read_text().splitlines()[1:]]
    assert len(local) == len(pods) == len(table) == 3
    for i, (job, pod_job) in enumerate(zip(local, pods, strict=True)):
        here = [a.replace(str(local_out), "/data/out").replace(str(m.parent.resolve()), "/data/src")
                for a in job.command(local_out / job.name)]
        there = pod_job.command(Path("/data/out") / pod_job.name)
        assert there == here and there[0] == sys.executable
        assert (pod_job.timeout, pod_job.memory, pod_job.name) == (job.timeout, job.memory, job.name)
        assert table[i] == [str(i), job.name, shlex.join(["python", *here[1:]])]
    assert "--data" in pods[1].argv and "/data/src/inputs.npz" in pods[1].argv and "/data/src/sub/b.onnx" == pods[1].source


def test_resources_come_from_the_largest_per_model_limits(cli, tmp_path):
    _, job = _emit(cli, _manifest(tmp_path), tmp_path / "k8s")
    pod = job["spec"]["template"]["spec"]
    # 3 GiB, the largest `memory`, plus 512 MiB for the batch process watching the child: the child is killed first
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "3584Mi"}, "limits": {"memory": "3584Mi"}}
    assert pod["activeDeadlineSeconds"] == 1200 + 300  # a backstop above the longest per-model timeout


def test_gpus_and_no_limits(cli, tmp_path):
    m = _manifest(tmp_path, "models:\n  - {source: a.onnx, resources: {gpus: 1}}\n  - sub/b.onnx\n")
    _, job = _emit(cli, m, tmp_path / "k8s", "--jobs", "8")
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert job["spec"]["parallelism"] == 2  # never more than the models
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


@pytest.mark.parametrize("args, message", [
    (["--emit", "k8s-job", "--image", IMAGE, "--executor", "ray"], "--executor ray makes no sense"),
    (["--emit", "k8s-job", "--image", IMAGE, "--only", "a"], "--only makes no sense"),
    (["--emit", "k8s-job", "--image", IMAGE, "--rerun-failed"], "--rerun-failed makes no sense"),
    (["--emit", "k8s-job"], "needs --image"),
    (["--emit", "helm", "--image", IMAGE], "unknown --emit 'helm'"),
    (["--image", IMAGE], "add --emit k8s-job"),
    (["--emit", "k8s-job", "--image", "Registry/UPPER:1"], "not a container image reference"),
    (["--emit", "k8s-job", "--image", "modelport latest"], "not a container image reference"),
    (["--emit", "k8s-job", "--image", "modelport:"], "not a container image reference"),
    (["--emit", "k8s-job", "--image", "../../x"], "not a container image reference"),
    (["--emit", "k8s-job", "--image", IMAGE, "--namespace", "Team_A"], "bad --namespace"),
    (["--emit", "k8s-job", "--image", IMAGE, "--pvc", "../claim"], "bad --pvc"),
])
def test_options_that_make_no_sense_exit_2_and_write_nothing(cli, tmp_path, args, message):
    m = _manifest(tmp_path)
    before = tree(tmp_path)
    r = cli("batch", m, "-o", tmp_path / "k8s", *args)
    assert r.exit_code == 2, r
    assert message in r.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize("source, message", [
    ("../elsewhere.onnx", "outside the manifest's folder"),
    ("sub/../../elsewhere.onnx", "outside the manifest's folder"),
    ("/abs/model.onnx", "is an absolute path"),
])
def test_files_the_pods_cannot_see_exit_2(cli, tmp_path, source, message):
    folder = tmp_path / "fleet"
    folder.mkdir()
    (tmp_path / "elsewhere.onnx").write_bytes(b"x")
    m = _manifest(folder, f"models:\n  - a.onnx\n  - {{source: '{source}', name: far}}\n")
    r = cli("batch", m, "-o", tmp_path / "k8s", "--emit", "k8s-job", "--image", IMAGE)
    assert r.exit_code == 2 and message in r.stderr, r
    assert not (tmp_path / "k8s").exists()


def test_an_output_folder_that_is_not_empty_is_refused(cli, tmp_path):
    m = _manifest(tmp_path)
    out = tmp_path / "k8s"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    r = cli("batch", m, "-o", out, "--emit", "k8s-job", "--image", IMAGE)
    assert r.exit_code == 2 and "not empty" in r.stderr, r
    assert tree(out) == ["mine.txt"]


def test_a_pod_runs_its_index_and_rerun_failed_reads_the_results(cli_proc, tiny_onnx, tmp_path):
    """The pods' entry point, run here as a pod runs it: each index leaves OUT/.batch/<name>.json for --rerun-failed."""
    shutil.copy(tiny_onnx, tmp_path / "good.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    m = tmp_path / "models.yaml"
    m.write_text("models:\n  - good.onnx\n  - bad.onnx\n")
    out = tmp_path / "out"
    codes = {}
    for index in (0, 1):
        p = subprocess.run([sys.executable, "-m", "modelport.orchestration.batch_k8s", str(m), str(out)], capture_output=True,
                           text=True, timeout=600, env={**os.environ, "JOB_COMPLETION_INDEX": str(index)})
        codes[index] = p.returncode
    assert codes == {0: 0, 1: 4}
    good, bad = (json.loads((out / ".batch" / f"{n}.json").read_text()) for n in ("good", "bad"))
    assert good["status"] == "ok" and (out / "good" / "report.json").is_file()
    assert bad["status"] == "failed" and bad["exit_code"] == 2
    r = cli_proc("batch", m, "-o", out, "--rerun-failed", "--json")
    assert r.exit_code == 4, r
    summary = json.loads(r.stdout)
    models = {e["name"]: e for e in summary["models"]}
    assert models["good"]["skipped"] is True and models["bad"]["skipped"] is False


def test_the_pod_entry_point_refuses_a_missing_index(tmp_path):
    m = _manifest(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "JOB_COMPLETION_INDEX"}
    p = subprocess.run([sys.executable, "-m", "modelport.orchestration.batch_k8s", str(m), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and "JOB_COMPLETION_INDEX" in p.stderr
    p = subprocess.run([sys.executable, "-m", "modelport.orchestration.batch_k8s", str(m), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, env={**env, "JOB_COMPLETION_INDEX": "3"})
    assert p.returncode == 2 and "outside the manifest's 3 model(s)" in p.stderr
    assert not (tmp_path / "out").exists()


def test_pods_writing_the_shared_summary_never_share_a_temporary_file(tmp_path, monkeypatch):
    """Every pod is pid 1 in its container: the summary's and the dashboard's temporary names must not depend on the pid alone."""
    from modelport.orchestration import batch
    from modelport.validation import html_report

    monkeypatch.setattr(os, "getpid", lambda: 1)
    sources = []
    real_replace = os.replace

    def replace(src, dst):
        sources.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    for _ in range(2):
        batch._atomic_write(tmp_path / "summary.json", {"schema": batch.SCHEMA})
        html_report.write_html(tmp_path / "report.html", "<html></html>")
    assert len(sources) == len(set(sources)) == 4
    assert sorted(tree(tmp_path)) == ["report.html", "summary.json"]


def test_keep_failed_reaches_every_pod_and_its_command(cli, tmp_path):
    configmap, job = _emit(cli, _manifest(tmp_path), tmp_path / "k8s", "--keep-failed", "--json")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "--keep-failed"
    rows = configmap["data"]["index.tsv"].splitlines()[1:]
    assert len(rows) == 3 and all(r.endswith(" --keep-failed") for r in rows)


@pytest.mark.parametrize("resources, message", [("{cpus: lots}", "bad resources.cpus"), ("{gpus: two}", "resources.gpus")])
def test_bad_resources_exit_2(cli, tmp_path, resources, message):
    m = _manifest(tmp_path, f"models:\n  - {{source: a.onnx, resources: {resources}}}\n")
    r = cli("batch", m, "-o", tmp_path / "k8s", "--emit", "k8s-job", "--image", IMAGE)
    assert r.exit_code == 2 and message in r.stderr, r
    assert not (tmp_path / "k8s").exists()
