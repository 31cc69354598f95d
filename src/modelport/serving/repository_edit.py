"""`modelport repo add|promote|rollback|list`: a served repository (Triton's layout) edited so that
a running `serve REPO` never sees half a change.

- `add` copies a version in beside the others (into a hidden folder, then one rename into
  `NAME/<version>/`) and pins the config's `version_policy` to the versions that serve now: a new
  version is registered, not served (TorchServe #43 is the bug this avoids).
- `promote` makes a version the one that serves (`specific { versions: [V] }`), keeping the
  previous choice in `NAME/.modelport-history`; `rollback` returns to it.

The config is written to a temporary file and renamed over `config.pbtxt` (atomic on one
filesystem); everything else it held (inputs, outputs, batching) is kept. A server with
`--model-control poll` picks the change up at its next scan; with `explicit`, call its load route.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from modelport.errors import BadInputError
from modelport.packaging.bundle import versions
from modelport.packaging.s3_repository import is_s3, shown, uri_scheme
from modelport.run.names import check_path_name
from modelport.serving import s3_mirror

HISTORY = ".modelport-history"



def _config(model_dir: Path, name: str):
    from modelport.packaging.triton import _pb, parse_config

    path = model_dir / "config.pbtxt"
    return parse_config(path.read_text()) if path.is_file() else _pb().ModelConfig(name=name)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _pin(model_dir: Path, name: str, versions: list[int]) -> None:
    from modelport.packaging.triton import config_text

    config = _config(model_dir, name)
    config.version_policy.Clear()
    config.version_policy.specific.versions.extend(versions)
    _write_atomic(model_dir / "config.pbtxt", config_text(config))


def serving(model_dir: Path) -> list[int]:
    """The versions the model's policy serves now."""
    from modelport.serving.v2.repository import wanted_versions

    return [int(v) for v, _ in wanted_versions(model_dir)] if model_dir.is_dir() else []


def _history(model_dir: Path) -> list[list[int]]:
    path = model_dir / HISTORY
    return json.loads(path.read_text()) if path.is_file() else []


def _model_dir(repo: Path, name: str, *, exists: bool = True) -> Path:
    check_path_name(name, "model name")
    if not repo.is_dir():
        raise BadInputError("not a repository folder", path=repo)
    model_dir = repo / name
    if exists and not model_dir.is_dir():
        raise BadInputError(f"no model '{name}' in the repository", path=repo)
    return model_dir


def add(repo: Path, name: str, source: Path, version: int | None = None) -> dict:
    model_dir = _model_dir(repo, name, exists=False)
    if not source.exists():
        raise BadInputError("no such file or folder", path=source)
    have = versions(model_dir)
    number = version if version is not None else (have[-1] + 1 if have else 1)
    if number < 1:
        raise BadInputError(f"bad --version {number}: versions start at 1")
    if number in have:
        raise BadInputError(f"version {number} of '{name}' exists; versions are never replaced (add another)", path=model_dir / str(number))
    served_before = serving(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = model_dir / f".incoming-{number}-{uuid.uuid4().hex[:8]}"
    try:
        if source.is_dir():
            shutil.copytree(source, staging, symlinks=True)  # links stay links: nothing outside SOURCE is copied in
        else:
            staging.mkdir()
            shutil.copy2(source, staging / source.name)
        os.rename(staging, model_dir / str(number))  # the version appears whole or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    served = served_before or [number]  # the first version serves; a later one waits for promote
    _pin(model_dir, name, served)
    return {"model": name, "version": number, "serving": served, "versions": versions(model_dir)}


def promote(repo: Path, name: str, version: int) -> dict:
    model_dir = _model_dir(repo, name)
    if version not in versions(model_dir):
        raise BadInputError(f"'{name}' has no version {version}; it has {versions(model_dir)}", path=model_dir)
    before = serving(model_dir)
    _pin(model_dir, name, [version])
    if before and before != [version]:
        _write_atomic(model_dir / HISTORY, json.dumps([*_history(model_dir), before]))
    return {"model": name, "serving": [version], "previous": before}


def rollback(repo: Path, name: str) -> dict:
    model_dir = _model_dir(repo, name)
    history = _history(model_dir)
    while history and not set(history[-1]) <= set(versions(model_dir)):
        history.pop()  # a version deleted since: not one to go back to
    if not history:
        raise BadInputError(f"'{name}' has no earlier version to roll back to (promote has not moved it)", path=model_dir)
    before, target = serving(model_dir), history.pop()
    _pin(model_dir, name, target)
    _write_atomic(model_dir / HISTORY, json.dumps(history))
    return {"model": name, "serving": target, "previous": before}


def listing(repo: Path) -> dict:
    if not repo.is_dir():
        raise BadInputError("not a repository folder", path=repo)
    return {"models": [{"name": d.name, "versions": versions(d), "serving": serving(d)}
                       for d in sorted(repo.iterdir()) if d.is_dir() and not d.name.startswith(".")]}


def on_repository(repo: str, change, *, edits: bool = True, create: bool = False) -> dict:
    """`change(folder)` on the repository REPO: a local folder, or an `s3://bucket/prefix` pulled,
    changed and uploaded back (`serving/s3_mirror.edit`); `create`: made when absent."""

    if uri_scheme(repo) not in (None, "s3"):
        raise BadInputError(f"{shown(repo)}: a repository is a local folder or s3://bucket/prefix")
    if is_s3(repo):
        return s3_mirror.edit(repo, change, create=create) if edits else s3_mirror.read(repo, change)
    if create:
        Path(repo).mkdir(parents=True, exist_ok=True)
    return change(Path(repo))
