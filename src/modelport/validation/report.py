"""The run report: one JSON document per run, the same data the terminal shows as tables.

Schema `modelport.report/1` (documented in the README):
  schema, command, status ("ok" | "failed"), exit_code, error, started, seconds,
  tool (versions), source {path, framework, format, sha256, size},
  contract {inputs, outputs, sample_dims}, stages [{name, seconds, ...}],
  artifacts [{target, runtime, precision, requested_precision, files, size, nodes}],
  parity [{hop, ok, tolerance, outputs}], warnings [str].
Later stages add their own keys to stages/artifacts entries; existing keys keep their meaning.
"""

from __future__ import annotations

import contextlib
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "modelport.report/1"
SCHEMA_FILE = Path(__file__).with_name("report.schema.json")  # the published JSON Schema of SCHEMA
VERSIONED = ("onnx", "onnxruntime", "torch", "tensorflow", "keras", "tf2onnx", "onnxsim", "onnxscript", "onnx2tf", "ai_edge_litert", "tensorrt")


def tool_versions() -> dict[str, str]:
    import sys

    from modelport.deps import version_of
    from modelport.version import __version__

    out = {"modelport": __version__, "python": platform.python_version()}
    for mod in VERSIONED:
        if mod in sys.modules or mod in ("onnx", "onnxruntime"):
            v = version_of(mod)
            if v:
                out[mod] = v
    return out


@dataclass
class Report:
    command: str
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self._t0 = time.perf_counter()
        self.data.update({
            "schema": SCHEMA, "command": self.command, "status": "running", "exit_code": None,
            "error": None, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": None,
            "tool": {}, "source": None, "contract": None, "stages": [], "artifacts": [], "parity": [], "warnings": [],
        })

    @contextlib.contextmanager
    def stage(self, name: str, **details):
        entry = {"name": name, **details}
        t = time.perf_counter()
        self.data["stages"].append(entry)
        try:
            yield entry
        finally:
            entry["seconds"] = round(time.perf_counter() - t, 4)

    @property
    def stage_names(self) -> list[str]:
        return [s["name"] for s in self.data["stages"]]

    def add_parity(self, result) -> None:
        self.data["parity"].append(result.to_dict())

    def warn(self, text: str) -> None:
        """A finding the user must see although the run succeeds (printed on stderr by the CLI)."""
        self.data["warnings"].append(text)

    def add_artifact(self, artifact: dict) -> None:
        self.data["artifacts"].append(artifact)

    def finish(self, *, exit_code: int = 0, error: dict | None = None) -> dict:
        self.data["status"] = "ok" if exit_code == 0 else "failed"
        self.data["exit_code"] = exit_code
        self.data["error"] = error
        self.data["seconds"] = round(time.perf_counter() - self._t0, 4)
        self.data["tool"] = tool_versions()
        return self.data

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2, default=json_default)

    def write(self, folder: Path) -> Path:
        path = Path(folder) / "report.json"
        path.write_text(self.to_json())
        return path


def json_default(o):
    import numpy as np

    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)
