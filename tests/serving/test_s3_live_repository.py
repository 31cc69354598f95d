"""A repository on S3 that lives: `repo add|promote|rollback|list s3://…` edit it (pulled, changed,
uploaded back manifest-last), and `serve s3://… --model-control poll` follows each edit from its
local mirror without a failed request."""

from __future__ import annotations

import threading
import time

import pytest

from modelport.packaging.s3_repository import MANIFEST
from tests.serving.test_s3_repository import bucket, keys, leaks, manifest, s3, server  # noqa: F401 (fixtures)
from tests.serving.test_serve import Server
from tests.serving.test_serve_repository import _infer, _matmul_file

pytestmark = pytest.mark.slow


def test_repo_edits_on_s3_and_a_polling_server_follows_them(cli, s3, bucket, tmp_path):  # noqa: F811
    for v in (1, 2):
        _matmul_file(tmp_path / f"v{v}" / "model.onnx", 4, 3, v)
    uri = f"s3://{bucket}/live"
    r = cli("repo", "add", uri, "m", tmp_path / "v1", "--json")
    assert r.exit_code == 0 and r.json()["serving"] == [1] and r.json()["upload"]["objects"] >= 2, r
    assert f"live/{MANIFEST}" in keys(s3, bucket, "live/")
    s = Server(uri, "--model-control", "poll", "--poll-seconds", "0.3", log=tmp_path / "s3-poll.log")
    answers: list[str] = []
    failures: list[str] = []
    stop = threading.Event()

    def load():
        while not stop.is_set():
            try:
                answers.append(_infer(s.http, "m", 4))
            except Exception as e:  # a failed request during a swap is what this test forbids
                failures.append(f"{type(e).__name__}: {e}")

    try:
        s.wait_ready(120)
        assert _infer(s.http, "m", 4) == "1"
        sender = threading.Thread(target=load, daemon=True)
        sender.start()

        def serves(version: str) -> None:
            end = time.monotonic() + 60
            while _infer(s.http, "m", 4) != version:
                assert time.monotonic() < end, s.log.read_text()[-2000:]
                time.sleep(0.1)

        r = cli("repo", "add", uri, "m", tmp_path / "v2", "--json")
        assert r.exit_code == 0 and r.json()["serving"] == [1] and r.json()["versions"] == [1, 2], r
        time.sleep(2)  # several refreshes and scans: an added version does not serve
        assert _infer(s.http, "m", 4) == "1"
        assert cli("repo", "promote", uri, "m", "2").exit_code == 0
        serves("2")
        assert cli("repo", "rollback", uri, "m").exit_code == 0
        serves("1")
        stop.set()
        sender.join(30)
    finally:
        stop.set()
        s.stop()
    assert not failures, failures[:5]
    assert {"1", "2"} <= set(answers), set(answers)
    assert cli("repo", "list", uri, "--json").json() == {"models": [{"name": "m", "versions": [1, 2], "serving": [1]}]}
    assert sorted(f["path"] for f in manifest(s3, bucket, "live")["files"]) == [
        "m/.modelport-history", "m/1/model.onnx", "m/2/model.onnx", "m/config.pbtxt"]
    text = s.log.read_text()
    assert "files refreshed" in text and not leaks(text), text[-2000:]


def test_repo_on_s3_needs_a_manifest_except_to_add_and_refuses_other_schemes(cli, s3, bucket, tmp_path):  # noqa: F811
    r = cli("repo", "promote", f"s3://{bucket}/none", "m", "1")
    assert r.exit_code == 2 and MANIFEST in r.stderr, r
    r = cli("repo", "list", "gs://b/p")
    assert r.exit_code == 2 and "a local folder or s3://bucket/prefix" in r.stderr, r
    assert not (tmp_path / "gs:").exists()
