"""S3 model repositories against a real S3-compatible server (moto's server mode on 127.0.0.1):
`package -o s3://…` uploads atomically (manifest last, nothing of a failed run left), `pull` checks
every object against the manifest, an existing prefix is replaced only when modelport wrote it,
and no credential ever reaches the output."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path

import pytest
import yaml

from modelport.errors import BadInputError, MissingDependencyError, ModelportError, UnsafeInputError
from modelport.orchestration.package import package
from modelport.packaging import PackageOptions, s3_repository
from modelport.packaging.s3_repository import MANIFEST, SCHEMA, TEMP_MARK, parse_uri, pull, upload
from tests.conftest import tree

ACCESS_KEY = "AKIAMODELPORTTEST0001"
SECRET = "SECRETmodelportTEST123"
TOKEN = "TOKENmodelportTEST456"
CREDENTIALS = (ACCESS_KEY, SECRET, TOKEN)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def aws_env(mp: pytest.MonkeyPatch, endpoint: str, home: Path) -> None:
    """Only what the test sets: fake credentials, the endpoint, no config file, no instance metadata."""
    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_SESSION_TOKEN",
                "AWS_SECURITY_TOKEN", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"):
        mp.delenv(key, raising=False)
    mp.setenv("AWS_ENDPOINT_URL", endpoint)
    mp.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    mp.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
    mp.setenv("AWS_CONFIG_FILE", str(home / "config"))
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "credentials"))
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A moto S3 server on a free loopback port, and the AWS environment pointing at it."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    with pytest.MonkeyPatch.context() as mp:
        aws_env(mp, f"http://127.0.0.1:{port}", tmp_path_factory.mktemp("aws"))
        yield f"http://127.0.0.1:{port}"
    srv.stop()


@pytest.fixture
def s3(server):
    return s3_repository.client()


@pytest.fixture
def bucket(s3) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def keys(s3, bucket: str, prefix: str = "") -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def body(s3, bucket: str, key: str) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def manifest(s3, bucket: str, prefix: str) -> dict:
    return json.loads(body(s3, bucket, f"{prefix}/{MANIFEST}"))


def files_of(folder: Path) -> dict[str, bytes]:
    return {p: (folder / p).read_bytes() for p in tree(folder) if (folder / p).is_file()}


@pytest.fixture
def recorded(monkeypatch):
    """(operation, key) of every S3 request the code under test makes, in order."""
    calls: list[tuple[str, str | None]] = []
    real = s3_repository.client

    def recording():
        c = real()
        c.meta.events.register("before-parameter-build.s3",
                               lambda params, model, **_: calls.append((model.name, params.get("Key"))))
        return c

    monkeypatch.setattr(s3_repository, "client", recording)
    return calls


# --- package -o s3://… --------------------------------------------------------------------------


def test_package_uploads_a_repository_manifest_last(cli, mlp_out, server, s3, tmp_path, monkeypatch, recorded):
    if "models" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket="models")
    monkeypatch.chdir(tmp_path)
    r = cli("package", mlp_out, "--for", "triton", "-o", "s3://models/cnn", "--json")
    assert r.exit_code == 0, r
    doc = r.json()
    stored = keys(s3, "models", "cnn/")
    assert f"cnn/{MANIFEST}" in stored and "cnn/mlp/config.pbtxt" in stored and "cnn/report.json" in stored
    assert not [k for k in stored if TEMP_MARK in k]  # the temporary prefix is gone
    m = manifest(s3, "models", "cnn")
    assert m["schema"] == SCHEMA and m["objects"] == len(m["files"]) == len(stored) - 1
    assert sorted(f"cnn/{f['path']}" for f in m["files"]) == [k for k in stored if not k.endswith(MANIFEST)]
    for f in m["files"]:
        data = body(s3, "models", f"cnn/{f['path']}")
        assert len(data) == f["size"] and hashlib.sha256(data).hexdigest() == f["sha256"], f["path"]
    up = doc["upload"]
    assert up["uri"] == "s3://models/cnn" and up["objects"] == m["objects"] and up["manifest"] == f"cnn/{MANIFEST}"
    assert up["manifest_sha256"] == hashlib.sha256(body(s3, "models", f"cnn/{MANIFEST}")).hexdigest()
    assert doc["stages"][-1]["name"] == "upload" and doc["bundles"][0]["path"] == "."
    # the order: every object under the temporary prefix, then copied into place, the manifest last
    writes = [(op, k) for op, k in recorded if op in ("PutObject", "CopyObject", "DeleteObject", "DeleteObjects")]
    assert writes[-2] == ("PutObject", f"cnn/{MANIFEST}") and writes[-1][0] == "DeleteObjects"
    puts = [k for op, k in writes[:-2] if op == "PutObject"]
    assert puts and all(k.startswith(f"cnn/{TEMP_MARK}") for k in puts)
    assert [op for op, _ in writes[:-2]] == ["PutObject"] * len(puts) + ["CopyObject"] * len(puts)
    assert tree(tmp_path) == [] and Path.cwd() == tmp_path  # no local folder named "s3:"


def test_kserve_storage_uri_points_into_the_upload(cli, mlp_out, s3, bucket):
    r = cli("package", mlp_out, "--for", "kserve", "-o", f"s3://{bucket}/ks", "--json")
    assert r.exit_code == 0, r
    isvc = yaml.safe_load(body(s3, bucket, "ks/inferenceservice.yaml"))
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == f"s3://{bucket}/ks/model_repository"
    assert "ks/model_repository/mlp/config.pbtxt" in keys(s3, bucket)
    r = cli("package", mlp_out, "--for", "triton,kserve", "-o", f"s3://{bucket}/two", "--json")
    assert r.exit_code == 0, r
    isvc = yaml.safe_load(body(s3, bucket, "two/kserve/inferenceservice.yaml"))
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == f"s3://{bucket}/two/kserve/model_repository"
    report = package(mlp_out, f"s3://{bucket}/given", "kserve", PackageOptions(storage_uri="s3://elsewhere/m"))
    assert report["bundles"][0]["storage_uri"] == "s3://elsewhere/m"  # --storage-uri wins


# --- atomicity ------------------------------------------------------------------------------------


def failing_after(n: int, real):
    count = {"n": 0}

    def step(*args):
        count["n"] += 1
        if count["n"] > n:
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "InternalError", "Message": "we encountered an internal error"}}, "CopyObject")
        return real(*args)

    return step


@pytest.mark.parametrize("phase", ["_put", "_copy"])
def test_a_failed_upload_leaves_no_repository(cli, mlp_out, s3, bucket, monkeypatch, phase):
    monkeypatch.setattr(s3_repository, phase, failing_after(2, getattr(s3_repository, phase)))
    r = cli("package", mlp_out, "--for", "triton", "-o", f"s3://{bucket}/m")
    assert r.exit_code == 1 and "InternalError" in r.stderr and "internal error:" not in r.stderr, r
    assert keys(s3, bucket) == []  # no manifest, none of this run's objects, no temporary prefix


def test_a_failed_replacement_leaves_no_half_repository(mlp_out, s3, bucket, monkeypatch):
    uri = f"s3://{bucket}/m"
    package(mlp_out, uri, "triton")
    monkeypatch.setattr(s3_repository, "_copy", failing_after(1, s3_repository._copy))
    with pytest.raises(ModelportError, match="InternalError"):
        package(mlp_out, uri, "triton", PackageOptions(force=True, model_name="other"))
    assert keys(s3, bucket) == []  # the old repository's objects were ours: none stays without its manifest
    monkeypatch.undo()
    package(mlp_out, uri, "triton")  # the prefix is free again
    assert f"m/{MANIFEST}" in keys(s3, bucket)


# --- existing prefixes ----------------------------------------------------------------------------


def test_existing_prefix_needs_force_and_our_manifest(cli, mlp_out, s3, bucket):
    uri = f"s3://{bucket}/m"
    assert cli("package", mlp_out, "--for", "triton", "-o", uri).exit_code == 0
    before = {k: body(s3, bucket, k) for k in keys(s3, bucket)}
    r = cli("package", mlp_out, "--for", "triton", "-o", uri)
    assert r.exit_code == 2 and "already holds objects" in r.stderr and "--force" in r.stderr and uri in r.stderr, r
    assert {k: body(s3, bucket, k) for k in keys(s3, bucket)} == before
    r = cli("package", mlp_out, "--for", "triton", "-o", uri, "--force", "--name", "other")
    assert r.exit_code == 0, r
    stored = keys(s3, bucket)
    assert "m/other/config.pbtxt" in stored and not [k for k in stored if k.startswith("m/mlp/")]
    assert sorted(f"m/{f['path']}" for f in manifest(s3, bucket, "m")["files"]) == [k for k in stored if not k.endswith(MANIFEST)]
    # an object modelport did not write, beside a repository: --force refuses, naming it
    s3.put_object(Bucket=bucket, Key="m/notes.txt", Body=b"mine")
    r = cli("package", mlp_out, "--for", "triton", "-o", uri, "--force")
    assert r.exit_code == 2 and "m/notes.txt" in r.stderr, r
    assert body(s3, bucket, "m/notes.txt") == b"mine"
    # a prefix of foreign objects and no manifest: never replaced
    s3.put_object(Bucket=bucket, Key="foreign/data.bin", Body=b"x")
    r = cli("package", mlp_out, "--for", "triton", "-o", f"s3://{bucket}/foreign", "--force")
    assert r.exit_code == 2 and "did not write" in r.stderr, r
    assert keys(s3, bucket, "foreign/") == ["foreign/data.bin"]


# --- pull -----------------------------------------------------------------------------------------


@pytest.fixture
def uploaded(mlp_out, s3, bucket, tmp_path):
    local = tmp_path / "local"
    package(mlp_out, local, "triton")
    info = upload(local, f"s3://{bucket}/rt")
    return local, f"s3://{bucket}/rt", info


def test_pull_round_trips(uploaded, tmp_path):
    local, uri, info = uploaded
    dest = pull(uri, tmp_path / "pulled")
    assert files_of(dest) == files_of(local) and info["objects"] == len(files_of(local))


def test_pull_refuses_a_changed_object(uploaded, s3, bucket, tmp_path):
    _, uri, _ = uploaded
    key = "rt/mlp/config.pbtxt"
    original = body(s3, bucket, key)
    for changed in (original[:-1] + b"#", original + b"\n"):  # same size, other bytes; another size
        s3.put_object(Bucket=bucket, Key=key, Body=changed)
        dest = tmp_path / "pulled"
        dest.mkdir()
        with pytest.raises(BadInputError, match=key) as e:
            pull(uri, dest)
        assert e.value.exit_code == 2 and tree(dest) == []  # what was downloaded is removed
        dest.rmdir()


def test_pull_needs_a_manifest_and_keeps_inside_dest(uploaded, s3, bucket, tmp_path):
    _, uri, _ = uploaded
    m = manifest(s3, bucket, "rt")
    s3.delete_object(Bucket=bucket, Key=f"rt/{MANIFEST}")
    with pytest.raises(BadInputError, match=f"no {MANIFEST} under {uri} .not a modelport repository"):
        pull(uri, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    for bad in ("../escape.txt", "/etc/passwd", "a/../../b"):
        evil = {**m, "files": [*m["files"], {"path": bad, "size": 1, "sha256": "0" * 64}]}
        s3.put_object(Bucket=bucket, Key=f"rt/{MANIFEST}", Body=json.dumps(evil).encode())
        with pytest.raises(UnsafeInputError, match="leave the destination"):
            pull(uri, tmp_path / "b")
        assert not (tmp_path / "b").exists() and not (tmp_path / "escape.txt").exists()


# --- failures: fast, exit 2, no credentials in any output -----------------------------------------


def leaks(*texts: str) -> list[str]:
    return [c for c in CREDENTIALS if any(c in t for t in texts)]


def test_unreachable_endpoint_fails_fast(cli_proc, mlp_out, server, tmp_path, monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://USERmodelport:{SECRET}@127.0.0.1:{port}")
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    monkeypatch.chdir(tmp_path)
    t = time.monotonic()
    r = cli_proc("package", mlp_out, "--for", "triton", "-o", "s3://models/cnn", "--json", timeout=60)
    assert time.monotonic() - t < 30
    assert r.exit_code == 2, r
    assert f"cannot reach the S3 endpoint 127.0.0.1:{port}" in r.stderr
    doc = r.json()
    assert doc["status"] == "failed" and doc["exit_code"] == 2 and "cannot reach" in doc["error"]["message"]
    assert leaks(r.stdout, r.stderr) == [] and "USERmodelport" not in r.stdout + r.stderr
    assert tree(tmp_path) == []


def test_credentials_never_reach_the_output(cli, mlp_out, s3, bucket, monkeypatch, tmp_path):
    from botocore.stub import Stubber

    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    monkeypatch.chdir(tmp_path)
    outputs = []
    r = cli("package", mlp_out, "--for", "triton", "-o", f"s3://no-such-{bucket}/m", "--json")  # the real server
    assert r.exit_code == 2 and f"the bucket 'no-such-{bucket}' does not exist" in r.stderr, r
    outputs += [r.stdout, r.stderr]
    real = s3_repository.client
    for code, status, exit_code, said in (("AccessDenied", 403, 2, f"access denied for the bucket '{bucket}'"),
                                          ("SignatureDoesNotMatch", 403, 2, "access denied"),
                                          ("InvalidRequest", 400, 1, "InvalidRequest")):
        def stubbed(code=code, status=status):
            c = real()
            stub = Stubber(c)
            stub.add_client_error("list_objects_v2", service_error_code=code, http_status_code=status,
                                  service_message=f"key {ACCESS_KEY} secret {SECRET} token {TOKEN} http://u:{SECRET}@h/")
            stub.activate()
            return c

        monkeypatch.setattr(s3_repository, "client", stubbed)
        r = cli("package", mlp_out, "--for", "triton", "-o", f"s3://{bucket}/m", "--json")
        assert r.exit_code == exit_code and said in r.stderr, r
        assert json.loads(r.stdout)["error"]["message"] in r.stderr
        outputs += [r.stdout, r.stderr]
    monkeypatch.setattr(s3_repository, "client", real)
    with pytest.raises(BadInputError) as e:
        parse_uri(f"s3://{ACCESS_KEY}:{SECRET}@bucket/x")
    outputs.append(e.value.message)
    assert leaks(*outputs) == [] and tree(tmp_path) == []


# --- URIs, the client, other schemes ---------------------------------------------------------------


def test_other_schemes_are_refused(cli, mlp_out, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for out in ("gs://bucket/x", "http://host/x", "s3://Bad_Bucket/x", "s3://bucket", "s3://bucket/a/../b"):
        r = cli("package", mlp_out, "--for", "triton", "-o", out)
        assert r.exit_code == 2, (out, r)
    assert "unsupported output URI scheme 'gs://'" in cli("package", mlp_out, "--for", "triton", "-o", "gs://b/x").stderr
    assert tree(tmp_path) == []  # no folder named gs: or s3:
    with pytest.raises(BadInputError, match="URI made into a path"):
        package(mlp_out, Path("s3://bucket/x"), "triton")


@pytest.mark.parametrize("uri, parsed", [("s3://models/cnn", ("models", "cnn")), ("s3://my.bucket-1/a/b/", ("my.bucket-1", "a/b")),
                                         ("S3://models/x", ("models", "x"))])
def test_parse_uri(uri, parsed):
    assert parse_uri(uri) == parsed


@pytest.mark.parametrize("uri", ["s3://ab/x", "s3://UPPER/x", "s3://a..b/x", "s3://192.168.0.1/x", "s3://bucket/", "s3://bucket//x",
                                 "s3://bucket/a//b", "s3://bucket/./x", "s3://bucket/..", "s3://bucket/a\\b", "s3://bucket/a?b",
                                 "s3://bucket/a\nb", "s3://bucket:9000/x", "gs://bucket/x", "/local/folder"])
def test_parse_uri_refuses(uri):
    with pytest.raises(BadInputError, match="bad S3 URI") as e:
        parse_uri(uri)
    assert e.value.exit_code == 2 and "\n" not in e.value.message


def test_client_reads_the_standard_environment(server, monkeypatch):
    c = s3_repository.client()
    assert c.meta.endpoint_url == server and c.meta.region_name == "us-east-1"
    assert (c.meta.config.connect_timeout, c.meta.config.read_timeout) == (5, 60)
    assert c.meta.config.retries["total_max_attempts"] == 3  # max_attempts=2 retries after the first
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    c = s3_repository.client()
    assert c.meta.endpoint_url == "http://127.0.0.1:9" and c.meta.region_name == "eu-west-1"
    assert s3_repository.endpoint(c) == "127.0.0.1:9"


def test_missing_boto3_is_exit_5(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(MissingDependencyError, match=r'pip install "modelport\[serve\]"') as e:
        s3_repository.client()
    assert e.value.exit_code == 5


def test_boto3_is_not_imported_at_start_up():
    import subprocess
    import sys

    code = "import sys, modelport.cli, modelport.orchestration.package; print('boto3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True)
    assert out.stdout.strip() == "False"


def test_serve_pulls_a_repository_checks_it_and_answers(uploaded, s3, bucket, tmp_path):
    """`modelport serve s3://…`: the repository pulled into a temporary folder, checked against its
    manifest, its model served on KServe v2 (Triton's client answers); a changed object refuses to
    start (exit 2) naming the key, and the credentials appear nowhere."""
    import numpy as np
    import onnxruntime as ort
    import tritonclient.http as http

    from tests.serving.test_serve import Server

    local, uri, _ = uploaded
    server = Server(uri, log=tmp_path / "serve.log")
    try:
        server.wait_ready()
        client = http.InferenceServerClient(f"127.0.0.1:{server.http}")
        model = "mlp"  # the Triton repository's name for it: mlp/1/model.onnx
        assert f"as '{model}'" in server.log.read_text()
        meta = client.get_model_metadata(model)
        spec = meta["inputs"][0]
        x = np.random.default_rng(0).standard_normal([2 if d == -1 else d for d in spec["shape"]]).astype(np.float32)
        i = http.InferInput(spec["name"], list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        got = client.infer(model, [i]).as_numpy(meta["outputs"][0]["name"])
        (onnx_file,) = [p for p in local.rglob("model.onnx")]
        want = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"]).run(None, {spec["name"]: x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    finally:
        server.stop()
    text = server.log.read_text()
    assert not leaks(text), leaks(text)
    key = next(k for k in keys(s3, bucket, "rt/") if k.endswith("model.onnx"))
    s3.put_object(Bucket=bucket, Key=key, Body=b"not the model")
    bad = Server(uri, log=tmp_path / "changed.log")
    assert bad.proc.wait(120) == 2
    text = bad.log.read_text()
    assert key in text and not leaks(text), text[-2000:]
