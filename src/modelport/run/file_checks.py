"""Cheap checks on input files before any framework parses them: existence, emptiness, LFS pointers."""

from __future__ import annotations

import hashlib
from pathlib import Path

from modelport.errors import BadInputError

LFS_MAGIC = b"version https://git-lfs"


def check_model_file(path: str | Path, *, kind: str = "model") -> Path:
    """Return the path if it names a non-empty regular file that is not a git-LFS pointer."""
    p = Path(path)
    if not p.exists():
        raise BadInputError("no such file or folder", path=p)
    if p.is_dir():
        return p
    size = p.stat().st_size
    if size == 0:
        raise BadInputError(f"empty file, not a {kind}", path=p)
    with open(p, "rb") as f:
        head = f.read(64)
    if head.startswith(LFS_MAGIC):
        raise BadInputError(
            f"a git-LFS pointer, not a {kind}", path=p, hint="run 'git lfs pull' to fetch the real file"
        )
    return p


def sha256_of(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def companion_file(path: Path, suffix: str, *, what: str, hint: str | None = None, given: str | Path | None = None) -> Path:
    """The second file of a model stored as two (a network and its weights: Caffe, Darknet, Paddle):
    `given` when the user named it (MMdnn's -iw; checked like a model file), else the file beside
    `path` with its stem and `suffix`, else the one file of that suffix in its folder; exit 2
    naming what was looked for when there is neither, or several."""
    if given:
        return check_model_file(given, kind=what)
    path = Path(path)
    same = path.with_suffix(suffix)
    if same.is_file():
        return same
    found = sorted(p for p in path.parent.glob(f"*{suffix}") if p.is_file())
    if len(found) == 1:
        return found[0]
    also = f" ({len(found)} {suffix} files there, none named so)" if found else ""
    raise BadInputError(f"no {what} found: looked for {same.name} or the one {suffix} file in its folder{also}",
                        path=path, hint=hint)
