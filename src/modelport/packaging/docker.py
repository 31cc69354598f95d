"""Server images, ports, health endpoints and the Dockerfile that bakes a bundle into an image.

One table per server, used by the Dockerfile, the Kubernetes manifests and the KServe resource
alike, so a port or a probe path is written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Server:
    name: str
    image_cpu: str
    image_gpu: str
    bundle_dir: str  # where the server's bundle sits inside a container bundle folder
    mount: str  # where the image expects it
    ports: dict[str, int]  # port name -> container port
    http_port: str  # the name of the port probes and the Service's first port use
    readiness: str  # HTTP path; "{name}" is the model name
    liveness: str
    command: tuple[str, ...]
    kserve_format: str  # KServe modelFormat name
    kserve_runtime: str  # KServe ClusterServingRuntime
    kserve_protocol: str
    # a probe command run inside the container, for servers whose health endpoint needs a credential
    probe_exec: tuple[str, ...] | None = None
    workdir: str | None = None  # the working folder the server starts in (TorchServe writes key_file.json there)
    keys_per_pod: bool = False  # each server process makes its own client keys, so replicas do not share them
    pending_metric: str | None = None  # its Prometheus gauge of requests queued or in flight, when it has one


SERVERS: dict[str, Server] = {
    "triton": Server(
        name="triton", image_cpu="nvcr.io/nvidia/tritonserver:24.08-py3", image_gpu="nvcr.io/nvidia/tritonserver:24.08-py3",
        bundle_dir="model_repository", mount="/models",
        ports={"http": 8000, "grpc": 8001, "metrics": 8002}, http_port="http",
        readiness="/v2/health/ready", liveness="/v2/health/live",
        command=("tritonserver", "--model-repository=/models"),
        kserve_format="triton", kserve_runtime="kserve-tritonserver", kserve_protocol="v2",
        pending_metric="nv_inference_pending_request_count",
    ),
    # Only the inference port leaves the container: management and metrics listen on 127.0.0.1
    # (config.properties), and token authorisation stays on, so /ping needs the inference key too.
    "torchserve": Server(
        name="torchserve", image_cpu="pytorch/torchserve:0.12.0-cpu", image_gpu="pytorch/torchserve:0.12.0-gpu",
        bundle_dir="torchserve", mount="/home/model-server/bundle",
        ports={"http": 8080}, http_port="http",
        readiness="/ping", liveness="/ping",
        command=("torchserve", "--foreground", "--ncs",
                 "--model-store=/home/model-server/bundle/model-store",
                 "--ts-config=/home/model-server/bundle/config.properties", "--models=all"),
        kserve_format="pytorch", kserve_runtime="kserve-torchserve", kserve_protocol="v1",
        probe_exec=("python", "-c",
                    "import json, urllib.request as r; k = json.load(open('/home/model-server/key_file.json'))['inference']['key']; "
                    "r.urlopen(r.Request('http://127.0.0.1:8080/ping', headers={'Authorization': 'Bearer ' + k}), timeout=4)"),
        workdir="/home/model-server", keys_per_pod=True,
    ),
    "tfserving": Server(
        name="tfserving", image_cpu="tensorflow/serving:2.18.0", image_gpu="tensorflow/serving:2.18.0-gpu",
        bundle_dir="models", mount="/models",
        ports={"grpc": 8500, "http": 8501}, http_port="http",
        readiness="/v1/models/{name}", liveness="/v1/models/{name}",
        command=("tensorflow_model_server", "--port=8500", "--rest_api_port=8501",
                 "--model_config_file=/models/models.config"),
        kserve_format="tensorflow", kserve_runtime="kserve-tensorflow-serving", kserve_protocol="v1",
    ),
    # OpenVINO Model Server: KServe v2 REST on 8000, gRPC on 9000; the image's entrypoint is the server.
    # KServe has no built-in OVMS runtime: `kserve-ovms` is the ServingRuntime OpenShift AI ships
    # (and the bundle's README shows), serving the model's version folders under the storage URI.
    "ovms": Server(
        name="ovms", image_cpu="openvino/model_server:2025.2", image_gpu="openvino/model_server:2025.2-gpu",
        bundle_dir="ovms", mount="/models",
        ports={"http": 8000, "grpc": 9000}, http_port="http",
        readiness="/v2/models/{name}/ready", liveness="/v2/health/live",
        command=("/ovms/bin/ovms", "--config_path=/models/config.json", "--port=9000", "--rest_port=8000"),
        kserve_format="openvino_ir", kserve_runtime="kserve-ovms", kserve_protocol="v2",
    ),
}


def server(name: str) -> Server:
    return SERVERS[name]


def image_for(name: str, gpu: bool) -> str:
    s = SERVERS[name]
    return s.image_gpu if gpu else s.image_cpu


def dockerfile(name: str, *, gpu: bool, model_name: str) -> str:
    """A Dockerfile that copies the server's bundle into the server image and starts it."""
    s = SERVERS[name]
    exposed = " ".join(str(p) for p in s.ports.values())
    cmd = ", ".join(f'"{c}"' for c in s.command)
    health = s.readiness.format(name=model_name)
    lines = [
        f"# Serves '{model_name}' with {name}. Build: docker build -t {model_name}-{name} .",
        f"FROM {image_for(name, gpu)}",
        f"COPY {s.bundle_dir}/ {s.mount}/",
    ]
    if name == "torchserve":
        # the handler's own needs (onnxruntime or safetensors, numpy), installed at build time, not per model at start-up
        lines.insert(2, "USER root")
        lines.append(f"RUN python -m pip install --no-cache-dir -r {s.mount}/requirements.txt && chown -R model-server {s.mount}")
        lines.append("USER model-server")
    if s.workdir:
        lines.append(f"WORKDIR {s.workdir}")
    # Triton's image entrypoint runs the command it is given; the others' entrypoints add their own flags
    start = f"CMD [{cmd}]" if name == "triton" else f"ENTRYPOINT [{cmd}]"
    auth = f" with 'Authorization: Bearer <inference key of {s.workdir}/key_file.json>'" if s.probe_exec else ""
    lines += [f"EXPOSE {exposed}", f"# health: GET http://localhost:{s.ports[s.http_port]}{health}{auth}", start, ""]
    return "\n".join(lines)


def write_dockerfile(folder: Path, name: str, *, gpu: bool, model_name: str) -> Path:
    path = folder / "Dockerfile"
    path.write_text(dockerfile(name, gpu=gpu, model_name=model_name))
    return path
