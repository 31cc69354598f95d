"""KServe bundle: the chosen server's bundle plus an `InferenceService` (serving.kserve.io/v1beta1).

The predictor names the model format and the KServe runtime of that server and points
`storageUri` at wherever the bundle folder is uploaded (`--storage-uri`, default a PVC). The
resource is checked against `schemas/inferenceservice.schema.json`, a schema for the fields we
write, derived from KServe's InferenceService CRD (unknown keys are rejected).
"""

from __future__ import annotations

import json
from pathlib import Path

from modelport.errors import BadInputError
from modelport.serving import Bundle, PackageOptions
from modelport.serving.bundle import Artifacts
from modelport.serving.docker import server
from modelport.serving.kubernetes import k8s_name, needs_gpu, server_bundle, write_yaml

NAME = "kserve"
DESCRIPTION = "KServe InferenceService around a Triton, TorchServe or TF Serving bundle"
SCHEMA = "schemas/inferenceservice.schema.json"


def schema() -> dict:
    import importlib.resources

    return json.loads(importlib.resources.files("modelport.serving").joinpath(SCHEMA).read_text())


def check(doc: dict) -> None:
    """Validate an InferenceService against our schema (needs jsonschema; skipped when absent)."""
    try:
        import jsonschema
    except ImportError:
        return
    errors = sorted(jsonschema.Draft202012Validator(schema()).iter_errors(doc), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "/".join(map(str, e.path)) or "(root)"
        raise BadInputError(f"InferenceService invalid at {where}: {e.message}")


def inference_service(options: PackageOptions, model_name: str, gpu: bool) -> dict:
    s = server(options.server)
    name = k8s_name(model_name)
    base = (options.storage_uri or f"pvc://modelport-models/{name}").rstrip("/")
    uri = f"{base}/{model_name}" if s.name == "tfserving" else base
    resources: dict = {"requests": {"cpu": options.cpu, "memory": options.memory}, "limits": {"memory": options.memory}}
    if gpu:
        resources["limits"]["nvidia.com/gpu"] = options.gpus or 1
    meta: dict = {"name": name, "labels": {"app.kubernetes.io/part-of": "modelport"}}
    if options.namespace:
        meta["namespace"] = options.namespace
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": meta,
        "spec": {"predictor": {
            "minReplicas": options.min_replicas,
            "maxReplicas": options.max_replicas,
            "scaleMetric": "cpu",
            "scaleTarget": options.target_cpu_utilization,
            "model": {
                "modelFormat": {"name": s.kserve_format},
                "runtime": s.kserve_runtime,
                "protocolVersion": s.kserve_protocol,
                "storageUri": uri,
                "resources": resources,
            },
        }},
    }


def _torchserve_kserve_config(folder: Path) -> Path:
    """KServe's TorchServe runtime reads `config/config.properties` under the storage URI."""
    cfg = folder / "config" / "config.properties"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text("\n".join([
        "inference_address=http://0.0.0.0:8085", "management_address=http://0.0.0.0:8085",
        "metrics_address=http://0.0.0.0:8082", "grpc_inference_port=7070", "grpc_management_port=7071",
        "enable_metrics_api=true", "metrics_format=prometheus", "install_py_dep_per_model=true",
        "disable_token_authorization=true", "model_store=/mnt/models/model-store", "load_models=all", "",
    ]))
    return cfg


def package(artifacts: Artifacts, out_dir: Path, options: PackageOptions) -> Bundle:
    inner = server_bundle(artifacts, out_dir, options)
    model_name = inner.details["model_name"]
    gpu = needs_gpu(inner, options)
    s = server(options.server)
    files = list(inner.files)
    if s.name == "torchserve":
        files.append(_torchserve_kserve_config(out_dir / s.bundle_dir))
    doc = inference_service(options, model_name, gpu)
    check(doc)
    files.append(write_yaml(out_dir / "inferenceservice.yaml", doc))
    readme = out_dir / "README.md"
    readme.write_text(_readme(model_name, doc, s.bundle_dir, s.name))
    files.append(readme)
    return Bundle(NAME, out_dir, files, {"model_name": model_name, "server": s.name, "gpu": gpu,
                                         "storage_uri": doc["spec"]["predictor"]["model"]["storageUri"],
                                         "server_bundle": s.bundle_dir})


def _readme(model_name: str, doc: dict, bundle_dir: str, server_name: str) -> str:
    name = doc["metadata"]["name"]
    uri = doc["spec"]["predictor"]["model"]["storageUri"]
    path = {"triton": f"/v2/models/{model_name}/infer", "torchserve": f"/v1/models/{model_name}:predict",
            "tfserving": f"/v1/models/{model_name}:predict"}[server_name]
    return f"""# KServe bundle: {model_name} ({server_name})

Upload the contents of `{bundle_dir}/` to the storage the InferenceService points at
(`{uri}`), then:

```sh
kubectl apply -f inferenceservice.yaml
kubectl wait --for=condition=Ready inferenceservice/{name} --timeout=300s
URL=$(kubectl get inferenceservice {name} -o jsonpath='{{.status.url}}')
curl -s -X POST "$URL{path}" -H 'Content-Type: application/json' -d @{bundle_dir}/{model_name}.request.json
```
"""
