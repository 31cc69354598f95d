"""The zoo: strict YAML, local builds, and downloads against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import http.server
import threading

import pytest

from modelport import zoo
from modelport.errors import BadInputError, UnsafeInputError

PAYLOAD = b"model bytes " * 1000
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == "/model.bin":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)
        elif self.path == "/truncated.bin":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD[:100])
        elif self.path == "/redirect-http":
            self.send_response(302)
            self.send_header("Location", "http://example.invalid/model.bin")
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_download_verifies_and_renames(server, tmp_path):
    dest = zoo.download(f"{server}/model.bin", tmp_path / "m.bin", SHA)
    assert dest.read_bytes() == PAYLOAD
    assert [p.name for p in tmp_path.iterdir()] == ["m.bin"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_downloaded_file_follows_the_umask(server, tmp_path, umask):
    import os
    import stat

    old = os.umask(umask)
    try:
        dest = zoo.download(f"{server}/model.bin", tmp_path / "m.bin", SHA)
    finally:
        os.umask(old)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_wrong_hash_leaves_no_file_and_keeps_good_copy(server, tmp_path):
    good = tmp_path / "m.bin"
    good.write_bytes(b"earlier good copy")
    with pytest.raises(UnsafeInputError, match="sha256 mismatch"):
        zoo.download(f"{server}/model.bin", good, "0" * 64)
    assert good.read_bytes() == b"earlier good copy"
    assert [p.name for p in tmp_path.iterdir()] == ["m.bin"]


def test_truncated_body_leaves_no_file(server, tmp_path):
    with pytest.raises(BadInputError, match="truncated|interrupted"):
        zoo.download(f"{server}/truncated.bin", tmp_path / "m.bin", SHA)
    assert list(tmp_path.iterdir()) == []


def test_redirect_to_plain_http_is_refused(server, tmp_path):
    with pytest.raises(UnsafeInputError, match="refusing"):
        zoo.download(f"{server}/redirect-http", tmp_path / "m.bin", SHA)
    assert list(tmp_path.iterdir()) == []


def test_plain_http_to_a_remote_host_is_refused(tmp_path):
    with pytest.raises(UnsafeInputError, match="https"):
        zoo.download("http://example.invalid/m.bin", tmp_path / "m.bin", SHA)


def test_fetch_uses_the_entry(server, tmp_path, monkeypatch):
    entries = zoo.parse_zoo({"models": {"remote": {"url": f"{server}/model.bin", "sha256": SHA, "revision": "v1.0", "framework": "onnx"}}})
    monkeypatch.setattr(zoo, "load_zoo", lambda path=None: entries)
    path = zoo.fetch("remote", tmp_path)
    assert path == tmp_path / "remote" / "v1.0" / "model.bin" and path.read_bytes() == PAYLOAD
    assert zoo.fetch("remote", tmp_path) == path  # cached copy reused after verification


@pytest.mark.parametrize("entry,error", [
    ({"builder": "x:y", "colour": "red"}, "unknown keys"),
    ({"url": "https://h/m", "revision": "v1"}, "no full sha256"),
    ({"url": "https://h/m", "sha256": "abc", "revision": "v1"}, "no full sha256"),
    ({"url": "https://h/m", "sha256": SHA, "revision": "main"}, "unpinned"),
    ({"url": "https://h/m", "sha256": SHA}, "unpinned"),
    ({"description": "nothing to build"}, "builder or a url"),
])
def test_strict_entries(entry, error):
    with pytest.raises((BadInputError, UnsafeInputError), match=error):
        zoo.parse_zoo({"models": {"m": entry}})


def test_shipped_zoo_has_the_required_kinds():
    entries = zoo.load_zoo()
    for name in ("cnn_small", "bert_tiny", "lstm_small", "mlp"):
        assert entries[name].input_specs(), name
    assert entries["bert_tiny"].input_specs()[0].dtype == "int64"


def test_unknown_zoo_model():
    with pytest.raises(BadInputError, match="unknown zoo model"):
        zoo.get("nope")


@pytest.mark.parametrize("name,revision", [("../escape", "v1.0"), ("ABS", "v1.0"), ("m", "../../escape"), ("m", "a/b"),
                                           ("..", "v1.0"), ("m", "x\0y")])
def test_names_and_revisions_that_would_leave_the_cache_are_refused(server, tmp_path, monkeypatch, name, revision):
    """A zoo name or revision is a path component of the cache: anything but one plain component is exit 2, nothing written."""
    cache = tmp_path / "cache"
    name = str(tmp_path / "abs") if name == "ABS" else name
    raw = {"models": {name: {"url": f"{server}/model.bin", "sha256": SHA, "revision": revision, "framework": "onnx"}}}
    with pytest.raises(BadInputError) as e:
        entries = zoo.parse_zoo(raw)
        monkeypatch.setattr(zoo, "load_zoo", lambda path=None: entries)
        zoo.fetch(name, cache)
    assert e.value.exit_code == 2
    assert list(tmp_path.rglob("*")) == []
