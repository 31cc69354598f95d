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


class Report:
    """The run record of one command, built through its methods; `data` is a read-only view.

    Code outside this module never writes into the document: each section has its method (source,
    contract, stage rows, artifacts, parity, warnings, optimisation table, bundles, validate's
    sides), so the schema lives in one place. `to_dict()` is a copy for callers to keep.
    """

    def __init__(self, command: str):
        self.command = command
        self._t0 = time.perf_counter()
        self._attempts: dict[str, list[tuple[str, int]]] = {}  # target -> (section, id(entry)) of a retriable attempt
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

    # --- sections -------------------------------------------------------------------------------

    def set_source(self, info: dict) -> None:
        self._data["source"] = dict(info)

    def set_contract(self, contract: dict, *, reference_varies: dict[str, bool] | None = None,
                     given: list[str] | None = None) -> None:
        """The I/O contract; `reference_varies` marks each named output whose source reference changed
        (or not) between two sample sets; `given` names the inputs whose samples the user chose."""
        self._data["contract"] = _contract(contract, reference_varies, given)

    def add_part(self, name: str, contract: dict, *, reference_varies: dict[str, bool] | None = None,
                 given: list[str] | None = None) -> None:
        """One model of a source converted into several (`OUT/<name>/`: a seq2seq encoder and decoder):
        its contract, recorded as `set_contract` records a single model's, under `parts`."""
        given = [g for g in given or [] if g in {i["name"] for i in contract.get("inputs") or []}]
        self._data.setdefault("parts", []).append({"name": name, "path": name,
                                                   "contract": _contract(contract, reference_varies, given)})

    def set_optimize(self, selection: dict) -> None:
        """The table `--optimize auto` chose from."""
        self._data["optimize"] = selection

    def set_bundles(self, bundles: list[dict]) -> None:
        self._data["bundles"] = list(bundles)

    def set_files(self, files: list[str]) -> None:
        """The files a `zoo build` wrote, or those `convert` copied from the source (a tokenizer), relative to the output."""
        self._data["files"] = list(files)

    def set_reference(self, entry: dict) -> None:
        """The reference sample written beside the artifacts (`serving.reference_file`)."""
        self._data["reference"] = dict(entry)

    def set_sides(self, a: dict, b: dict, inputs: dict[str, list[int]]) -> None:
        """`validate`'s two models (`a`, `b`) and the input shapes both ran on."""
        self._data.update(a=a, b=b, inputs=inputs)

    def set_localize(self, where: dict) -> None:
        self._data["localize"] = where

    def add_parity(self, result, *, attempt: str | None = None) -> None:
        """A hop's comparison (a ParityResult or its dict); `attempt` tags it as part of a retriable attempt."""
        entry = result if isinstance(result, dict) else result.to_dict()
        self._data["parity"].append(entry)
        self._tag(attempt, "parity", entry)

    def add_generation(self, result) -> None:
        """An artifact's validation by generation (a GenerationResult or its dict)."""
        entry = result if isinstance(result, dict) else result.to_dict()
        self._data.setdefault("generation", []).append(entry)

    def warn(self, text: str) -> None:
        """A finding the user must see although the run succeeds (printed on stderr by the CLI)."""
        self._data["warnings"].append(text)

    def add_artifact(self, artifact: dict, *, attempt: str | None = None) -> None:
        self._data["artifacts"].append(artifact)
        self._tag(attempt, "artifacts", artifact)

    def add_target_failure(self, target: str, error: dict) -> None:
        """A target that failed while the others went on (convert --to a,b,c reports every target)."""
        self._data.setdefault("target_failures", []).append({"target": target, **error})

    def set_precision_fallback(self, requested: str, reason: str) -> None:
        """The last artifact was delivered in FP32 although `requested` was asked for."""
        self._data["artifacts"][-1]["precision_fallback"] = {"requested": requested, "reason": reason}

    # --- attempts: an emit that may be retried (precision fallback) -----------------------------

    def _tag(self, attempt: str | None, section: str, entry: dict) -> None:
        if attempt is not None:
            self._attempts.setdefault(attempt, []).append((section, id(entry)))

    def discard_attempt(self, attempt: str) -> None:
        """Drop the artifact and parity entries of a failed attempt (replaced by the retry's)."""
        tagged = self._attempts.pop(attempt, [])
        for section in ("artifacts", "parity"):
            ids = {i for s, i in tagged if s == section}
            self._data[section][:] = [e for e in self._data[section] if id(e) not in ids]

    def settle_attempt(self, attempt: str) -> None:
        """The attempt's entries stay: forget the tags."""
        self._attempts.pop(attempt, None)

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
