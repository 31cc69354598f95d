"""Builders for the model zoo's locally built entries, one module per source framework.

Each framework module offers `save(model, entry, folder) -> (files, convert_hint)`, writing the
model in the format users would hand to `modelport convert`.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from modelport.errors import BadInputError
from modelport.run.staging import staged_dir

SAVERS = {"pytorch": "modelport.zoo_builders.pytorch"}
SAVERS["keras"] = "modelport.zoo_builders.keras"


def save_source(name: str, output: Path, *, force: bool = False) -> dict:
    """Build zoo model `name` and save it into `output`, with a report.json that marks the folder
    as modelport's (so `--force` may replace it later) and lists the files."""
    from modelport import zoo
    from modelport.validation.report import Findings, Run

    entry = zoo.get(name)
    if entry.framework not in SAVERS:
        raise BadInputError(f"zoo model '{name}' ({entry.framework}) cannot be saved as a source file")
    with Run("zoo build") as report:
        with report.stage("build"):
            model = zoo.build(name)
        saver = importlib.import_module(SAVERS[entry.framework])
        with staged_dir(output, force=force) as stage:
            with report.stage("save"):
                files, hint = saver.save(model, entry, stage)
            report.record(Findings(source={"path": f"zoo:{name}", "framework": entry.framework, "format": None},
                                   files=sorted(str(Path(f).relative_to(stage)) for f in files)))
            report.write(stage)
    files = [str(output / Path(f).relative_to(stage)) for f in files]
    return {"name": name, "framework": entry.framework, "files": files,
            "convert_hint": hint.replace("{dir}", str(output))}
