"""Model repositories on S3-compatible storage (AWS S3, MinIO, …): an atomic upload and a checked pull.

`upload(folder, "s3://bucket/prefix")` puts every file under a temporary prefix
(`<prefix>/.modelport-upload-<random>/`), copies each one server-side to `<prefix>/<relpath>` once
all are there, and writes `<prefix>/modelport-manifest.json` (schema `modelport.repository/1`: every
file's path, size and sha256) last. A repository is complete exactly when its manifest is there:
a run that fails removes its temporary prefix and whatever it copied, so no object of a failed run
stays beside a manifest. An existing prefix is replaced only with `force`, and only when it holds
our manifest and nothing the manifest does not list (objects modelport did not write are never
deleted or overwritten). `pull(uri, dest)` reads the manifest, downloads what it lists, and checks
every size and sha256.

Credentials come from the standard AWS environment only (boto3 reads AWS_ENDPOINT_URL[_S3],
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, AWS_PROFILE and
the shared config files itself; AWS_REGION, which botocore ignores, is read when
AWS_DEFAULT_REGION is unset). No message this module raises quotes a key, a
secret, a token, or an endpoint URL's user information. boto3 is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from modelport.errors import BadInputError, MissingDependencyError, ModelportError, UnsafeInputError, one_line

MANIFEST = "modelport-manifest.json"
SCHEMA = "modelport.repository/1"
TEMP_MARK = ".modelport-upload-"  # <prefix>/.modelport-upload-<random>/: a run's objects before they are copied into place
INSTALL_HINT = 'pip install "modelport[serve]"'
CLIENT_CONFIG = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 2}}
_CHUNK = 1 << 20
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
           "TokenRefreshRequired", "AllAccessDisabled", "InvalidClientTokenId", "UnrecognizedClientException", "403"}
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SHA256 = re.compile(r"[0-9a-f]{64}")


# --- URIs ---------------------------------------------------------------------------------------


def is_s3(text) -> bool:
    """Whether `text` is an s3:// URI (well-formed or not: `parse_uri` says what is wrong with it)."""
    return isinstance(text, str) and text[:5].lower() == "s3://"


def uri_scheme(text) -> str | None:
    """The scheme of a `scheme://…` URI (`s3`, `gs`, `http`), or None for a local path."""
    m = _SCHEME.match(text) if isinstance(text, str) else None
    return m.group(1).lower() if m else None


def shown(text: str) -> str:
    """`text` as messages may quote it: user information (`user:secret@`) masked, control characters replaced."""
    text = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@", r"\1***@", str(text))
    return "".join("?" if ord(c) < 32 or ord(c) == 127 else c for c in text)


def parse_uri(text: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix` (a trailing "/" is dropped); BadInputError naming the URI otherwise.

    The bucket follows S3's naming rules; the prefix is a relative folder path: no empty, "." or
    ".." component, no backslash, query, fragment or control character.
    """
    def bad(reason: str) -> BadInputError:
        return BadInputError(f"bad S3 URI '{shown(text)}': {reason}", hint="expected s3://bucket/folder")

    if not is_s3(text):
        raise bad("not an s3:// URI")
    bucket, _, prefix = text[5:].partition("/")
    if "@" in bucket or ":" in bucket:
        raise bad("credentials or a port do not belong in the URI (the AWS environment holds them)")
    if not _BUCKET.fullmatch(bucket) or any(s in bucket for s in ("..", ".-", "-.")) \
            or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", bucket) or bucket.startswith(("xn--", "sthree-")) \
            or bucket.endswith(("-s3alias", "--ol-s3")):
        raise bad(f"'{shown(bucket)}' is not a bucket name (3-63 lowercase letters, digits, '-' and '.')")
    prefix = prefix[:-1] if prefix.endswith("/") else prefix
    if not prefix:
        raise bad("no folder inside the bucket")
    if any(ord(c) < 32 or ord(c) == 127 for c in prefix) or any(c in prefix for c in "\\?#"):
        raise bad("the folder holds a backslash, '?', '#' or a control character")
    if any(part in ("", ".", "..") for part in prefix.split("/")):
        raise bad("the folder has an empty, '.' or '..' component")
    if len(prefix.encode()) > 512:
        raise bad("the folder is longer than 512 bytes")
    return bucket, prefix


# --- the client and its errors ------------------------------------------------------------------


def client():
    """A boto3 S3 client configured from the standard AWS environment, failing fast on an unreachable endpoint."""
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError
    except ImportError:
        raise MissingDependencyError("'boto3' is not installed: S3 model repositories need it", hint=INSTALL_HINT) from None
    # botocore reads AWS_DEFAULT_REGION but not AWS_REGION (the other SDKs' name): that one is the fallback
    region = None if os.environ.get("AWS_DEFAULT_REGION") else os.environ.get("AWS_REGION") or None
    try:
        return boto3.session.Session(region_name=region).client("s3", config=Config(**CLIENT_CONFIG))
    except BotoCoreError as e:  # a named AWS_PROFILE that does not exist, a malformed config file
        raise BadInputError(f"cannot set up the S3 client: {_scrub(one_line(str(e)))}") from None


def endpoint(s3) -> str:
    """host:port of the client's endpoint (never its user information)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(s3.meta.endpoint_url)
        host = parts.hostname or "?"
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except (AttributeError, ValueError):
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _secrets() -> list[str]:
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
    return sorted({v for v in (os.environ.get(n, "") for n in names) if len(v) >= 4}, key=len, reverse=True)


def _scrub(text: str) -> str:
    """A library's message without the credentials in the environment or a URL's user information."""
    text = re.sub(r"(://)[^/\s\"'@]*@", r"\1***@", text)
    for value in _secrets():
        text = text.replace(value, "***")
    return text


def _cause(exc: BaseException):
    """The botocore error behind `exc` (boto3's transfer manager wraps them in S3UploadFailedError)."""
    from botocore.exceptions import BotoCoreError, ClientError

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (BotoCoreError, ClientError)):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def translate(exc: BaseException, s3, bucket: str, uri: str) -> ModelportError | None:
    """The one-line error for a botocore failure (None when `exc` is not one)."""
    from botocore.exceptions import ClientError, HTTPClientError, NoCredentialsError, PartialCredentialsError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    err = _cause(exc)
    if err is None:
        return None
    where = shown(uri)
    if isinstance(err, (BotoConnectionError, HTTPClientError)):
        why = "connection timed out" if "timeout" in type(err).__name__.lower() else "connection failed"
        return BadInputError(f"cannot reach the S3 endpoint {endpoint(s3)} for {where} ({why})",
                             hint="check AWS_ENDPOINT_URL and that the server is up")
    if isinstance(err, (NoCredentialsError, PartialCredentialsError)):
        return BadInputError(f"no usable AWS credentials for {where}",
                             hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")
    if isinstance(err, ClientError):
        code = str(err.response.get("Error", {}).get("Code", ""))
        if code == "NoSuchBucket":
            return BadInputError(f"the bucket '{bucket}' does not exist at the S3 endpoint {endpoint(s3)} ({where})")
        if code in _DENIED:
            return BadInputError(f"access denied for the bucket '{bucket}' ({where}): {code}",
                                 hint="check the AWS credentials in the environment and the bucket's policy")
        return ModelportError(f"S3 request for {where} failed: {_scrub(one_line(str(err)))}")
    return BadInputError(f"S3 request for {where} failed: {_scrub(one_line(str(err)))}")


@contextlib.contextmanager
def s3_errors(s3, bucket: str, uri: str) -> Iterator[None]:
    try:
        yield
    except ModelportError:
        raise
    except Exception as e:
        mapped = translate(e, s3, bucket, uri)
        if mapped is None:
            raise
        raise mapped from None  # the library's error quotes the endpoint URL as configured


def _keys(s3, bucket: str, prefix: str) -> list[str]:
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(o["Key"] for o in page.get("Contents", []))
    return out


def _delete(s3, bucket: str, keys) -> None:
    keys = sorted(set(keys))
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})


def _quietly(fn, *args) -> None:
    """Best-effort cleanup: its failure never hides the error being raised."""
    with contextlib.suppress(Exception):
        fn(*args)


# --- upload -------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def local_files(folder: Path) -> list[dict]:
    """{path, size, sha256} of every file under `folder`, paths relative and "/"-separated, sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BadInputError("not a folder", path=folder)
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_symlink():
            raise BadInputError(f"'{rel}' is a symbolic link: an S3 repository holds plain files only", path=folder)
        if p.is_file():
            if rel == MANIFEST or rel.startswith(TEMP_MARK) or "\\" in rel:
                raise BadInputError(f"'{rel}' cannot be uploaded (a name modelport keeps for itself, or a backslash)", path=folder)
            try:
                out.append({"path": rel, "size": p.stat().st_size, "sha256": _sha256(p)})
            except OSError as e:
                raise BadInputError(f"cannot read '{rel}': {e.strerror or e}", path=folder) from None
    return out


def _put(s3, path: Path, bucket: str, key: str) -> None:
    s3.upload_file(str(path), bucket, key)


def _copy(s3, bucket: str, src: str, dst: str) -> None:
    s3.copy({"Bucket": bucket, "Key": src}, bucket, dst)


def read_manifest(s3, bucket: str, key: str) -> dict | None:
    """The manifest at `key` (None when absent); a manifest that is not ours is an error."""
    from botocore.exceptions import ClientError

    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read(64 << 20)
    except ClientError as e:
        if str(e.response.get("Error", {}).get("Code")) in ("NoSuchKey", "404"):
            return None
        raise
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("files"), list):
        raise BadInputError(f"s3://{bucket}/{key} is not a {SCHEMA} manifest")
    return doc


def _replaceable(s3, bucket: str, prefix: str, uri: str, force: bool) -> list[str]:
    """The keys of the repository `force` replaces at `prefix` ([] when the prefix is empty);
    refuses an existing prefix without `force`, and one holding anything but our repository with it.
    Leftovers of other runs' temporary prefixes are neither counted nor touched."""
    existing = [k for k in _keys(s3, bucket, prefix + "/") if not k[len(prefix) + 1:].startswith(TEMP_MARK)]
    if not existing:
        return []
    where = shown(uri)
    if not force:
        raise BadInputError(f"{where} already holds objects", hint="pass --force to replace a repository modelport uploaded there")
    manifest = read_manifest(s3, bucket, f"{prefix}/{MANIFEST}")
    if manifest is None:
        raise BadInputError(f"refusing to replace {where}: it holds objects modelport did not write (no {MANIFEST})",
                            hint="choose another prefix, or remove those objects yourself")
    ours = {f"{prefix}/{MANIFEST}"} | {f"{prefix}/{f.get('path')}" for f in manifest["files"] if isinstance(f, dict)}
    foreign = sorted(set(existing) - ours)
    if foreign:
        raise BadInputError(f"refusing to replace {where}: '{foreign[0]}' is not listed in its {MANIFEST}"
                            f"{f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''}",
                            hint="modelport replaces only what it uploaded; remove the other objects yourself")
    return existing


def upload(folder: Path, uri: str, *, force: bool = False) -> dict:
    """Upload the bundle `folder` to `uri` atomically (see the module docstring); returns
    {uri, objects, bytes, manifest, manifest_sha256} for the report."""
    bucket, prefix = parse_uri(uri)
    files = local_files(folder)
    s3 = client()
    temp = f"{prefix}/{TEMP_MARK}{secrets.token_hex(8)}"
    copied: list[str] = []
    old: list[str] = []
    replacing = putting = False
    with s3_errors(s3, bucket, uri):
        try:
            old = _replaceable(s3, bucket, prefix, uri, force)
            putting = True
            for f in files:
                _put(s3, Path(folder) / f["path"], bucket, f"{temp}/{f['path']}")
            replacing = True
            if old:  # from here on the old repository is incomplete, so it has no manifest
                s3.delete_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST}")
            for f in files:
                dst = f"{prefix}/{f['path']}"
                copied.append(dst)
                _copy(s3, bucket, f"{temp}/{f['path']}", dst)
            stale = set(old) - set(copied) - {f"{prefix}/{MANIFEST}"}
            if stale:
                _delete(s3, bucket, stale)
            doc = {"schema": SCHEMA, "objects": len(files), "bytes": sum(f["size"] for f in files), "files": files}
            body = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
            s3.put_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST}", Body=body, ContentType="application/json")
        except BaseException:
            if replacing:  # what this run copied, and the replaced repository's objects (ours, now without a manifest)
                _quietly(_delete, s3, bucket, [*copied, *old])
            raise
        finally:
            if putting:
                _quietly(lambda: _delete(s3, bucket, _keys(s3, bucket, temp + "/")))
    return {"uri": f"s3://{bucket}/{prefix}", "objects": len(files), "bytes": doc["bytes"],
            "manifest": f"{prefix}/{MANIFEST}", "manifest_sha256": hashlib.sha256(body).hexdigest()}


# --- pull ---------------------------------------------------------------------------------------


def manifest_entries(doc: dict, where: str) -> list[tuple[str, int, str]]:
    """(path, size, sha256) of each file a manifest lists; a path that would leave the folder is refused."""
    out, seen = [], set()
    for f in doc["files"]:
        path, size, digest = (f.get("path"), f.get("size"), f.get("sha256")) if isinstance(f, dict) else (None, None, None)
        if not isinstance(path, str) or not isinstance(size, int) or size < 0 or not isinstance(digest, str) \
                or not _SHA256.fullmatch(digest):
            raise BadInputError(f"the manifest of {where} has a malformed entry: {shown(one_line(json.dumps(f)))}")
        parts = path.split("/")
        if PurePosixPath(path).is_absolute() or "\\" in path or any(p in ("", ".", "..") for p in parts) \
                or any(ord(c) < 32 for c in path) or path in seen:
            raise UnsafeInputError(f"the manifest of {where} lists '{shown(path)}', which would leave the destination folder"
                                   " (or is listed twice)")
        seen.add(path)
        out.append((path, size, digest))
    return out


def download(s3, bucket: str, key: str, target: Path, size: int) -> str:
    """Stream `key` into `target` (at most `size` + 1 bytes); returns the sha256 of what was written."""
    h = hashlib.sha256()
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    written = 0
    with open(target, "xb") as out:
        for chunk in iter(lambda: body.read(_CHUNK), b""):
            written += len(chunk)
            if written > size:
                break
            h.update(chunk)
            out.write(chunk)
    body.close()
    if written != size:
        raise BadInputError(f"s3://{bucket}/{key} is not the size the manifest lists ({size} bytes)",
                            hint="the repository changed after its upload; upload it again")
    return h.hexdigest()


def pull(uri: str, dest: Path) -> Path:
    """Download the repository at `uri` into the folder `dest` (created when absent) and check it
    against its manifest; on any failure what this call wrote is removed. Returns `dest`."""
    bucket, prefix = parse_uri(uri)
    where = shown(uri)
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise BadInputError("the destination exists and is not a folder", path=dest)
    s3 = client()
    written: list[Path] = []
    with s3_errors(s3, bucket, uri):
        doc = read_manifest(s3, bucket, f"{prefix}/{MANIFEST}")
        if doc is None:
            raise BadInputError(f"no {MANIFEST} under {where} (not a modelport repository, or an upload that did not finish)")
        entries = manifest_entries(doc, where)
        try:
            if not dest.exists():
                dest.mkdir(parents=True)
                written.append(dest)
            root = dest.resolve()
            for path, size, digest in entries:
                target = dest.joinpath(*path.split("/"))
                if not target.resolve().is_relative_to(root):
                    raise UnsafeInputError(f"the manifest of {where} lists '{shown(path)}', which would leave the destination folder")
                for d in reversed([*target.relative_to(dest).parents][:-1]):
                    if not (dest / d).exists():
                        (dest / d).mkdir(parents=True)
                        written.append(dest / d)
                if target.exists():
                    raise BadInputError(f"'{path}' already exists in the destination folder", path=dest)
                written.append(target)
                key = f"{prefix}/{path}"
                if download(s3, bucket, key, target, size) != digest:
                    raise BadInputError(f"s3://{bucket}/{key} does not match the sha256 its manifest lists",
                                        hint="the repository changed after its upload; upload it again")
        except BaseException:
            for p in reversed(written):
                with contextlib.suppress(OSError):
                    p.rmdir() if p.is_dir() else p.unlink()
            raise
    return dest
