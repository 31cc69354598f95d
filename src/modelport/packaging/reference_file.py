"""`reference.npz` beside a convert run's artifacts: the first reference sample set (the source
framework's outputs on the sample inputs), what `modelport serve` checks an artifact's answers
against before it goes ready. Written when it is at most MAX_BYTES; the report's `reference` entry
names the file, its arrays and its sha256.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError
from modelport.packaging.bundle import report_path

FILE = "reference.npz"
MAX_BYTES = 16 << 20


def write_reference(reference, folder: Path) -> dict | None:
    """Write `folder/reference.npz` from `reference` (an `ir.Reference`); its report entry, or None
    when there is no reference or it is over MAX_BYTES."""
    if reference is None:
        return None
    arrays = {**{f"in/{k}": np.asarray(v) for k, v in reference.inputs.items()},
              **{f"out/{k}": np.asarray(v) for k, v in reference.outputs.items()}}
    if any(a.dtype == object for a in arrays.values()) or sum(a.nbytes for a in arrays.values()) > MAX_BYTES:
        return None
    path = Path(folder) / FILE
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return {"file": FILE, "inputs": sorted(reference.inputs), "outputs": sorted(reference.outputs),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def read_reference(folder: Path, entry: dict | None) -> tuple[dict, dict] | None:
    """(inputs, outputs) of `folder/reference.npz` when the report names it and its sha256 matches;
    None when there is none; a changed file is exit 2 (`BadInputError`)."""

    if not entry:
        return None

    path = report_path(Path(folder), str(entry.get("file", FILE)))  # refused when it leaves the folder (exit 3)
    if not path.is_file():
        return None
    if hashlib.sha256(path.read_bytes()).hexdigest() != entry.get("sha256"):
        raise BadInputError("the reference sample does not match the sha256 its report.json records", path=path)
    with np.load(path, allow_pickle=False) as z:
        inputs = {k[3:]: z[k] for k in z.files if k.startswith("in/")}
        outputs = {k[4:]: z[k] for k in z.files if k.startswith("out/")}
    return inputs, outputs
