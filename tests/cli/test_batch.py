"""`modelport batch`, the CI outputs (--junit, GitHub), `report diff` and --keep-failed, through real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from tests.conftest import tree


def _manifest(folder: Path, tiny: Path, extra: str = "") -> Path:
    shutil.copy(tiny, folder / "good.onnx")
    (folder / "bad.onnx").write_bytes(b"not a model")
    m = folder / "models.yaml"
    m.write_text("defaults:\n  to: [onnx, ort]\nmodels:\n  - source: good.onnx\n  - {source: bad.onnx, name: bad}\n" + extra)
    return m


JUNIT_XSD = Path(__file__).with_name("schemas") / "junit.xsd"


def _junit(path: Path) -> ET.Element:
    """The JUnit file, checked against the JUnit schema CI systems read, as an element tree."""
    import xmlschema

    xmlschema.XMLSchema(JUNIT_XSD).validate(str(path))
    return ET.parse(path).getroot()


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _by_name(summary: dict) -> dict:
    return {m["name"]: m for m in summary["models"]}


def test_batch_isolates_failures_and_reports_every_model(cli_proc, tiny_onnx, tmp_path):
    # 0.05 s: no convert process gets past its imports that fast, so this job is always still running when killed
    m = _manifest(tmp_path, tiny_onnx, "  - {source: good.onnx, name: hang, timeout: 0.05}\n"
                                       "  - {source: good.onnx, name: fat, memory: 1MiB}\n")
    out, junit = tmp_path / "out", tmp_path / "batch.xml"
    r = cli_proc("batch", m, "-o", out, "--jobs", "2", "--junit", junit)
    assert r.exit_code == 4, r
    assert "3 of 4 model(s) failed: bad, hang, fat" in r.stderr
    models = _by_name(_summary(out))
    assert models["good"]["status"] == "ok" and (out / "good" / "report.json").is_file() and (out / "good" / "model.ort").is_file()
    assert models["bad"]["status"] == "failed" and models["bad"]["exit_code"] == 2 and "not an ONNX model" in models["bad"]["error"]
    assert models["hang"]["status"] == "timeout" and "0.05 s" in models["hang"]["error"]
    assert models["fat"]["status"] == "out-of-memory"
    assert not (out / "bad").exists() and not (out / "hang").exists()  # failures leave no partial output
    cases = _junit(junit)
    assert cases.get("tests") == "6" and cases.get("failures") == "1" and cases.get("errors") == "2"
    good = cases.find("testsuite[@name='good']")
    assert {c.get("name") for c in good} == {"onnx→onnx (IR)", "onnx→onnx (end to end)", "onnx→ort (end to end)"}
    assert "max_abs=" in good.find("testcase/system-out").text
    assert "not an ONNX model" in cases.find("testsuite[@name='bad']/testcase/failure").get("message")


def test_batch_reruns_only_what_changed_or_failed(cli_proc, tiny_onnx, tmp_path):
    m = _manifest(tmp_path, tiny_onnx)
    out = tmp_path / "out"
    assert cli_proc("batch", m, "-o", out).exit_code == 4
    first = _by_name(_summary(out))
    stamp = (out / "good" / "report.json").stat().st_mtime_ns

    r = cli_proc("batch", m, "-o", out, "--json")
    again = _by_name(r.json())
    assert again["good"]["skipped"] is True and again["good"]["key"] == first["good"]["key"]
    assert (out / "good" / "report.json").stat().st_mtime_ns == stamp
    assert again["bad"]["skipped"] is False  # a failure is always retried

    (tmp_path / "bad.onnx").write_bytes((tmp_path / "good.onnx").read_bytes())  # the source is fixed
    r = cli_proc("batch", m, "-o", out, "--rerun-failed", "--json")
    assert r.exit_code == 0, r
    fixed = _by_name(r.json())
    assert fixed["bad"]["status"] == "ok" and fixed["good"]["skipped"] is True

    (tmp_path / "good.onnx").touch()  # a new mtime, the same bytes: still skipped
    assert _by_name(cli_proc("batch", m, "-o", out, "--json").json())["good"]["skipped"] is True
    m.write_text(m.read_text().replace("to: [onnx, ort]", "to: [onnx]"))  # new options: every model runs again
    assert not any(e["skipped"] for e in cli_proc("batch", m, "-o", out, "--json").json()["models"])


def _kill_when_seen(needle: str, sig: int, *, parent: bool = False, timeout: float = 120) -> threading.Thread:
    """Send `sig` to the convert process whose command line holds `needle` (or to its parent) once it appears."""
    def watch():
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for p in psutil.process_iter(["cmdline"]):
                cmd = p.info["cmdline"] or []
                if any(needle in c for c in cmd) and "convert" in cmd:
                    target = p.parent() if parent else p
                    os.kill(target.pid, sig)
                    if parent:
                        os.killpg(p.pid, signal.SIGKILL)
                    return
            time.sleep(0.02)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_a_crashing_model_does_not_stop_the_batch_and_a_killed_batch_resumes(tiny_onnx, tmp_path):
    shutil.copy(tiny_onnx, tmp_path / "crashme.onnx")
    m = _manifest(tmp_path, tiny_onnx, "  - {source: crashme.onnx, name: crash}\n")
    out = tmp_path / "out"
    watcher = _kill_when_seen("crashme.onnx", signal.SIGSEGV)
    p = subprocess.run([sys.executable, "-m", "modelport", "batch", str(m), "-o", str(out), "--json"],
                       capture_output=True, text=True, timeout=600)
    watcher.join(1)
    models = _by_name(json.loads(p.stdout))
    assert p.returncode == 4
    assert models["crash"]["status"] == "crashed" and "SIGSEGV" in models["crash"]["error"]
    assert models["good"]["status"] == "ok"

    # a batch killed while a model runs: what finished before stays done and is not redone
    shutil.rmtree(out)
    batch = subprocess.Popen([sys.executable, "-m", "modelport", "batch", str(m), "-o", str(out), "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    end = time.monotonic() + 300
    while not (out / ".batch" / "good.json").is_file() and time.monotonic() < end:
        time.sleep(0.05)
    os.killpg(batch.pid, signal.SIGKILL)
    batch.wait()
    assert not (out / "summary.json").exists()
    p = subprocess.run([sys.executable, "-m", "modelport", "batch", str(m), "-o", str(out), "--json"],
                       capture_output=True, text=True, timeout=600)
    models = _by_name(json.loads(p.stdout))
    assert models["good"]["skipped"] is True and models["crash"]["status"] == "ok"


def test_batch_manifest_and_output_errors_are_exit_2(cli_proc, tiny_onnx, tmp_path):
    m = tmp_path / "m.yaml"
    for text, reason in [("models: []\n", "non-empty `models:`"), ("models:\n  - {source: x.onnx, colour: red}\n", "unknown key(s) ['colour']"),
                         ("models:\n  - {source: x.onnx, name: ../up}\n", "bad model name"),
                         ("models:\n  - {source: a.onnx}\n  - {source: b/a.onnx}\n", "two models are named 'a'"),
                         ("models:\n  - {source: x.onnx, memory: lots}\n", "bad memory limit"), ("models: [", "cannot read")]:
        m.write_text(text)
        r = cli_proc("batch", m, "-o", tmp_path / "out")
        assert r.exit_code == 2 and reason in r.stderr, (text, r)
        assert not (tmp_path / "out").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    m.write_text("models:\n  - x.onnx\n")
    r = cli_proc("batch", m, "-o", mine)
    assert r.exit_code == 2 and "not written by `modelport batch`" in r.stderr and tree(mine) == ["notes.txt"]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A real Ray head node on 127.0.0.1 (started with `ray start`, stopped after the module): the
    existing cluster a user points `--executor ray --address` at.

    The cluster runs outside the suite's network guard: Ray's own head processes look up cloud
    metadata hosts at start even with usage stats disabled (Ray 2.60), and its runtime-env agent
    resolves the host's address. modelport's driver, which joins it, stays under the guard.
    """
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    guard = str(Path(__file__).resolve().parents[1] / "netguard")
    cluster_env = {k: v for k, v in os.environ.items() if k != "MODELPORT_TEST_NET_LOG"}
    cluster_env["PYTHONPATH"] = os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != guard)
    cluster_env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    ray = str(Path(sys.executable).with_name("ray"))
    started = subprocess.run([ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                              "--include-dashboard=false", "--disable-usage-stats"], env=cluster_env, capture_output=True,
                             text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        yield f"127.0.0.1:{port}", {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    finally:
        subprocess.run([ray, "stop", "--force"], env=cluster_env, capture_output=True, timeout=120)


def test_batch_on_a_ray_cluster_isolates_a_crashed_worker(cli_proc, tiny_onnx, tmp_path, ray_cluster):
    address, env = ray_cluster
    shutil.copy(tiny_onnx, tmp_path / "crashme.onnx")
    m = _manifest(tmp_path, tiny_onnx, "  - {source: crashme.onnx, name: crash, resources: {cpus: 1}}\n")
    out = tmp_path / "out"
    watcher = _kill_when_seen("crashme.onnx", signal.SIGKILL, parent=True)  # the Ray worker running the task dies
    r = cli_proc("batch", m, "-o", out, "--executor", "ray", "--address", address, "--json", env=env)
    watcher.join(1)
    assert r.exit_code == 4, r
    summary = r.json()
    models = _by_name(summary)
    assert summary["executor"] == "ray"
    assert models["good"]["status"] == "ok" and (out / "good" / "model.ort").is_file()
    assert models["bad"]["status"] == "failed" and models["bad"]["exit_code"] == 2
    assert models["crash"]["status"] == "crashed" and "Ray task failed" in models["crash"]["error"]
    r = cli_proc("batch", m, "-o", out, "--executor", "ray", "--address", address, "--json", env=env)
    assert _by_name(r.json())["good"]["skipped"] is True  # the same resume as the local executor


def test_report_diff_gates_regressions(cli_proc, tiny_onnx, tmp_path):
    m = _manifest(tmp_path, tiny_onnx)
    old = tmp_path / "old"
    cli_proc("batch", m, "-o", old)
    same = cli_proc("report", "diff", old, old / "summary.json", "--json")
    assert same.exit_code == 0 and same.json()["regressions"] == 0 and same.json()["rows"]

    new = tmp_path / "new"
    shutil.copytree(old, new)
    report = json.loads((new / "good" / "report.json").read_text())
    report["artifacts"][0]["size"] *= 2
    report["parity"][0]["outputs"][0]["max_abs"] = 0.5
    (new / "good" / "report.json").write_text(json.dumps(report))
    r = cli_proc("report", "diff", old, new, "--json")
    assert r.exit_code == 4
    flagged = {(row["metric"], row["target"].split(":")[0]) for row in r.json()["rows"] if row["regression"]}
    assert ("size", "onnx") in flagged and any(metric == "max_abs" for metric, _ in flagged)
    assert "regression(s)" in r.stderr
    assert cli_proc("report", "diff", old, new, "--max-size-growth", "1.5", "--max-error-growth", "1e9").exit_code == 4  # max_abs + floor

    summary = json.loads((new / "summary.json").read_text())
    summary["models"][0].update(status="failed", error="boom")
    (new / "summary.json").write_text(json.dumps(summary))
    r = cli_proc("report", "diff", old, new)
    assert r.exit_code == 4 and "good status" in r.stderr
    assert cli_proc("report", "diff", old, tmp_path / "models.yaml").exit_code == 2


def test_convert_goes_on_past_a_failing_target_and_keeps_it_on_request(cli_proc, tiny_onnx, tmp_path):
    out = tmp_path / "out"
    r = cli_proc("convert", tiny_onnx, "--to", "onnx,tensorrt,ort", "-o", out, "--keep-failed", "--json")
    assert r.exit_code == 4 and "1 of 3 targets failed: tensorrt" in r.stderr
    doc = r.json()
    assert [a["target"] for a in doc["artifacts"]] == ["onnx", "ort"]  # the targets after the failing one still ran
    assert doc["target_failures"][0]["target"] == "tensorrt" and doc["target_failures"][0]["exit_code"] == 5
    assert not out.exists()
    kept = tmp_path / "out.failed"
    assert json.loads((kept / "FAILED.json").read_text())["exit_code"] == 4
    assert json.loads((kept / "report.json").read_text())["status"] == "failed"
    assert (kept / "model.ort").is_file()
    r = cli_proc("package", kept, "--for", "triton", "-o", tmp_path / "pkg")
    assert r.exit_code == 2 and "failed run kept by --keep-failed" in r.stderr
    # without --keep-failed nothing is left
    r = cli_proc("convert", tiny_onnx, "--to", "onnx,tensorrt", "-o", tmp_path / "plain")
    assert r.exit_code == 4 and not (tmp_path / "plain").exists() and not (tmp_path / "plain.failed").exists()


def test_single_commands_write_junit_and_github_annotations(cli_proc, tiny_onnx, tmp_path):
    (tmp_path / "ci").mkdir()
    junit, summary = tmp_path / "ci" / "r.xml", tmp_path / "ci" / "step.md"
    gh = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    r = cli_proc("convert", tiny_onnx, "--to", "onnx", "-o", tmp_path / "ok", "--junit", junit, env=gh)
    assert r.exit_code == 0
    root = _junit(junit)
    assert root.get("failures") == "0" and int(root.get("tests")) == 2
    assert "| tiny.onnx | ✅ ok |" in summary.read_text()

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"junk")
    r = cli_proc("validate", bad, tiny_onnx, "--junit", junit, env=gh)
    assert r.exit_code == 2
    assert "::error" in r.stderr and "title=modelport" in r.stderr and "not an ONNX model" in r.stderr
    assert _junit(junit).find("testsuite/testcase/failure") is not None
    assert summary.read_text().count("### modelport") == 2
    r = cli_proc("convert", tiny_onnx, "--to", "onnx", "-o", tmp_path / "ok2", "--json")
    assert "::error" not in r.stderr  # only under GitHub Actions


def _dom(page: Path, tmp_path: Path) -> str:
    """The page as a real headless Chromium renders it (no network: background fetches are off and
    the page may name no remote resource)."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium package is needed (make test installs it)"
    p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                        f"--user-data-dir={tmp_path / 'chromium-profile'}", "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def test_report_html_opens_from_disk_in_a_browser(cli_proc, tiny_onnx, tmp_path):
    out = tmp_path / "auto"
    assert cli_proc("convert", tiny_onnx, "--to", "onnx", "--optimize", "auto", "-o", out).exit_code == 0
    page = out / "report.html"
    text = page.read_text()
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text and "<script" not in text
    dom = _dom(page, tmp_path)
    report = json.loads((out / "report.json").read_text())
    for hop in report["parity"]:
        assert hop["hop"] in dom
    for stage in (s for s in report["stages"] if "pass" in s):
        assert f"<td>{stage['pass']}</td>" in dom
    assert dom.count('class="variant"') == len(report["optimize"]["variants"]) and "(chosen)" in dom

    m = _manifest(tmp_path, tiny_onnx)
    batch = tmp_path / "batch"
    cli_proc("batch", m, "-o", batch)
    dom = _dom(batch / "report.html", tmp_path)
    assert '<a href="good/report.html">good</a>' in dom and "1/2 ok" in dom and "not an ONNX model" in dom
    assert (batch / "good" / "report.html").is_file()
