"""A PyTorch file read without running its code: which kind of file it is, the torch release that
loads weights safely, a safetensors header checked before any tensor is read, and a state-dict
file's contents (safetensors, or `torch.load(weights_only=True)`, which refuses any pickle global
outside torch's allow-list). Only with `--trust` is a checkpoint the weights-only reader refused
(a Lightning checkpoint's hyper-parameter object beside its `state_dict`) loaded with
`weights_only=False`, which runs the pickle's code.
"""

from __future__ import annotations

import json
import pickle
import re
import struct
import zipfile
from pathlib import Path

from modelport.deps import require
from modelport.errors import BadInputError, UnsafeInputError, one_line

MIN_TORCH = (2, 6)  # weights_only=True is unsafe before 2.6 (CVE-2025-32434)
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024


def _torch():
    return require("torch", purpose="PyTorch sources")


def _zip_names(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (zipfile.BadZipFile, OSError):
        return []


def file_format(path: Path) -> str:
    """'safetensors', 'exported_program', 'torchscript', 'pickle' (torch.save zip or legacy)."""
    if path.suffix.lower() == ".safetensors":
        return "safetensors"
    names = _zip_names(path)
    if any(n.endswith("serialized_exported_program.json") or "/models/" in n and n.endswith(".json") for n in names) or (
        path.suffix.lower() == ".pt2" and names
    ):
        return "exported_program"
    if any(n.endswith("/constants.pkl") for n in names) and any("/code/" in n for n in names):
        return "torchscript"
    if names:
        return "pickle"
    with open(path, "rb") as f:
        head = f.read(2)
    if head and head[0] == 0x80:  # legacy (non-zip) pickle protocol marker
        return "pickle"
    raise BadInputError("truncated or not a PyTorch file", path=path)


def check_torch_version():
    torch = _torch()

    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) < MIN_TORCH:
        raise UnsafeInputError(
            f"torch {torch.__version__} cannot load weights safely (CVE-2025-32434)", hint="install torch>=2.6"
        )


def check_safetensors_header(path: Path) -> dict:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise BadInputError("truncated safetensors file", path=path)
        (n,) = struct.unpack("<Q", raw)
        if n > SAFETENSORS_MAX_HEADER or n > size - 8:
            raise BadInputError(f"safetensors header of {n} bytes is larger than the file allows", path=path)
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise BadInputError("corrupt safetensors header", path=path) from None
    data_len = size - 8 - n
    for key, info in header.items():
        if key == "__metadata__":
            continue
        start, end = info.get("data_offsets", (0, 0))
        if not (0 <= start <= end <= data_len):
            raise BadInputError(f"safetensors tensor '{key}' has offsets outside the file", path=path)
    return header


def read_checkpoint(path: Path, *, trust: bool = False) -> tuple[object, str | None]:
    """(what a state-dict file holds, the warning to give when its pickled code ran): a safetensors
    file's tensors, or the object `torch.load(weights_only=True)` gives (a state dict, or a
    checkpoint dict around one). A pickle that reader refuses is exit 3, or with `trust` loaded
    again with `weights_only=False`, which runs its code."""
    torch = _torch()

    fmt = file_format(path)
    if fmt == "safetensors":
        check_safetensors_header(path)
        load_file = require("safetensors.torch", purpose="safetensors state dicts").load_file
        try:
            return load_file(str(path)), None
        except Exception as e:
            raise BadInputError(f"cannot read safetensors: {e}", path=path) from None
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True), None
    except pickle.UnpicklingError as e:
        if not trust:
            raise UnsafeInputError(f"unsafe pickle global, refusing to load: {one_line(e)}", path=path,
                                   hint="--trust loads it if you trust the file (its pickled code runs); "
                                        "a plain state dict loads without --trust") from None
        refused = _refused_global(e)
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=False)
    except (AttributeError, ModuleNotFoundError, ImportError) as e:
        raise BadInputError(f"the checkpoint's pickled objects need code that cannot be imported here ({one_line(e)})",
                            path=path, hint="save the state dict alone (torch.save(model.state_dict(), ...)): it "
                                            "loads without --trust") from None
    held = f" ({refused})" if refused else ""
    return obj, (f"the checkpoint holds objects beyond tensors{held}: loaded with --trust (torch.load "
                 f"weights_only=False), which ran its pickled code")


def _refused_global(e: BaseException) -> str | None:
    """The global torch's weights-only unpickler refused ('argparse.Namespace'), when it names one."""
    m = re.search(r"GLOBAL ([\w.]+)", str(e))
    return m.group(1) if m else None
