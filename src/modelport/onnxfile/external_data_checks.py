"""The safety checks on an ONNX model's external-data references, run before onnx or onnxruntime
reads any of those files.

Every reference is checked: known keys only, a relative location that resolves inside the model's
folder, no symlinks or hard links, and `offset + length` within the file. (CVE-2022-25882,
CVE-2024-27318 and the symlink advisories of onnx < 1.21 are the cases this guards; it does not rely
on the installed onnx version having the fixes.)
"""

from __future__ import annotations

import os
from pathlib import Path

from modelport.errors import BadInputError, UnsafeInputError
from modelport.onnxfile.tensor_sizes import iter_tensors

EXTERNAL_KEYS = {"location", "offset", "length", "checksum", "basename"}


def check_external_data(model, base_dir: Path, model_path: Path) -> list[Path]:
    """Validate every external-data reference of `model`; return the files it reads."""
    base = base_dir.resolve()
    used: list[Path] = []
    for tensor in iter_tensors(model.graph):
        if tensor.data_location != 1:  # TensorProto.EXTERNAL
            continue
        info = {e.key: e.value for e in tensor.external_data}
        unknown = set(info) - EXTERNAL_KEYS
        if unknown:
            raise BadInputError(f"tensor '{tensor.name}' has unknown external-data keys {sorted(unknown)}", path=model_path)
        loc = info.get("location", "")
        if not loc:
            raise BadInputError(f"tensor '{tensor.name}' has external data without a location", path=model_path)
        if os.path.isabs(loc) or loc.startswith(("/", "\\")) or (len(loc) > 1 and loc[1] == ":"):
            raise UnsafeInputError(f"external data '{loc}' of tensor '{tensor.name}' is an absolute path outside the model folder", path=model_path)
        if ".." in Path(loc).parts:
            raise UnsafeInputError(f"external data '{loc}' of tensor '{tensor.name}' resolves outside the model folder", path=model_path)
        target = base / loc
        # Check every component for symlinks, not just the leaf.
        probe = base
        for part in Path(loc).parts:
            probe = probe / part
            if probe.is_symlink():
                raise UnsafeInputError(f"external data '{loc}' of tensor '{tensor.name}' goes through a symlink", path=model_path)
        resolved = target.resolve()
        if os.path.commonpath([str(resolved), str(base)]) != str(base):
            raise UnsafeInputError(f"external data '{loc}' of tensor '{tensor.name}' resolves outside the model folder", path=model_path)
        if not resolved.is_file():
            raise BadInputError(f"external data file '{loc}' of tensor '{tensor.name}' is missing", path=model_path)
        st = resolved.stat()
        if st.st_nlink > 1:
            raise UnsafeInputError(f"external data '{loc}' of tensor '{tensor.name}' is a hard link", path=model_path)
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise BadInputError(f"tensor '{tensor.name}' has a non-numeric external-data offset or length", path=model_path) from None
        if offset < 0 or (length is not None and length < 0):
            raise BadInputError(f"tensor '{tensor.name}' has a negative external-data offset or length", path=model_path)
        end = offset + (length if length is not None else 0)
        if offset > st.st_size or end > st.st_size:
            raise BadInputError(
                f"external data of tensor '{tensor.name}' ends at byte {end}, past the end of '{loc}' ({st.st_size} bytes)",
                path=model_path,
            )
        used.append(resolved)
    return sorted(set(used))
