"""Keras model files are data: their config is read and screened before Keras sees them.

Keras' own `safe_mode=True` has been bypassed several times (CVE-2025-1550: `config.json` importing
any module; CVE-2025-8747; CVE-2025-9906: a config calling `enable_unsafe_deserialization`;
CVE-2025-9905: `.h5` ignoring `safe_mode`; CVE-2025-49655: `TorchModuleWrapper`). So, without
importing Keras, we read the `.keras` archive's `config.json` or the `.h5` file's `model_config`
attribute ourselves and refuse Lambda layers, `TorchModuleWrapper`, `TFSMLayer`, serialized Python
functions, any class from a module outside Keras and any function outside Keras' activation,
initializer, regularizer, constraint, loss and metric modules, naming the layer. `--trust` lifts
the screen. Loading then still uses `safe_mode=True` on a Keras release with those bypasses fixed.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from modelport.errors import BadInputError, UnsafeInputError, one_line

MIN_KERAS = (3, 11, 3)  # CVE-2025-9905 (.h5 safe_mode) fixed in 3.11.3
UNSAFE_CLASSES = {"Lambda", "TorchModuleWrapper", "TFSMLayer", "__lambda__", "JaxLayer", "FlaxLayer"}
FUNCTION_MODULES = (
    "keras.activations", "keras.src.activations", "keras.initializers", "keras.src.initializers",
    "keras.regularizers", "keras.src.regularizers", "keras.constraints", "keras.src.constraints",
    "keras.losses", "keras.src.losses", "keras.metrics", "keras.src.metrics",
)
UNSAFE_STRINGS = {"enable_unsafe_deserialization"}
MAX_CONFIG_BYTES = 64 * 1024 * 1024
H5_MAGIC = b"\x89HDF\r\n\x1a\n"


def read_config(path: Path) -> dict:
    """The model config of a `.keras` archive, a Keras `.h5` file or an architecture `.json`, parsed as JSON only."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"PK"):
        return _zip_config(path)
    if head == H5_MAGIC:
        return _h5_config(path)
    if path.suffix.lower() == ".json":  # an architecture JSON (model.to_json()), weights in another file
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise BadInputError(f"architecture JSON of {path.stat().st_size} bytes is too large", path=path)
        return _json(path.read_bytes(), path)
    raise BadInputError("truncated or not a Keras file (neither a .keras zip nor HDF5)", path=path)


def _zip_config(path: Path) -> dict:
    try:
        with zipfile.ZipFile(path) as z:
            try:
                info = z.getinfo("config.json")
            except KeyError:
                raise BadInputError("not a Keras archive: no config.json inside", path=path) from None
            if info.file_size > MAX_CONFIG_BYTES:
                raise BadInputError(f"config.json of {info.file_size} bytes is too large", path=path)
            raw = z.read(info)
    except zipfile.BadZipFile as e:
        raise BadInputError(f"truncated or corrupt .keras archive: {e}", path=path) from None
    return _json(raw, path)


def _h5_config(path: Path) -> dict:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            raw = f.attrs.get("model_config")
    except (OSError, ValueError) as e:
        raise BadInputError(f"truncated or corrupt HDF5 file: {one_line(e)}", path=path) from None
    if raw is None:
        raise BadInputError("an HDF5 file without a Keras model_config (weights only?)", path=path,
                            hint="weights-only .h5 files need the architecture; save the full model")
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    return _json(raw, path)


def _json(raw, path: Path) -> dict:
    try:
        config = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadInputError(f"corrupt Keras model config: {e}", path=path) from None
    if not isinstance(config, dict):
        raise BadInputError("corrupt Keras model config: not a JSON object", path=path)
    return config


def _in_keras(module: str) -> bool:
    return module == "keras" or module.startswith("keras.")


def find_unsafe(config, layer: str = "<model>") -> list[str]:
    """Every reason to refuse a config, each naming the layer it was found in."""
    found: list[str] = []
    if isinstance(config, list):
        for item in config:
            found += find_unsafe(item, layer)
        return found
    if isinstance(config, str):
        if config in UNSAFE_STRINGS:
            found.append(f"layer '{layer}' refers to '{config}'")
        return found
    if not isinstance(config, dict):
        return found
    inner = config.get("config")
    if isinstance(inner, dict) and isinstance(inner.get("name"), str) and "class_name" in config:
        layer = inner["name"]
    cls = config.get("class_name")
    module = config.get("module")
    if isinstance(cls, str):
        if cls in UNSAFE_CLASSES:
            found.append(f"layer '{layer}' is a {cls} (runs code)")
        if isinstance(module, str) and not _in_keras(module):
            found.append(f"layer '{layer}' uses class '{cls}' from module '{module}', outside Keras")
        if cls == "function":
            name = inner if isinstance(inner, str) else None
            if not (isinstance(module, str) and module.startswith(FUNCTION_MODULES)):
                found.append(f"layer '{layer}' calls function '{name}' from module '{module}'")
        registered = config.get("registered_name")
        if isinstance(registered, str) and ">" in registered:
            found.append(f"layer '{layer}' uses custom object '{registered}'")
    for key, value in config.items():
        if key == "class_name":
            continue
        found += find_unsafe(value, layer)
    return found


def screen(path: Path, *, trust: bool) -> dict:
    """The file's config, after refusing anything that would run code (unless trusted)."""
    config = read_config(path)
    if not trust:
        reasons = list(dict.fromkeys(find_unsafe(config)))
        if reasons:
            more = f" (+{len(reasons) - 3} more)" if len(reasons) > 3 else ""
            raise UnsafeInputError(
                "refusing to load: " + "; ".join(reasons[:3]) + more, path=path,
                hint="pass --trust only if you trust the file",
            )
    return config


def check_keras_version() -> str:
    """Refuse Keras releases whose safe_mode has published bypasses."""
    from modelport.deps import version_of

    version = version_of("keras") or "0"
    parts = []
    for p in version.split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    if tuple(parts) < MIN_KERAS:
        raise UnsafeInputError(
            f"keras {version} cannot load model files safely (CVE-2025-9905, CVE-2025-9906)",
            hint="pip install 'keras>=3.11.3'",
        )
    return version
