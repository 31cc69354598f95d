"""`modelport repo add|promote|rollback|list`: versions added whole and not served until promoted,
a promote and a rollback that a running `serve REPO --model-control poll` follows, and the config's
other fields kept."""

from __future__ import annotations

import time

import pytest

from tests.serving.test_serve import Server
from tests.serving.test_serve_repository import _infer, _matmul_file


def test_add_promote_rollback_edit_the_config_and_keep_the_rest(cli, tmp_path):
    for v in (1, 2, 3):
        _matmul_file(tmp_path / f"v{v}" / "model.onnx", 4, 3, v)
    repo = tmp_path / "repo"
    r = cli("repo", "add", repo, "m", tmp_path / "v1", "--json")
    assert r.exit_code == 0 and r.json()["serving"] == [1], r
    (repo / "m" / "config.pbtxt").write_text((repo / "m" / "config.pbtxt").read_text() + "max_batch_size: 8\n")
    assert cli("repo", "add", repo, "m", tmp_path / "v2", "--json").json()["serving"] == [1]  # added, not served
    assert cli("repo", "add", repo, "m", tmp_path / "v3" / "model.onnx", "--version", "7", "--json").json()["versions"] == [1, 2, 7]
    assert (repo / "m" / "7" / "model.onnx").is_file() and not [p for p in (repo / "m").iterdir() if p.name.startswith(".incoming")]
    r = cli("repo", "add", repo, "m", tmp_path / "v2", "--version", "2")
    assert r.exit_code == 2 and "version 2 of 'm' exists" in r.stderr
    assert cli("repo", "promote", repo, "m", "2", "--json").json() == {"model": "m", "serving": [2], "previous": [1]}
    assert cli("repo", "promote", repo, "m", "7", "--json").json()["previous"] == [2]
    assert cli("repo", "rollback", repo, "m", "--json").json()["serving"] == [2]
    assert cli("repo", "rollback", repo, "m", "--json").json()["serving"] == [1]
    r = cli("repo", "rollback", repo, "m")
    assert r.exit_code == 2 and "no earlier version to roll back to" in r.stderr
    assert "max_batch_size: 8" in (repo / "m" / "config.pbtxt").read_text()  # the rest of the config is kept
    assert cli("repo", "list", repo, "--json").json() == {"models": [{"name": "m", "versions": [1, 2, 7], "serving": [1]}]}
    r = cli("repo", "add", repo, "../x", tmp_path / "v1")
    assert r.exit_code == 2 and "bad model name" in r.stderr


@pytest.mark.slow
def test_a_polling_server_follows_promote_and_rollback(cli, tmp_path):
    for v in (1, 2):
        _matmul_file(tmp_path / f"v{v}" / "model.onnx", 4, 3, v)
    repo = tmp_path / "repo"
    cli("repo", "add", repo, "m", tmp_path / "v1")
    s = Server(repo, "--model-control", "poll", "--poll-seconds", "0.3", log=tmp_path / "poll.log")
    try:
        s.wait_ready(120)

        def serves(version: str) -> None:
            end = time.monotonic() + 30
            while _infer(s.http, "m", 4) != version:
                assert time.monotonic() < end, s.log.read_text()[-2000:]
                time.sleep(0.1)

        serves("1")
        cli("repo", "add", repo, "m", tmp_path / "v2")
        time.sleep(1.5)  # several scans: an added version does not serve
        assert _infer(s.http, "m", 4) == "1"
        cli("repo", "promote", repo, "m", "2")
        serves("2")
        cli("repo", "rollback", repo, "m")
        serves("1")
    finally:
        s.stop()
