"""A live repository on S3: a local mirror kept in step with its manifest, and edits made on S3.

`serve s3://bucket/prefix --model-control poll` serves a local folder pulled from the prefix
(`s3_repository.pull`); `Mirror.refresh` brings it up to the manifest's state at every poll, so that
the repository's own scan (`serving/v2/repository.py`) sees a version added, promoted or rolled back
on S3 as it sees one in a local folder. A refresh changes the folder in an order a scan can never
catch half-way:

1. nothing happens while the prefix has no manifest (an upload that is replacing it);
2. every new or changed object is downloaded beside the folder and checked against the manifest's
   size and sha256 first; any mismatch (an upload that began meanwhile) abandons the refresh, and
   the next poll tries again, the folder untouched;
3. a version folder that is new (`NAME/<version>/`) arrives by one rename; other files (a model's
   `config.pbtxt`, its history) are renamed over the old ones after it;
4. files the manifest no longer lists go last.

`edit(uri, change)` runs a `repo add|promote|rollback` on S3: the repository is pulled into a
temporary folder, changed there, and uploaded back with `s3_repository.upload(force=True)`, whose
manifest-last replacement a polling server reads either whole before or whole after.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from modelport.errors import BadInputError
from modelport.packaging import s3_repository as s3r
from modelport.packaging.s3_repository import local_files

log = logging.getLogger("modelport.serve")


class Mirror:
    """The local folder `dest`, pulled from `uri`; `refresh()` brings it in step (see the module docstring)."""

    def __init__(self, uri: str, dest: Path):

        self.uri, self.dest = uri, Path(dest)
        self.known = {f["path"]: f["sha256"] for f in local_files(self.dest)}

    def refresh(self) -> int:
        """Bring the folder in step with the manifest; returns how many files changed (0: none, or no manifest)."""

        bucket, prefix = s3r.parse_uri(self.uri)
        s3 = s3r.client()
        with s3r.s3_errors(s3, bucket, self.uri):
            doc = s3r.read_manifest(s3, bucket, f"{prefix}/{s3r.MANIFEST}")
            if doc is None:
                return 0
            entries = s3r.manifest_entries(doc, s3r.shown(self.uri))
            wanted = {path: digest for path, _, digest in entries}
            fresh = [(p, size, digest) for p, size, digest in entries if self.known.get(p) != digest]
            gone = [p for p in self.known if p not in wanted]
            if not fresh and not gone:
                return 0
            staging = Path(tempfile.mkdtemp(prefix=".modelport-mirror-", dir=self.dest.parent))
            try:
                for path, size, digest in fresh:
                    target = staging.joinpath(*path.split("/"))
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if s3r.download(s3, bucket, f"{prefix}/{path}", target, size) != digest:
                        raise BadInputError(f"s3://{bucket}/{prefix}/{path} does not match the sha256 its manifest lists")
                self._apply(staging, [p for p, _, _ in fresh], gone)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        self.known = wanted
        return len(fresh) + len(gone)

    def _apply(self, staging: Path, fresh: list[str], gone: list[str]) -> None:
        moved: set[str] = set()
        for path in fresh:  # new version folders first, each by one rename
            parts = path.split("/")
            if len(parts) > 2 and parts[1].isdigit():
                top = "/".join(parts[:2])
                if top not in moved and not self.dest.joinpath(*parts[:2]).exists():
                    self.dest.joinpath(parts[0]).mkdir(exist_ok=True)
                    os.replace(staging.joinpath(*parts[:2]), self.dest.joinpath(*parts[:2]))
                    moved.add(top)
        for path in fresh:  # then single files over the old ones (configs last of all)
            parts = path.split("/")
            if "/".join(parts[:2]) in moved:
                continue
            target = self.dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging.joinpath(*parts), target)
        for path in gone:
            with contextlib.suppress(FileNotFoundError):
                self.dest.joinpath(*path.split("/")).unlink()
        for d in sorted((p for p in self.dest.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()  # only empty ones go


def keep_in_step(mirror: Mirror, every_s: float) -> Callable[[], None]:
    """Refresh `mirror` every `every_s` seconds on a daemon thread; returns the function that stops it."""
    import threading

    stop = threading.Event()

    def loop():
        while not stop.wait(every_s):
            try:
                changed = mirror.refresh()
            except Exception as e:  # the folder stays as it was; the next poll tries again
                log.warning("serve: %s not refreshed: %s", mirror.uri, " ".join(str(e).split())[:300])
                continue
            if changed:
                log.info("serve: %s changed: %d files refreshed", mirror.uri, changed)

    threading.Thread(target=loop, name="modelport-s3-mirror", daemon=True).start()
    return stop.set


def edit(uri: str, change: Callable[[Path], dict], *, create: bool = False) -> dict:
    """`change(folder)` applied to the repository at `uri` (pulled, changed, uploaded back); with
    `create`, a prefix with no manifest starts empty (`repo add` of a first model)."""

    with tempfile.TemporaryDirectory(prefix="modelport-repo-") as tmp:
        local = Path(tmp) / "repository"
        try:
            s3r.pull(uri, local)
        except BadInputError as e:
            if not (create and s3r.MANIFEST in str(e)):
                raise
            local.mkdir()
        result = change(local)
        result["upload"] = s3r.upload(local, uri, force=True)
    return result


def read(uri: str, look: Callable[[Path], dict]) -> dict:
    """`look(folder)` on a pulled copy of the repository at `uri`."""

    with tempfile.TemporaryDirectory(prefix="modelport-repo-") as tmp:
        return look(s3r.pull(uri, Path(tmp) / "repository"))
