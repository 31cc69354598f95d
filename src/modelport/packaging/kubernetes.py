"""Kubernetes bundle: the chosen server's bundle, a Dockerfile baking it into the server image, and
`k8s/` manifests (Deployment, Service, HorizontalPodAutoscaler).

The autoscaler follows CPU utilisation, or with `--scale-on pending-requests` the server's own
queue: Triton's `nv_inference_pending_request_count` per pod (requests received and not yet
answered), averaged to `--target-pending`. That metric reaches the autoscaler through the
cluster's Prometheus and prometheus-adapter: the pods carry Prometheus' scrape annotations for the
metrics port, and `k8s/prometheus-adapter-rules.yaml` holds the adapter rule (a ConfigMap to merge
into the adapter's). A queue also says when a GPU server is saturated, so a GPU deployment can be
autoscaled on it (never on CPU).

Probes hit the server's own health endpoints (Triton `/v2/health/ready|live`, TorchServe `/ping`,
TF Serving `/v1/models/<name>`); containers request CPU and memory and, when the artifact needs a
GPU (a TensorRT plan, or `--device gpu`), limit `nvidia.com/gpu`.
"""

from __future__ import annotations

import re
from pathlib import Path

from modelport.errors import BadInputError
from modelport.packaging import Bundle, PackageOptions, get_packager
from modelport.packaging.bundle import Artifacts
from modelport.packaging.docker import server, write_dockerfile

NAME = "k8s"
DESCRIPTION = "Dockerfile + Kubernetes Deployment, Service and HorizontalPodAutoscaler around a server bundle"


def k8s_name(text: str) -> str:
    """A DNS-1123 label: lowercase letters, digits and '-', at most 63 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return name if name and name[0].isalpha() else f"m-{name}"[:63]


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_name(text: str, flag: str, *, subdomain: bool = False) -> str:
    """`text` when it is a Kubernetes name (a DNS-1123 label, or subdomain), else exit 2 naming `flag`."""
    pattern = _DNS_SUBDOMAIN if subdomain else _DNS_LABEL
    if not isinstance(text, str) or pattern.fullmatch(text) is None:
        kind = "DNS-1123 subdomain" if subdomain else "DNS-1123 label (at most 63 characters)"
        raise BadInputError(f"bad {flag} {text!r}: a Kubernetes name is a {kind} of lowercase letters, digits and '-'")
    return text


def server_bundle(artifacts: Artifacts, out_dir: Path, options: PackageOptions) -> Bundle:
    """The chosen server's bundle, written into the folder the Dockerfile copies.

    A TensorRT build plan without its engine is refused: the image would start a server with no model.
    """
    bundle = get_packager(options.server).package(artifacts, out_dir / server(options.server).bundle_dir, options)
    if str(bundle.details.get("engine", "")).startswith("not built"):
        raise BadInputError("the TensorRT engine is not built (a --plan-only conversion): a container needs model.plan",
                            path=artifacts.source,
                            hint="build it on a GPU (tensorrt/build_engine.py) and convert again, or package --backend onnx")
    return bundle


def needs_gpu(bundle: Bundle, options: PackageOptions) -> bool:
    return bool(bundle.details.get("gpu")) or options.device == "gpu"


def _probe(path: str, port: str, *, initial: int, period: int, command: tuple[str, ...] | None = None) -> dict:
    """An HTTP probe on the server's health endpoint, or a command in the container where that endpoint needs a key."""
    check = {"exec": {"command": list(command)}} if command else {"httpGet": {"path": path, "port": port}}
    return {**check, "initialDelaySeconds": initial, "periodSeconds": period, "timeoutSeconds": 5, "failureThreshold": 6}


def container(options: PackageOptions, model_name: str, image: str, gpu: bool) -> dict:
    s = server(options.server)
    resources: dict = {"requests": {"cpu": options.cpu, "memory": options.memory}, "limits": {"memory": options.memory}}
    if gpu:
        resources["limits"]["nvidia.com/gpu"] = options.gpus or 1
    return {
        "name": s.name,
        "image": image,
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in s.ports.items()],
        "readinessProbe": _probe(s.readiness.format(name=model_name), s.http_port, initial=10, period=5, command=s.probe_exec),
        "livenessProbe": _probe(s.liveness.format(name=model_name), s.http_port, initial=30, period=15, command=s.probe_exec),
        "resources": resources,
    }


def autoscaled(options: PackageOptions, gpu: bool) -> bool:
    """Whether the Deployment gets a CPU-based HorizontalPodAutoscaler (then the Deployment names no replicas).

    A fixed `--replicas` asks for none. A GPU server is not scaled on CPU: its CPU stays low while the
    GPU saturates, so a CPU target would never add a pod. Autoscaling one needs a GPU or request-rate
    metric from the cluster's metrics adapter, which the bundle's README describes; asking for an
    autoscaling range on a GPU deployment is refused rather than written as a CPU HPA. A server whose
    client keys differ per pod (TorchServe) runs one pod unless a range is asked for explicitly: a
    key opens only the pod that made it.
    """
    from modelport.errors import BadInputError

    if options.scale_on == "pending-requests":
        if server(options.server).pending_metric is None:
            raise BadInputError(f"--scale-on pending-requests: the {options.server} server exports no pending-requests metric "
                                "(Triton's does: --server triton)")
        return options.replicas is None
    if gpu and options.autoscaling_asked:
        raise BadInputError("--min-replicas/--max-replicas: a GPU deployment is not autoscaled on CPU",
                            hint="pass --replicas N, or --scale-on pending-requests (the server's queue)")
    if server(options.server).keys_per_pod and not options.autoscaling_asked:
        return False
    return options.replicas is None and not gpu


def manifests(options: PackageOptions, model_name: str, image: str, gpu: bool) -> dict[str, dict]:
    """The Deployment, Service and (CPU deployments without a fixed --replicas) HorizontalPodAutoscaler, as plain dicts.

    Under an autoscaler the Deployment leaves `replicas` out: the HPA owns the scale, and a
    `replicas` in the manifest would reset it at every `kubectl apply`.
    """
    s = server(options.server)
    hpa_on = autoscaled(options, gpu)
    app = k8s_name(f"{model_name}-{s.name}")
    labels = {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "modelport"}
    meta = {"name": app, "labels": labels}
    if options.namespace:
        meta["namespace"] = options.namespace
    on_queue = hpa_on and options.scale_on == "pending-requests"
    template_meta: dict = {"labels": labels}
    if on_queue:  # Prometheus scrapes the server's metrics port; the adapter serves the metric to the HPA
        template_meta["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/port": str(s.ports["metrics"]),
                                        "prometheus.io/path": "/metrics"}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {
            **({} if hpa_on else {"replicas": options.replicas or 1}),
            "selector": {"matchLabels": labels},
            "template": {"metadata": template_meta,
                         "spec": {"containers": [container(options, model_name, image, gpu)]}},
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": meta,
        "spec": {"selector": labels, "type": "ClusterIP",
                 "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in s.ports.items()]},
    }
    docs = {"deployment.yaml": deployment, "service.yaml": service}
    if hpa_on:
        low, high = options.autoscale_range
        metric = ({"type": "Pods", "pods": {"metric": {"name": s.pending_metric},
                                            "target": {"type": "AverageValue", "averageValue": str(options.target_pending)}}}
                  if on_queue else
                  {"type": "Resource", "resource": {"name": "cpu", "target": {
                      "type": "Utilization", "averageUtilization": options.target_cpu_utilization}}})
        docs["hpa.yaml"] = {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta,
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": app},
                     "minReplicas": low, "maxReplicas": high, "metrics": [metric]},
        }
    if on_queue:
        docs["prometheus-adapter-rules.yaml"] = adapter_rules(s.pending_metric, options.namespace)
    return docs


def adapter_rules(metric: str, namespace: str | None) -> dict:
    """A ConfigMap with the prometheus-adapter rule that serves `metric` per pod to the HPA (merge
    its `config.yaml` into the adapter's own rules)."""
    import yaml

    rule = {"seriesQuery": f'{metric}{{namespace!="",pod!=""}}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
            "name": {"matches": f"^{metric}$", "as": metric},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"}
    meta: dict = {"name": "modelport-adapter-rules", "labels": {"app.kubernetes.io/part-of": "modelport"}}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {"config.yaml": yaml.safe_dump({"rules": [rule]}, sort_keys=False)}}


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


def _scaling_note(options: PackageOptions, docs: dict, gpu: bool) -> str:
    if "hpa.yaml" in docs and options.scale_on == "pending-requests":
        spec = docs["hpa.yaml"]["spec"]
        metric = spec["metrics"][0]["pods"]["metric"]["name"]
        return (f"a HorizontalPodAutoscaler ({spec['minReplicas']}..{spec['maxReplicas']} replicas) keeps `{metric}`,\n"
                f"the requests each pod holds and has not answered, at {options.target_pending} per pod on average. The\n"
                "metric reaches it through Prometheus (the pods carry its scrape annotations) and prometheus-adapter:\n"
                "merge `k8s/prometheus-adapter-rules.yaml`'s `config.yaml` into the adapter's rules, then check\n"
                f"`kubectl get --raw /apis/custom.metrics.k8s.io/v1beta1/namespaces/<ns>/pods/*/{metric}`.")
    if "hpa.yaml" in docs:
        spec = docs["hpa.yaml"]["spec"]
        return (f"a HorizontalPodAutoscaler ({spec['minReplicas']}..{spec['maxReplicas']} replicas at "
                f"{options.target_cpu_utilization}% CPU) owns the scale: the Deployment names no `replicas`, so\n"
                "`kubectl apply` never resets what the autoscaler chose.")
    replicas = docs["deployment.yaml"]["spec"]["replicas"]
    if not gpu and server(options.server).keys_per_pod and options.replicas is None:
        return ("one replica and no autoscaler: each TorchServe pod makes its own keys (below), so pods behind\n"
                "one Service do not share them. `--min-replicas`/`--max-replicas` add a CPU autoscaler anyway.")
    if not gpu:
        return f"a fixed scale of {replicas} replica(s) (`--replicas`); no autoscaler."
    return (f"a fixed scale of {replicas} replica(s) and no autoscaler. A GPU server is not scaled on CPU\n"
            "(its CPU stays low while the GPU saturates). To autoscale it, expose a GPU or request metric\n"
            "through your metrics adapter (e.g. NVIDIA's DCGM exporter with prometheus-adapter, giving\n"
            "`DCGM_FI_DEV_GPU_UTIL` per pod) and add an `autoscaling/v2` HorizontalPodAutoscaler with a\n"
            "`Pods` metric on it; then remove `replicas` from `k8s/deployment.yaml`.")


def _key_note(s, svc: str) -> tuple[str, str]:
    """For servers whose every call needs a key (TorchServe): how to read it, and the README paragraph."""
    if not s.probe_exec:
        return "", ""
    fetch = (f"KEY=$(kubectl exec $POD -- python -c \"import json; "
             f"print(json.load(open('{s.workdir}/key_file.json'))['inference']['key'])\")\n")
    note = (f"\nOnly the inference port ({s.ports[s.http_port]}) is exposed; TorchServe's management and metrics APIs\n"
            "listen on 127.0.0.1 inside the pod, and token authorisation is on: every call, `/ping` included,\n"
            f"needs `Authorization: Bearer <inference key>`. TorchServe writes the keys into `{s.workdir}/key_file.json`\n"
            "when it starts (the probes read it there). Each pod generates its own keys at start, so a key\n"
            "opens the pod it came from only: behind a Service with several replicas, clients need a key per\n"
            "pod, or run one replica (`--replicas 1`), or put authentication in front (ingress or mesh) and\n"
            "disable TorchServe's token check yourself, knowing that the inference port is then open to the cluster.\n")
    return fetch, note


def _readme(model_name: str, options: PackageOptions, image: str, docs: dict, inner: Bundle) -> str:
    s = server(options.server)
    svc = docs["service.yaml"]["metadata"]["name"]
    port = s.ports[s.http_port]
    gpu = bool(inner.details.get("gpu")) or options.device == "gpu"
    fetch, key_note = _key_note(s, svc)
    forward = f"kubectl port-forward service/{svc} {port}:{port} &"
    if fetch:  # the key and the requests must concern the same pod
        forward = (f"POD=$(kubectl get pod -l app.kubernetes.io/name={svc} -o jsonpath='{{.items[0].metadata.name}}')\n"
                   f"kubectl port-forward pod/$POD {port}:{port} &")
    call = {
        "triton": f"curl -s -X POST localhost:{port}/v2/models/{model_name}/infer -d @{s.bundle_dir}/{model_name}.request.json",
        "torchserve": (f"curl -s -X POST localhost:{port}/predictions/{model_name} -H \"Authorization: Bearer $KEY\" "
                       f"-d @{s.bundle_dir}/{model_name}.request.json"),
        "tfserving": f"curl -s -X POST localhost:{port}/v1/models/{model_name}:predict -d @{s.bundle_dir}/{model_name}.request.json",
        "ovms": f"curl -s -X POST localhost:{port}/v2/models/{model_name}/infer -d @{s.bundle_dir}/{model_name}.request.json",
    }[s.name]
    return f"""# Kubernetes bundle: {model_name} on {s.name}

`{s.bundle_dir}/` is the {s.name} bundle; `Dockerfile` bakes it into `{image}`; `k8s/` holds the
Deployment (probes on the server's health endpoints) and the Service. Scaling: {_scaling_note(options, docs, gpu)}

```sh
docker build -t {image} .
docker push {image}            # or load it into your cluster (kind load docker-image {image})
kubectl apply -f k8s/
kubectl rollout status deployment/{svc}
{forward}
{fetch}{call}
```
{key_note}"""
