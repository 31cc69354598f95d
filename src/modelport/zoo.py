"""The model zoo: `model_zoo.yaml` entries, local builders and checksum-verified downloads.

Entries are data, loaded strictly: an unknown key, a missing builder/url, a download without a
full sha256 or with an unpinned revision is an error. Downloads stream into a temp file in the
destination folder, are hashed while they stream, and are renamed into place only when the hash
matches; a failure leaves no file and never touches an earlier good copy.
"""

from __future__ import annotations

import hashlib
import importlib
import ipaddress
import os
import re
import sys
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from modelport.deps import require
from modelport.errors import BadInputError, UnsafeInputError
from modelport.run.file_checks import sha256_of
from modelport.run.names import check_path_name, is_path_name
from modelport.run.staging import output_mode

ZOO_FILE = Path(__file__).with_name("model_zoo.yaml")
ENTRY_KEYS = {
    "description", "framework", "builder", "kwargs", "inputs", "outputs", "layout", "preprocess",
    "value_range", "sample_dims", "tolerance", "url", "sha256", "revision", "filename", "disabled",
}
UNPINNED = {"main", "master", "latest", "head", "trunk", "dev", ""}
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class ZooEntry:
    name: str
    description: str = ""
    framework: str = "pytorch"
    builder: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] | None = None
    layout: dict[str, str] = field(default_factory=dict)
    preprocess: dict[str, dict] = field(default_factory=dict)
    value_range: dict[str, list[float]] = field(default_factory=dict)
    sample_dims: dict[str, int] = field(default_factory=dict)
    tolerance: dict[str, float] = field(default_factory=dict)
    url: str | None = None
    sha256: str | None = None
    revision: str | None = None
    filename: str | None = None
    disabled: str | None = None

    def input_specs(self):
        from modelport.ir import Preprocess
        from modelport.resolve.specs import parse_input_spec

        specs = []
        for text in self.inputs:
            s = parse_input_spec(text)
            s.layout = self.layout.get(s.name, s.layout)
            if s.name in self.preprocess:
                s.preprocess = Preprocess(**self.preprocess[s.name])
            if s.name in self.value_range:
                s.value_range = list(self.value_range[s.name])
            specs.append(s)
        return specs


def parse_zoo(data: dict, source: str = "model_zoo.yaml") -> dict[str, ZooEntry]:
    if not isinstance(data, dict) or set(data) != {"models"} or not isinstance(data["models"], dict):
        raise BadInputError("a zoo file holds exactly one key, 'models', mapping names to entries", path=source)
    entries = {}
    for name, raw in data["models"].items():
        if not isinstance(raw, dict):
            raise BadInputError(f"zoo entry '{name}' is not a mapping", path=source)
        unknown = set(raw) - ENTRY_KEYS
        if unknown:
            raise BadInputError(f"zoo entry '{name}' has unknown keys {sorted(unknown)}", path=source)
        check_path_name(name, f"zoo entry name in {source}")
        entry = ZooEntry(name=name, **raw)
        if not entry.builder and not entry.url:
            raise BadInputError(f"zoo entry '{name}' needs a builder or a url", path=source)
        if entry.url:
            if not entry.sha256 or not SHA256_RE.match(entry.sha256.lower()):
                raise UnsafeInputError(f"zoo entry '{name}' has a url but no full sha256", path=source)
            if (entry.revision or "").strip().lower() in UNPINNED:
                raise UnsafeInputError(f"zoo entry '{name}' has an unpinned revision '{entry.revision or ''}'", path=source, hint="pin a tag or commit")
            check_path_name(entry.revision, f"revision of zoo entry '{name}'")
        entries[name] = entry
    return entries


@lru_cache(maxsize=4)
def load_zoo(path: str | None = None) -> dict[str, ZooEntry]:
    import yaml

    p = Path(path) if path else ZOO_FILE
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise BadInputError(f"invalid YAML: {e}", path=p) from None
    return parse_zoo(data, str(p))


def names() -> list[str]:
    return list(load_zoo())


def get(name: str) -> ZooEntry:
    check_path_name(name, "zoo name")
    zoo = load_zoo()
    if name not in zoo:
        raise BadInputError(f"unknown zoo model '{name}'; known: {', '.join(sorted(zoo))}")
    entry = zoo[name]
    if entry.disabled:
        raise BadInputError(f"zoo model '{name}' is disabled: {entry.disabled}")
    return entry


def builder(name: str):
    """The function that builds a zoo entry's model."""
    entry = get(name)
    if not entry.builder:
        raise BadInputError(f"zoo model '{name}' is download-only; use 'modelport zoo fetch {name}'")
    mod, _, fn = entry.builder.partition(":")

    require({"pytorch": "torch", "keras": "keras", "tensorflow": "tensorflow"}.get(entry.framework, "onnx"), purpose=f"zoo model '{name}'")
    return getattr(importlib.import_module(mod), fn)


def build(name: str, *, seed: int = 0, args: dict[str, Any] | None = None):
    """The model object a zoo entry builds (an nn.Module, a Keras model, ...); `args` (`--arch-args`)
    override the entry's own builder keywords, and one the builder does not take is exit 2."""
    from modelport.resolve.specs import check_arch_args

    fn = builder(name)
    check_arch_args(fn, args or {}, f"zoo:{name}", reserved=("seed",))
    return fn(seed=seed, **{**get(name).kwargs, **(args or {})})


def parameters(name: str) -> list[str]:
    """The keyword parameters a zoo entry's builder takes (`--arch-args` may set them)."""
    from modelport.resolve.specs import check_arch_args

    return check_arch_args(builder(name), {}, f"zoo:{name}", reserved=("seed",))


def source_spec(name: str):
    """The SourceSpec (inputs, sample dims, output names) for converting a zoo model."""
    from modelport.resolve.specs import SourceSpec

    entry = get(name)
    return SourceSpec(framework=entry.framework, inputs=entry.input_specs(), output_names=entry.outputs,
                      sample_dims=dict(entry.sample_dims))


# --- downloads -----------------------------------------------------------------------------------

def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return
    if parts.scheme == "http" and _is_loopback(parts.hostname):
        return  # a local mirror
    raise UnsafeInputError(f"refusing to download over '{parts.scheme}' from {parts.hostname}: {url}", hint="zoo downloads need https")


class _SafeRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        check_url(newurl)
        if urllib.parse.urlsplit(req.full_url).scheme == "https" and urllib.parse.urlsplit(newurl).scheme != "https":
            raise UnsafeInputError(f"refusing a redirect from https to {newurl}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def download(url: str, dest: Path, sha256: str, *, progress: bool = False, timeout: float = 60.0) -> Path:
    """Stream `url` into `dest`, verifying sha256; nothing is left at `dest` on failure."""

    check_url(url)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    opener = urllib.request.build_opener(_SafeRedirects())
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                resp = opener.open(url, timeout=timeout)
            except UnsafeInputError:
                raise
            except OSError as e:
                raise BadInputError(f"download failed: {e}", path=url) from None
            with resp:
                total = int(resp.headers.get("Content-Length") or 0) or None
                bar = _progress(dest.name, total) if progress else None
                received = 0
                try:
                    while True:
                        try:
                            chunk = resp.read(1 << 16)
                        except OSError as e:  # IncompleteRead and friends
                            raise BadInputError(f"download interrupted after {received} bytes: {e}", path=url) from None
                        if not chunk:
                            break
                        received += len(chunk)
                        h.update(chunk)
                        f.write(chunk)
                        if bar:
                            bar[0].update(bar[1], advance=len(chunk))
                finally:
                    if bar:
                        bar[0].stop()
                if total is not None and received != total:
                    raise BadInputError(f"truncated download: {received} of {total} bytes", path=url)
            f.flush()
            os.fchmod(f.fileno(), output_mode(tmp))  # mkstemp makes it 0600; a cache file follows the umask
            os.fsync(f.fileno())
        digest = h.hexdigest()
        if digest != sha256.lower():
            raise UnsafeInputError(f"sha256 mismatch: got {digest}, expected {sha256.lower()}", path=url)
        os.replace(tmp, dest)
        return dest
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _progress(name: str, total: int | None):
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        return None
    p = Progress("[bold]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=console, transient=True)
    task = p.add_task(name, total=total)
    p.start()
    return p, task


def fetch(name: str, cache_dir: str | Path, *, progress: bool = None) -> Path:
    """Download a zoo entry's file into cache_dir (reusing a verified copy)."""

    entry = get(name)
    if not entry.url:
        raise BadInputError(f"zoo model '{name}' has no download url; use 'modelport zoo build {name}'")
    fname = entry.filename or Path(urllib.parse.urlsplit(entry.url).path).name or name
    if not is_path_name(fname):
        raise UnsafeInputError(f"zoo entry '{name}' has an unsafe filename '{fname}'")
    dest = Path(cache_dir) / name / entry.revision / fname
    if dest.exists() and sha256_of(dest) == entry.sha256.lower():
        return dest
    return download(entry.url, dest, entry.sha256, progress=sys.stderr.isatty() if progress is None else progress)
