"""The run report: one JSON document per run, the same data the terminal shows as tables.

Schema `modelport.report/1` (documented in docs/reports.md):
  schema, command, status ("ok" | "failed"), exit_code, error, started, seconds,
  tool (versions), source {path, framework, format, sha256, size},
  contract {inputs, outputs, sample_dims}, stages [{name, seconds, peak_rss, ...}], peak_rss,
  artifacts [{target, runtime, precision, requested_precision, files, size, nodes}],
  parity [{hop, ok, tolerance, outputs}], warnings [str].
Later stages add their own keys to stages/artifacts entries; existing keys keep their meaning.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from modelport.deps import missing_dependency
from modelport.errors import EXIT_UNEXPECTED, ModelportError, StageError
from modelport.run import memory
from modelport.run.quiet_call import MAX_LOG_LINES, collecting_logs
from modelport.version import __version__

SCHEMA = "modelport.report/1"
SCHEMA_FILE = Path(__file__).with_name("report.schema.json")  # the published JSON Schema of SCHEMA
# modules whose versions a report records when the run imported them; every target's runtime and needs besides
VERSIONED = ("onnx", "onnxruntime", "torch", "tensorflow", "keras", "tf2onnx", "onnxsim", "onnxscript", "onnx2tf")


def tool_versions() -> dict[str, str]:
    import sys

    from modelport.deps import target_modules, version_of

    out = {"modelport": __version__, "python": platform.python_version()}
    for mod in dict.fromkeys((*VERSIONED, *target_modules())):
        if mod in sys.modules or mod in ("onnx", "onnxruntime"):
            v = version_of(mod)
            if v:
                out[mod] = v
    return out


@dataclass(frozen=True)
class ContractEntry:
    """The I/O contract of the model (`part` "") or of one part of a source converted into several
    (`OUT/<part>/`, under `parts`); `reference_varies` marks each named output whose source reference
    changed (or not) between two sample sets, `given` names the inputs whose samples the user chose."""

    contract: dict
    reference_varies: dict[str, bool] | None = None
    given: tuple[str, ...] = ()
    part: str = ""


@dataclass(frozen=True)
class Sides:
    """`validate`'s two models (`a`, `b`) and the input shapes both ran on."""

    a: dict
    b: dict
    inputs: dict[str, list[int]]


@dataclass
class Findings:
    """What a stage of a run found for its report, returned by the stage (in its typed result) and
    written by `Report.record`: each field is one section of the document (docs/reports.md)."""

    source: dict | None = None  # the source file: path, framework, format, size, sha256, how it was read
    contracts: list[ContractEntry] = field(default_factory=list)
    optimize: dict | None = None  # the table --optimize auto chose from, or a selection's budget
    parity: list[dict] = field(default_factory=list)  # each hop's comparison (ParityResult.to_dict())
    artifacts: list[dict] = field(default_factory=list)  # each artifact's entry
    generation: list[dict] = field(default_factory=list)  # artifacts judged by generation (GenerationResult.to_dict())
    target_failures: list[dict] = field(default_factory=list)  # targets that failed while the others went on
    warnings: list[str] = field(default_factory=list)  # what the user must see although the run succeeds
    files: list[str] | None = None  # files written beside the artifacts (a zoo build's, the source's tokenizer)
    reference: dict | None = None  # the reference sample written beside the artifacts
    bundles: list[dict] | None = None  # the serving bundles written
    sides: Sides | None = None
    localize: dict | None = None  # where `validate --localize` found the outputs part

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def add(self, other: Findings) -> Findings:
        """`other`'s findings after these (its sections win where both have one); returns self."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                mine.extend(theirs)
            elif theirs is not None:
                setattr(self, f.name, theirs)
        return self


def entry_of(result) -> dict:
    """A comparison's or a generation's report entry (a ParityResult, a GenerationResult; a dict as it is)."""
    return result if isinstance(result, dict) else result.to_dict()


class Report:
    """The run record of one command, written by `record` from what the stages return; `data` is a read-only view.

    Code outside this module never writes into the document: the stages return what they found
    (`Findings`, in their typed results) and the command records it (`record`), so the schema lives
    in one place; `stage()` times the stage rows as they run. `to_dict()` is a copy for callers to keep.
    """

    def __init__(self, command: str):
        self.command = command
        self._t0 = time.perf_counter()
        self._data: dict[str, Any] = {
            "schema": SCHEMA, "command": command, "status": "running", "exit_code": None,
            "error": None, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": None,
            "tool": {}, "source": None, "contract": None, "stages": [], "artifacts": [], "parity": [], "warnings": [],
        }

    @property
    def data(self) -> Mapping[str, Any]:
        return MappingProxyType(self._data)

    @property
    def finished(self) -> bool:
        return self._data["exit_code"] is not None

    # --- stages ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def stage(self, name: str, **details):
        """A timed stage row; the yielded `StageRow` adds details to it (`row.note(nodes=12)`). When
        the stage fails, what the libraries it called printed (captured by `quiet_call`, kept off
        the terminal) is its `log`."""

        entry = {"name": name, **details}
        t = time.perf_counter()
        self._data["stages"].append(entry)
        measured = memory.window()
        with collecting_logs() as lines:
            try:
                yield StageRow(entry)
            except BaseException:
                if lines:
                    entry["log"] = lines[-MAX_LOG_LINES:]
                raise
            finally:
                entry["seconds"] = round(time.perf_counter() - t, 4)
                peak = measured.close()
                if peak:
                    entry["peak_rss"] = peak

    @property
    def stage_names(self) -> list[str]:
        return [s["name"] for s in self._data["stages"]]

    def add_stage_rows(self, rows) -> None:
        """Rows a stage produced itself (the optimisation passes): dicts or objects with `to_dict()`."""
        self._data["stages"].extend(r if isinstance(r, dict) else r.to_dict() for r in rows)

    # --- what the stages found ---------------------------------------------------------------

    def record(self, found: Findings) -> None:
        """Write what a stage found into the document: the one place its sections are written
        (stage rows aside, which `stage()` times as they run)."""
        d = self._data
        if found.source is not None:
            d["source"] = dict(found.source)
        for c in found.contracts:
            if c.part:
                names = {i["name"] for i in c.contract.get("inputs") or []}
                d.setdefault("parts", []).append({"name": c.part, "path": c.part, "contract": _contract(
                    c.contract, c.reference_varies, [g for g in c.given if g in names])})
            else:
                d["contract"] = _contract(c.contract, c.reference_varies, list(c.given))
        if found.optimize is not None:
            d["optimize"] = found.optimize
        d["parity"].extend(found.parity)
        d["artifacts"].extend(found.artifacts)
        for key in ("generation", "target_failures"):
            if getattr(found, key):
                d.setdefault(key, []).extend(getattr(found, key))
        d["warnings"].extend(found.warnings)
        for key in ("files", "reference", "bundles", "localize"):
            if getattr(found, key) is not None:
                d[key] = copy.copy(getattr(found, key))
        if found.sides is not None:
            d.update(a=found.sides.a, b=found.sides.b, inputs=found.sides.inputs)

    # --- the end of the run ---------------------------------------------------------------------

    def finish(self, *, exit_code: int = 0, error: dict | None = None) -> dict:
        self._data["status"] = "ok" if exit_code == 0 else "failed"
        self._data["exit_code"] = exit_code
        self._data["error"] = error
        self._data["seconds"] = round(time.perf_counter() - self._t0, 4)
        self._data["tool"] = tool_versions()
        self._set_peak(self._data)
        return self.to_dict()

    def _set_peak(self, doc: dict) -> None:
        """`peak_rss`: the largest of the stages' (the process tree's peak while the run worked)."""
        peaks = [s["peak_rss"] for s in doc["stages"] if isinstance(s.get("peak_rss"), int)]
        if peaks:
            doc["peak_rss"] = max(peaks)

    def to_dict(self) -> dict:
        return copy.deepcopy(self._data)

    def to_json(self) -> str:
        return json.dumps(self._data, indent=2, default=json_default)

    def write(self, folder: Path) -> Path:
        """Finish the run as successful (unless already finished) and write `folder/report.json`."""
        if not self.finished:
            self.finish(exit_code=0)
        path = Path(folder) / "report.json"
        path.write_text(self.to_json())
        write_html_beside(path, self._data)
        return path


    def write_failed(self, folder: Path, exit_code: int, error: dict) -> Path:
        """`folder/report.json` of a run that failed (status failed, the error), the report itself left open."""
        doc = {**self.to_dict(), "status": "failed", "exit_code": exit_code, "error": error,
               "seconds": round(time.perf_counter() - self._t0, 4), "tool": tool_versions()}
        self._set_peak(doc)
        path = Path(folder) / "report.json"
        path.write_text(json.dumps(doc, indent=2, default=json_default))
        write_html_beside(path, doc)
        return path


def _contract(contract: dict, reference_varies: dict[str, bool] | None, given: list[str] | None) -> dict:
    contract = copy.deepcopy(contract)
    if given:
        contract["given_inputs"] = sorted(given)
    for o in contract.get("outputs") or []:
        if reference_varies and o["name"] in reference_varies:
            o["reference_varies"] = reference_varies[o["name"]]
    return contract


class StageRow:
    """The handle `Report.stage()` yields: adds details to its stage row."""

    def __init__(self, entry: dict):
        self._entry = entry

    def note(self, **details) -> None:
        self._entry.update(details)


class Run:
    """The end of every command: `with Run("convert") as report: ...`.

    On success the report is finished (exit code 0) unless the body already wrote it. On a
    ModelportError the report is finished with the error's exit code and the error is raised
    again as a copy carrying it (`e.report`), chained from the original; an error that already
    carries a report (an inner run ended first) passes through unchanged. An optional framework
    that failed to import becomes the MissingDependencyError (exit 5) that names its extra. Any
    other exception (a bug) passes through, and `document` holds the failed report (exit 1).
    """

    def __init__(self, command: str):
        self.report = Report(command)
        self.document: dict | None = None

    def __enter__(self) -> Report:
        return self.report

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            if not self.report.finished:
                self.report.finish(exit_code=0)
            self.document = self.report.to_dict()
            return False
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit
            return False
        if not isinstance(exc, ModelportError):

            missing = missing_dependency(exc)
            if missing is None:
                self.document = self.report.finish(exit_code=EXIT_UNEXPECTED, error={
                    "type": type(exc).__name__, "exit_code": EXIT_UNEXPECTED, "message": str(exc), "path": None})
                return False
            self.document = self.report.finish(exit_code=missing.exit_code, error=missing.to_dict())
            raise missing.with_report(self.document) from exc
        if exc.report is not None:
            self.document = exc.report
            return False
        self.document = self.report.finish(exit_code=exc.exit_code, error=exc.to_dict())
        raise exc.with_report(self.document) from exc


def write_html_beside(report_json: Path, doc: Mapping[str, Any]) -> Path:
    """report.html next to report.json: the same run as a self-contained page."""
    from modelport.validation.html_report import render_report, write_html

    return write_html(report_json.with_name("report.html"), render_report(json.loads(json.dumps(doc, default=json_default))))


def json_default(o):
    import numpy as np

    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)


@contextlib.contextmanager
def run_stage(report: Report, name: str, *, on_stage=None, **details):
    """A timed report stage (`on_stage(name)` told first, for the live display); an unexpected
    exception inside becomes a StageError naming the stage and the stages that ran before it, a
    failed import of an optional framework its MissingDependencyError (exit 5); user errors pass
    through unchanged."""
    if on_stage:
        on_stage(name)
    before = report.stage_names
    with report.stage(name, **details) as entry:
        try:
            yield entry
        except MemoryError:
            raise
        except Exception as e:
            from modelport.deps import missing_dependency

            missing = missing_dependency(e)
            if missing is not None and missing is not e:
                raise missing from e
            if isinstance(e, ModelportError):
                raise
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:  # the machine's limit, not a bug: said as bad input
                from modelport.errors import BadInputError

                raise BadInputError(f"stage '{name}' ran out of disk space{f' writing {e.filename}' if e.filename else ''}",
                                    hint="free disk space, or set TMPDIR (the scratch folder) and -o on a larger disk") from e
            raise StageError(name, before, e) from e
