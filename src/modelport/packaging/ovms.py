"""OpenVINO Model Server (OVMS) repository: `<name>/<version>/model.xml` + `model.bin` and `config.json`.

OVMS serves OpenVINO IR (and ONNX) from numeric version folders; `config.json` names the model,
its folder (relative to the config file, so the bundle works wherever it is mounted), the device
and the OpenVINO properties it is compiled with. The inference precision the artifact was
validated at goes into `plugin_config` as `INFERENCE_PRECISION_HINT`, explicitly: without it
OVMS's CPU plugin runs an FP32 model in bf16 on BF16 hardware. The file is checked against a
JSON schema written from the OVMS documentation (`schemas/ovms_config.schema.json`).

An existing repository takes another version (`add_version`); OVMS serves the newest by default.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from modelport.errors import BadInputError
from modelport.packaging import Bundle, PackageOptions
from modelport.packaging.bundle import (
    Artifacts,
    check_schema,
    load_schema,
    new_version,
    place_openvino_ir,
    served_name,
    unservable,
)
from modelport.packaging.docker import image_for
from modelport.packaging.requests import v2_request, write_json_request

NAME = "ovms"
DESCRIPTION = "OpenVINO Model Server repository (<name>/<version>/model.xml + config.json), config checked against its schema"
SCHEMA = "schemas/ovms_config.schema.json"
ACCEPTS = "OpenVINO IR (--to openvino) or ONNX"
# modelport precision -> INFERENCE_PRECISION_HINT
HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


def schema() -> dict:
    return load_schema(SCHEMA)


def check(doc: dict) -> None:
    """Validate a config.json document against the schema (needs jsonschema; skipped when absent)."""
    check_schema(doc, SCHEMA, "OVMS config.json")


def model_kind(artifacts: Artifacts) -> str:
    for kind in ("openvino", "onnx"):
        if artifacts.has(kind):
            return kind
    raise unservable(artifacts, "OpenVINO Model Server", ACCEPTS)


def plugin_config(artifacts: Artifacts, kind: str) -> dict:
    """OpenVINO properties: latency-oriented, the inference precision pinned to what was validated."""
    entry = artifacts.entries.get(kind, {})
    run_at = entry.get("inference_precision") or ("fp32" if kind == "onnx" else artifacts.precision_of(kind))
    return {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": HINTS.get(run_at, "f32")}


def _place(artifacts: Artifacts, kind: str, version_dir: Path) -> list[Path]:
    version_dir.mkdir(parents=True)
    if kind == "openvino":
        return place_openvino_ir(artifacts, version_dir, "OpenVINO Model Server")
    files = artifacts.onnx_files()
    out = []
    for src in files:
        dst = version_dir / src.relative_to(files[0].parent)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        out.append(dst)
    return out



def config_doc(name: str, plugin: dict, existing: dict | None = None) -> dict:
    """config.json: the existing one's other models kept, this model's entry (re)written."""
    entry = {"config": {"name": name, "base_path": name, "target_device": "CPU", "plugin_config": plugin,
                        "model_version_policy": {"latest": {"num_versions": 1}}}}
    models = [m for m in (existing or {}).get("model_config_list", []) if m.get("config", {}).get("name") != name]
    return {**(existing or {}), "model_config_list": [*models, entry]}


def package(artifacts: Artifacts, out_dir: Path, options: PackageOptions) -> Bundle:
    if options.device != "cpu":
        raise BadInputError("the OpenVINO Model Server bundle targets the CPU here (--device cpu)")
    kind = model_kind(artifacts)
    name = served_name(artifacts, options)
    model_dir = out_dir / name
    version, existing = new_version(model_dir, name, options.version)
    config_path = out_dir / "config.json"
    old = None
    if config_path.is_file():
        try:
            old = json.loads(config_path.read_text())
        except json.JSONDecodeError as e:
            raise BadInputError(f"unreadable config.json ({e.msg})", path=config_path) from None
        check(old)
    plugin = plugin_config(artifacts, kind)
    doc = config_doc(name, plugin, old)
    check(doc)
    files = _place(artifacts, kind, model_dir / str(version))
    config_path.write_text(json.dumps(doc, indent=2) + "\n")
    files.append(config_path)

    request = write_json_request(out_dir / f"{name}.request.json", artifacts, v2_request)
    if request:
        files.append(request)
    readme = out_dir / "README.md"
    readme.write_text(_readme(name, version, kind, plugin, request))
    files.append(readme)
    return Bundle(NAME, out_dir, files, {"model_name": name, "version": version, "versions": [*existing, version],
                                         "format": "openvino-ir" if kind == "openvino" else "onnx",
                                         "inference_precision": plugin["INFERENCE_PRECISION_HINT"], "gpu": False})


def _readme(name: str, version: int, kind: str, plugin: dict, request: Path | None) -> str:

    body = f"-d @{request.name}" if request else "-d '{\"inputs\": [...]}'  # KServe v2 JSON, one entry per input"
    what = "OpenVINO IR (`model.xml` + `model.bin`)" if kind == "openvino" else "ONNX"
    return f"""# OpenVINO Model Server repository: {name}

Version {version} of `{name}` ({what}), compiled on CPU with {json.dumps(plugin)}.
The inference precision is pinned: OpenVINO's CPU default on BF16 hardware is bf16.

Start the server on this folder:

```sh
docker run --rm -p 9000:9000 -p 8000:8000 -v "$PWD":/models {image_for("ovms", False)} \\
  --config_path=/models/config.json --port=9000 --rest_port=8000
curl -sf localhost:8000/v2/models/{name}/ready && echo ready
```

Call it (KServe v2 protocol over HTTP; gRPC on port 9000):

```sh
curl -s -X POST localhost:8000/v2/models/{name}/infer -H 'Content-Type: application/json' {body}
```
"""
