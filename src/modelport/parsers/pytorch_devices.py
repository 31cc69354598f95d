"""PyTorch files saved on a GPU, read on a machine that may have none.

Models are trained and exported on GPU machines and converted on CPU ones. What each format keeps
of the device it was saved on, and what is done here:

- `.pt2` (torch.export archive): every weight's and every graph value's metadata names its device
  (`"device": {"type": "cuda", "index": 0}`), and so do device arguments in the graph
  (`torch.arange(..., device=x.device)` is recorded as `cuda:0`); the sample inputs are a pickle with
  CUDA storages. `torch.export.load` has no `map_location`: it fails with "Torch not compiled with
  CUDA enabled" on a CPU build, and on a GPU machine loads a program whose weights sit on the GPU
  while modelport feeds CPU inputs. `cpu_archive` writes a copy of the archive in which every
  device is the CPU (the user's file is never touched), which loads and runs like the original.
- TorchScript: `torch.jit.load(map_location="cpu")` moves the weights, but a traced model keeps
  device constants (`prim::Constant[value="cuda:0"]`) in its graphs; `move_constants_to_cpu`
  replaces them in the loaded module (in memory).
- Pickles and state dicts are read with `map_location="cpu"` already.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

CPU = {"type": "cpu"}


def _devices_in(obj, found: set[str]) -> None:
    if isinstance(obj, dict):
        dev = obj.get("device") if isinstance(obj.get("device"), dict) else obj.get("as_device")
        if isinstance(dev, dict) and "type" in dev:
            found.add(dev["type"] if dev.get("index") is None else f"{dev['type']}:{dev['index']}")
        for v in obj.values():
            _devices_in(v, found)
    elif isinstance(obj, list):
        for v in obj:
            _devices_in(v, found)


def _to_cpu(obj):
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("device", "as_device") and isinstance(v, dict) and "type" in v:
                out[k] = dict(CPU)
            else:
                out[k] = _to_cpu(v)
        return out
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def _is_json_record(name: str) -> bool:
    return name.endswith(".json") and ("/models/" in name or "/data/weights/" in name or "/data/constants/" in name)


def archive_devices(path: Path) -> set[str]:
    """The devices a `.pt2` archive's weights and graph name (e.g. {"cpu"} or {"cuda:0"})."""
    found: set[str] = set()
    try:
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if _is_json_record(name):
                    try:
                        _devices_in(json.loads(z.read(name)), found)
                    except ValueError:
                        continue
    except (OSError, zipfile.BadZipFile):
        return set()
    return found


def _sample_inputs_on_cpu(data: bytes) -> bytes:
    """The sample-inputs pickle re-saved with CPU storages (read weights-only; left as it is when it
    holds anything but tensors and containers)."""
    import torch

    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception:
        return data
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def cpu_archive(path: Path, out_dir: Path) -> Path:
    """A copy of the `.pt2` at `path`, written under `out_dir`, whose weights, graph values, device
    arguments and sample inputs are all on the CPU."""
    dst = Path(out_dir) / Path(path).name
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(dst, "w") as out:
        for info in src.infolist():
            data = src.read(info.filename)
            if _is_json_record(info.filename):
                try:
                    data = json.dumps(_to_cpu(json.loads(data))).encode()
                except ValueError:
                    pass
            elif "/data/sample_inputs/" in info.filename and info.filename.endswith(".pt"):
                data = _sample_inputs_on_cpu(data)
            # each record keeps its ZipInfo, so weights stay stored uncompressed as torch wrote them (torch reads
            # them from the archive whatever their offset)
            out.writestr(info, data, compress_type=info.compress_type)
    return dst


def _graphs(module):
    """Every method graph of a loaded TorchScript module and its submodules."""
    seen: set[int] = set()
    stack = [module]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        c = getattr(m, "_c", None)
        for name in (c._method_names() if c is not None else []):
            yield c._get_method(name).graph
        stack.extend(m.children())


def move_constants_to_cpu(module) -> list[str]:
    """Replace every non-CPU device constant in a loaded TorchScript module's graphs by the CPU;
    returns the devices replaced (empty when the module named none)."""
    import torch

    moved = []
    for g in _graphs(module):
        for node in list(g.findAllNodes("prim::Constant")):
            out = node.output()
            if out.type().kind() != "DeviceObjType" or not node.hasAttribute("value"):
                continue
            value = node.s("value")
            if value == "cpu":
                continue
            with g.insert_point_guard(node):
                cpu = g.insertConstant(torch.device("cpu"))
            out.replaceAllUsesWith(cpu)
            node.destroy()
            moved.append(value)
    return moved
