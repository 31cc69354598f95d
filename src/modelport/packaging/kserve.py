"""KServe bundle: the chosen server's bundle plus an `InferenceService` (serving.kserve.io/v1beta1).

The predictor names the model format and the KServe runtime of that server and points
`storageUri` at wherever the bundle folder is uploaded (`--storage-uri`, default a PVC). The
resource is checked against `schemas/inferenceservice.schema.json`, a schema for the fields we
write, derived from KServe's InferenceService CRD (unknown keys are rejected).
"""

from __future__ import annotations

import re
from pathlib import Path

from modelport.errors import BadInputError
from modelport.packaging import Bundle, PackageOptions
from modelport.packaging.bundle import Artifacts, check_schema, load_schema
from modelport.packaging.docker import server
from modelport.packaging.kubernetes import k8s_name, needs_gpu, server_bundle, write_yaml

NAME = "kserve"
DESCRIPTION = "KServe InferenceService around a Triton, TorchServe or TF Serving bundle"
SCHEMA = "schemas/inferenceservice.schema.json"


def schema() -> dict:
    return load_schema(SCHEMA)


def check(doc: dict) -> None:
    """Validate an InferenceService against our schema (needs jsonschema; skipped when absent)."""
    check_schema(doc, SCHEMA, "InferenceService")


def scaling(options: PackageOptions, gpu: bool) -> dict:
    """The predictor's replica range and scale metric.

    `--replicas N` fixes the scale (min = max = N). Otherwise CPU predictors scale on CPU
    utilisation, and GPU predictors on concurrency (requests in flight per pod, Knative's metric in
    KServe's serverless mode) with a target of `--max-batch` requests: CPU utilisation says nothing
    about a GPU-bound server.
    """
    if options.replicas is not None:
        return {"minReplicas": options.replicas, "maxReplicas": options.replicas}
    low, high = options.autoscale_range
    if gpu:
        return {"minReplicas": low, "maxReplicas": high, "scaleMetric": "concurrency", "scaleTarget": max(1, options.max_batch_size)}
    return {"minReplicas": low, "maxReplicas": high, "scaleMetric": "cpu", "scaleTarget": options.target_cpu_utilization}


PVC_SIZE_MIN = 1 << 30  # a claim is at least 1 GiB; else twice the bundle, rounded up to whole GiB


def pvc_manifest(claim: str, bundle_bytes: int, namespace: str | None) -> dict:
    """The PersistentVolumeClaim a `pvc://CLAIM/...` storage URI names, sized for the bundle."""
    size = max(PVC_SIZE_MIN, 2 * bundle_bytes)
    meta: dict = {"name": claim, "labels": {"app.kubernetes.io/part-of": "modelport"}}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": f"{-(-size // (1 << 30))}Gi"}}}}


def pvc_claim(uri: str) -> tuple[str, str] | None:
    """(claim name, path inside the claim) of a pvc:// URI, or None for other storage."""
    if not uri.startswith("pvc://"):
        return None
    claim, _, path = uri[len("pvc://"):].partition("/")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", claim):
        raise BadInputError(f"bad --storage-uri '{uri}': '{claim}' is not a PersistentVolumeClaim name (lowercase letters, digits, '-', '.')")
    return claim, path


def storage_uri_under(output_uri: str, options: PackageOptions) -> str:
    """The storage URI of a KServe bundle uploaded to `output_uri` (`package -o s3://…`): the server
    bundle's folder inside it, which is what the predictor downloads."""
    return f"{output_uri.rstrip('/')}/{server(options.server).bundle_dir}"


def inference_service(options: PackageOptions, model_name: str, gpu: bool) -> dict:
    s = server(options.server)
    name = k8s_name(model_name)
    base = (options.storage_uri or f"pvc://modelport-models/{name}").rstrip("/")
    uri = f"{base}/{model_name}" if s.name in ("tfserving", "ovms") else base  # the runtime wants the model's version folders
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
            **scaling(options, gpu),
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
    """KServe's TorchServe runtime reads `config/config.properties` under the storage URI.

    In that runtime KServe's wrapper takes the requests (port 8080) and calls TorchServe's
    inference and management APIs inside the pod, without a token, so every TorchServe API is
    bound to 127.0.0.1 and token authorisation is off: nothing outside the pod reaches TorchServe,
    and access control is KServe's (its ingress), as for the other runtimes.
    """
    cfg = folder / "config" / "config.properties"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text("\n".join([
        "inference_address=http://127.0.0.1:8085", "management_address=http://127.0.0.1:8081",
        "metrics_address=http://127.0.0.1:8082", "grpc_inference_port=7070", "grpc_management_port=7071",
        "enable_metrics_api=true", "metrics_format=prometheus", "install_py_dep_per_model=true",
        "disable_token_authorization=true", "enable_model_api=false", "model_store=/mnt/models/model-store",
        "load_models=all", "",
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
    pvc = pvc_claim(doc["spec"]["predictor"]["model"]["storageUri"])
    if pvc:
        bundle_bytes = sum(p.stat().st_size for p in (out_dir / s.bundle_dir).rglob("*") if p.is_file())
        files.append(write_yaml(out_dir / "pvc.yaml", pvc_manifest(pvc[0], bundle_bytes, options.namespace)))
    readme = out_dir / "README.md"
    readme.write_text(_readme(model_name, doc, s.bundle_dir, s.name, pvc))
    files.append(readme)
    return Bundle(NAME, out_dir, files, {"model_name": model_name, "server": s.name, "gpu": gpu,
                                         "storage_uri": doc["spec"]["predictor"]["model"]["storageUri"],
                                         "server_bundle": s.bundle_dir})


def _upload(bundle_dir: str, uri: str, pvc: tuple[str, str] | None, namespace: str | None) -> str:
    """How the bundle reaches its storage: for a PVC, the claim (pvc.yaml) and a copy through a helper pod."""
    if not pvc:
        return f"Upload the contents of `{bundle_dir}/` to the storage the InferenceService points at\n(`{uri}`), then:\n\n```sh\n"
    claim, path = pvc
    ns = f" -n {namespace}" if namespace else ""
    overrides = ('{"spec":{"volumes":[{"name":"m","persistentVolumeClaim":{"claimName":"' + claim + '"}}],'
                 '"containers":[{"name":"copy","image":"busybox","command":["sleep","3600"],'
                 '"volumeMounts":[{"name":"m","mountPath":"/mnt/models"}]}]}}')
    return (f"The InferenceService reads the bundle from the PersistentVolumeClaim `{claim}` (`{uri}`).\n"
            f"`pvc.yaml` creates that claim (ReadWriteOnce, the cluster's default storage class; edit it, or\n"
            f"point `--storage-uri` at a claim or bucket you already have). Create it, copy the contents of\n"
            f"`{bundle_dir}/` into `{path or '.'}` on it through a helper pod, then apply the InferenceService:\n\n"
            f"```sh\nkubectl apply -f pvc.yaml\n"
            f"kubectl run modelport-copy{ns} --image=busybox --restart=Never --overrides='{overrides}'\n"
            f"kubectl wait{ns} --for=condition=Ready pod/modelport-copy\n"
            f"kubectl exec{ns} modelport-copy -- mkdir -p /mnt/models/{path}\n"
            f"kubectl cp{ns} {bundle_dir}/. modelport-copy:/mnt/models/{path}\n"
            f"kubectl delete pod{ns} modelport-copy\n")


def _readme(model_name: str, doc: dict, bundle_dir: str, server_name: str, pvc: tuple[str, str] | None = None) -> str:
    name = doc["metadata"]["name"]
    uri = doc["spec"]["predictor"]["model"]["storageUri"]
    path = {"triton": f"/v2/models/{model_name}/infer", "torchserve": f"/v1/models/{model_name}:predict",
            "tfserving": f"/v1/models/{model_name}:predict", "ovms": f"/v2/models/{model_name}/infer"}[server_name]
    predictor = doc["spec"]["predictor"]
    scale = (f"{predictor['minReplicas']}..{predictor['maxReplicas']} replicas on {predictor['scaleMetric']} "
             f"(target {predictor['scaleTarget']})" if "scaleMetric" in predictor else f"{predictor['minReplicas']} replica(s), fixed")
    note = ("\nA GPU predictor scales on concurrency (requests in flight per pod), which KServe's serverless\n"
            "mode provides; in RawDeployment mode pass `--replicas N` for a fixed scale instead.\n"
            if predictor.get("scaleMetric") == "concurrency" else "")
    if server_name == "ovms":
        note += ("\nUpstream KServe ships no OpenVINO Model Server runtime: `kserve-ovms` is the ServingRuntime OpenShift AI\n"
                 "provides (OVMS reading `<storageUri>/<version>/model.xml`); on plain KServe install an OVMS ServingRuntime\n"
                 "under that name, or use the k8s bundle, which runs the OVMS image with this bundle's config.json.\n")
    if server_name == "torchserve":
        note += ("\nInside the pod, KServe's wrapper calls TorchServe on 127.0.0.1 only (inference, management and\n"
                 "metrics are bound there; registering models is off), without a token: TorchServe's token check is\n"
                 "off in `config/config.properties`, and access control is KServe's (its ingress).\n")
    return f"""# KServe bundle: {model_name} ({server_name})

Scaling: {scale}.

{_upload(bundle_dir, uri, pvc, doc["metadata"].get("namespace"))}kubectl apply -f inferenceservice.yaml
kubectl wait --for=condition=Ready inferenceservice/{name} --timeout=300s
URL=$(kubectl get inferenceservice {name} -o jsonpath='{{.status.url}}')
curl -s -X POST "$URL{path}" -H 'Content-Type: application/json' -d @{bundle_dir}/{model_name}.request.json
```
{note}"""
