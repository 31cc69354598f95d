"""Outputs are written into a staging folder beside the destination and renamed into place.

A failed run leaves nothing half-written; an existing output is replaced only with `force`; an
output never equals, contains or sits inside an input.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from modelport.errors import BadInputError


def _inside(child: Path, parent: Path) -> bool:
    try:
        return os.path.commonpath([str(child), str(parent)]) == str(parent)
    except ValueError:
        return False


def check_output(out: str | Path, inputs: Iterable[str | Path] = (), *, force: bool = False) -> Path:
    """Refuse an output that exists (without force) or that would overwrite or hold an input."""
    out_r = Path(out).resolve()
    for inp in inputs:
        inp_r = Path(inp).resolve()
        if out_r == inp_r or _inside(inp_r, out_r) or (inp_r.is_dir() and _inside(out_r, inp_r)):
            raise BadInputError(
                f"output '{out}' would overwrite or contain the input '{inp}'", path=out,
                hint="choose an output folder outside the input",
            )
    if out_r.exists():
        if not force:
            raise BadInputError("output already exists", path=out, hint="pass --force to replace it")
        if not out_r.is_dir():
            raise BadInputError("output exists and is not a folder", path=out)
    return out_r


@contextlib.contextmanager
def staged_dir(out: str | Path, inputs: Iterable[str | Path] = (), *, force: bool = False) -> Iterator[Path]:
    """Yield a fresh staging folder; on success it replaces `out`, on any error it is removed."""
    out_r = check_output(out, inputs, force=force)
    out_r.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_r.name}.staging-", dir=out_r.parent))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    _fsync_tree(stage)
    if out_r.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_r.name}.old-", dir=out_r.parent))
        os.replace(out_r, old / "x")
        os.replace(stage, out_r)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(stage, out_r)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def describe_files(path: str | Path, files: Iterable[str | Path], root: str | Path | None = None) -> dict:
    """`{path, files, size}` of an output, paths relative to `root` (the output folder) when inside it."""

    def rel(p) -> str:
        try:
            return str(Path(p).relative_to(root)) if root else str(p)
        except ValueError:
            return str(p)

    files = [Path(f) for f in files]
    return {"path": rel(path), "files": [rel(f) for f in files], "size": sum(f.stat().st_size for f in files if f.is_file())}
