"""Outputs are written into a staging folder beside the destination and renamed into place.

A failed run leaves nothing half-written; an existing output is replaced only with `force`, and
only when modelport wrote it (it holds our `report.json`), never the working directory, the home
folder, a filesystem root or anything that holds them; an output never equals, contains or sits
inside an input. Outputs follow the umask like any Unix tool: folders `0777 & ~umask`, files
`0666 & ~umask` (`0777 & ~umask` for executables), whatever mode a library wrote them with.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from modelport.errors import BadInputError


def _inside(child: Path, parent: Path) -> bool:
    try:
        return os.path.commonpath([str(child), str(parent)]) == str(parent)
    except ValueError:
        return False


REPORT = "report.json"
REPORT_SCHEMA = "modelport.report/1"


def written_by_modelport(folder: Path) -> bool:
    """Whether `folder` holds a report.json (a real file) of our schema, as every command writes."""
    report = Path(folder) / REPORT
    if report.is_symlink() or not report.is_file():
        return False
    try:
        data = json.loads(report.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("schema") == REPORT_SCHEMA


def _protected(folder: Path) -> str | None:
    """Why `folder` may never be replaced (it is or holds the working directory, home or a root)."""
    if folder.parent == folder:
        return "a filesystem root"
    for what, place in (("the working directory", Path.cwd), ("the home folder", Path.home)):
        try:
            p = place().resolve()
        except (OSError, RuntimeError):
            continue
        if folder == p or _inside(p, folder):
            return what if folder == p else f"a folder that holds {what}"
    return None


def check_output(out: str | Path, inputs: Iterable[str | Path] = (), *, force: bool = False) -> Path:
    """Refuse an output that exists (without force) or that would overwrite or hold an input.

    With `force`, an existing folder is replaced only when modelport wrote it and it is not the
    working directory, the home folder, a filesystem root or a folder holding one of them.
    """
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
        why = _protected(out_r)
        if why:
            raise BadInputError(f"refusing to replace {why}", path=out, hint="choose a new output folder")
        if not written_by_modelport(out_r):
            raise BadInputError(f"refusing to replace a folder modelport did not write (no modelport {REPORT} in it)",
                                path=out, hint="choose a new output folder, or remove this one yourself")
    return out_r


FAILED_MARK = "FAILED.json"  # in OUT.failed/: what failed; such a folder is never a valid output


def failed_dir(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".failed")


def _keep_failed(stage: Path, out: Path, exc: BaseException) -> Path | None:
    """Move a failed run's staging folder to OUT.failed/ (replacing only an earlier one of ours)."""
    kept = failed_dir(out)
    if kept.exists() and not (kept.is_dir() and not kept.is_symlink() and (kept / FAILED_MARK).is_file()):
        return None  # not ours: never replaced
    mark = {"status": "failed", "error": type(exc).__name__, "message": getattr(exc, "message", str(exc)),
            "exit_code": getattr(exc, "exit_code", 1),
            "note": "kept for debugging by --keep-failed: these files did not pass validation"}
    (stage / FAILED_MARK).write_text(json.dumps(mark, indent=2) + "\n")
    apply_umask(stage)
    if kept.exists():
        shutil.rmtree(kept)
    os.replace(stage, kept)
    return kept


OPEN_STAGES: set[Path] = set()  # the staging folders of runs under way (a stage stopped hard removes them)


@contextlib.contextmanager
def staged_dir(out: str | Path, inputs: Iterable[str | Path] = (), *, force: bool = False,
               keep_failed: bool = False) -> Iterator[Path]:
    """Yield a fresh staging folder; on success it replaces `out`, on any error it is removed
    (or, with `keep_failed`, moved to OUT.failed/ with a FAILED.json saying why)."""
    out_r = check_output(out, inputs, force=force)
    out_r.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_r.name}.staging-", dir=out_r.parent))
    OPEN_STAGES.add(stage)
    try:
        yield stage
        apply_umask(stage)
    except BaseException as e:
        if not (keep_failed and isinstance(e, Exception) and _keep_failed(stage, out_r, e)):
            shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        OPEN_STAGES.discard(stage)
    _fsync_tree(stage)
    if out_r.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_r.name}.old-", dir=out_r.parent))
        os.replace(out_r, old / "x")
        os.replace(stage, out_r)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(stage, out_r)


def current_umask() -> int:
    """The process umask (read from /proc where it can be, which leaves it untouched)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def output_mode(path: str | Path, umask: int | None = None) -> int:
    """The mode a Unix tool gives `path`: 0777 & ~umask for folders and executables, else 0666 & ~umask."""
    umask = current_umask() if umask is None else umask
    st = os.lstat(path)
    executable = stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR
    return (0o777 if executable else 0o666) & ~umask


def apply_umask(root: str | Path) -> None:
    """Give `root` and everything under it the umask's modes.

    Staging folders come from mkdtemp (0700) and libraries write files through mkstemp (0600,
    safetensors for one); a server running as another user could not read such a bundle.
    Symbolic links are left alone.
    """
    umask = current_umask()
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, output_mode(p, umask))
    os.chmod(root, output_mode(root, umask))


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


def describe_files(path: str | Path, files: Iterable[str | Path], root: str | Path | None = None) -> dict:
    """`{path, files, size}` of an output, paths relative to `root` (the output folder) when inside it."""

    def rel(p) -> str:
        try:
            return str(Path(p).relative_to(root)) if root else str(p)
        except ValueError:
            return str(p)

    files = [Path(f) for f in files]
    return {"path": rel(path), "files": [rel(f) for f in files], "size": sum(f.stat().st_size for f in files if f.is_file())}
