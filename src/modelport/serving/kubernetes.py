"""Kubernetes bundle: the chosen server's bundle, a Dockerfile baking it into the server image, and
`k8s/` manifests (Deployment, Service, HorizontalPodAutoscaler).

Probes hit the server's own health endpoints (Triton `/v2/health/ready|live`, TorchServe `/ping`,
TF Serving `/v1/models/<name>`); containers request CPU and memory and, when the artifact needs a
GPU (a TensorRT plan, or `--device gpu`), limit `nvidia.com/gpu`.
"""

from __future__ import annotations

import re
from pathlib import Path

from modelport.serving import Bundle, PackageOptions, get_packager
from modelport.serving.bundle import Artifacts
from modelport.serving.docker import server, write_dockerfile

NAME = "k8s"
DESCRIPTION = "Dockerfile + Kubernetes Deployment, Service and HorizontalPodAutoscaler around a server bundle"


def k8s_name(text: str) -> str:
    """A DNS-1123 label: lowercase letters, digits and '-', at most 63 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return name if name and name[0].isalpha() else f"m-{name}"[:63]


def server_bundle(artifacts: Artifacts, out_dir: Path, options: PackageOptions) -> Bundle:
    """The chosen server's bundle, written into the folder the Dockerfile copies.

    A TensorRT build plan without its engine is refused: the image would start a server with no model.
    """
    from modelport.errors import BadInputError

    bundle = get_packager(options.server).package(artifacts, out_dir / server(options.server).bundle_dir, options)
    if str(bundle.details.get("engine", "")).startswith("not built"):
        raise BadInputError("the TensorRT engine is not built (a --plan-only conversion): a container needs model.plan",
                            path=artifacts.source,
                            hint="build it on a GPU (tensorrt/build_engine.py) and convert again, or package --backend onnx")
    return bundle


def needs_gpu(bundle: Bundle, options: PackageOptions) -> bool:
    return bool(bundle.details.get("gpu")) or options.device == "gpu"


def _probe(path: str, port: str, *, initial: int, period: int) -> dict:
    return {"httpGet": {"path": path, "port": port}, "initialDelaySeconds": initial, "periodSeconds": period,
            "timeoutSeconds": 5, "failureThreshold": 6}


def container(options: PackageOptions, model_name: str, image: str, gpu: bool) -> dict:
    s = server(options.server)
    resources: dict = {"requests": {"cpu": options.cpu, "memory": options.memory}, "limits": {"memory": options.memory}}
    if gpu:
        resources["limits"]["nvidia.com/gpu"] = options.gpus or 1
    return {
        "name": s.name,
        "image": image,
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in s.ports.items()],
        "readinessProbe": _probe(s.readiness.format(name=model_name), s.http_port, initial=10, period=5),
        "livenessProbe": _probe(s.liveness.format(name=model_name), s.http_port, initial=30, period=15),
        "resources": resources,
    }


def manifests(options: PackageOptions, model_name: str, image: str, gpu: bool) -> dict[str, dict]:
    """The Deployment, Service and HorizontalPodAutoscaler, as plain dicts."""
    s = server(options.server)
    app = k8s_name(f"{model_name}-{s.name}")
    labels = {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "modelport"}
    meta = {"name": app, "labels": labels}
    if options.namespace:
        meta["namespace"] = options.namespace
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                         "spec": {"containers": [container(options, model_name, image, gpu)]}},
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": meta,
        "spec": {"selector": labels, "type": "ClusterIP",
                 "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in s.ports.items()]},
    }
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": app},
            "minReplicas": options.min_replicas, "maxReplicas": options.max_replicas,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                "type": "Utilization", "averageUtilization": options.target_cpu_utilization}}}],
        },
    }
    return {"deployment.yaml": deployment, "service.yaml": service, "hpa.yaml": hpa}


def write_yaml(path: Path, doc: dict) -> Path:
    import yaml

    class _Plain(yaml.SafeDumper):
        def ignore_aliases(self, data):  # repeated label maps written out, not as &anchors
            return True

    path.write_text(yaml.dump(doc, Dumper=_Plain, sort_keys=False))
    return path


def package(artifacts: Artifacts, out_dir: Path, options: PackageOptions) -> Bundle:
    inner = server_bundle(artifacts, out_dir, options)
    model_name = inner.details["model_name"]
    gpu = needs_gpu(inner, options)
    s = server(options.server)
    image = options.image or f"{k8s_name(model_name)}-{s.name}:latest"
    files = list(inner.files)
    files.append(write_dockerfile(out_dir, options.server, gpu=gpu, model_name=model_name))
    k8s_dir = out_dir / "k8s"
    k8s_dir.mkdir(exist_ok=True)
    docs = manifests(options, model_name, image, gpu)
    files += [write_yaml(k8s_dir / fname, doc) for fname, doc in docs.items()]
    readme = out_dir / "README.md"
    readme.write_text(_readme(model_name, options, image, docs, inner))
    files.append(readme)
    return Bundle(NAME, out_dir, files, {"model_name": model_name, "server": s.name, "image": image, "gpu": gpu,
                                         "manifests": [f"k8s/{f}" for f in docs], "server_bundle": s.bundle_dir})


def _readme(model_name: str, options: PackageOptions, image: str, docs: dict, inner: Bundle) -> str:
    s = server(options.server)
    svc = docs["service.yaml"]["metadata"]["name"]
    port = s.ports[s.http_port]
    call = {
        "triton": f"curl -s -X POST localhost:{port}/v2/models/{model_name}/infer -d @{s.bundle_dir}/{model_name}.request.json",
        "torchserve": f"curl -s -X POST localhost:{port}/predictions/{model_name} -d @{s.bundle_dir}/{model_name}.request.json",
        "tfserving": f"curl -s -X POST localhost:{port}/v1/models/{model_name}:predict -d @{s.bundle_dir}/{model_name}.request.json",
    }[s.name]
    return f"""# Kubernetes bundle: {model_name} on {s.name}

`{s.bundle_dir}/` is the {s.name} bundle; `Dockerfile` bakes it into `{image}`; `k8s/` holds the
Deployment ({options.replicas} replica(s), probes on the server's health endpoints), the Service and a
HorizontalPodAutoscaler ({options.min_replicas}..{options.max_replicas} replicas at {options.target_cpu_utilization}% CPU).

```sh
docker build -t {image} .
docker push {image}            # or load it into your cluster (kind load docker-image {image})
kubectl apply -f k8s/
kubectl rollout status deployment/{svc}
kubectl port-forward service/{svc} {port}:{port} &
{call}
```
"""
