"""Ray Serve bundle: `serve_config.yaml` for `serve run` / `serve deploy`, and a KubeRay `RayService`.

The bundle holds the artifact (`model/`), the Serve config whose one application is
`modelport.serving.ray_app:build` (KServe's v2 REST endpoints on Ray Serve's proxy, the artifact in
`Replica` deployments: `--replicas N`, or `--min-replicas/--max-replicas` for Ray Serve's
autoscaler), a `RayService` manifest with the same config for KubeRay, and a Dockerfile for the
image it names (Ray's image plus modelport and the model). The config's `args.model` is the
artifact's path relative to the bundle (`serve run serve_config.yaml --working-dir .` from the
bundle ships it to the replicas); the RayService's is its path in the image, `/models/NAME/...`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from modelport.packaging import Bundle, PackageOptions
from modelport.packaging.bundle import Artifacts, served_name, unservable
from modelport.packaging.requests import v2_request, write_json_request
from modelport.runtimes import RUNNERS
from modelport.targets import TARGETS

NAME = "ray-serve"
RAY_VERSION = "2.60.0"
RAY_IMAGE = f"rayproject/ray:{RAY_VERSION}-py311-cpu"
HTTP_PORT = 8000


def _kind(artifacts: Artifacts) -> str:
    """The first artifact of the folder a modelport runner serves (the targets' order)."""

    for t in TARGETS.values():
        if t.runner and t.bench and t.suffixes and artifacts.has(t.name):
            return t.name
    raise unservable(artifacts, "Ray Serve", "an artifact modelport runs: ONNX, ORT, OpenVINO IR, TFLite, ExecuTorch")


def _place(artifacts: Artifacts, kind: str, folder: Path) -> tuple[Path, list[Path]]:
    """The artifact (with its external data or weights beside it) copied into `folder`."""
    folder.mkdir(parents=True)
    main = artifacts.get(kind, "the Ray Serve bundle")
    sources = artifacts.onnx_files() if kind == "onnx" else [main, *sorted(p for p in main.parent.glob(main.stem + ".*")
                                                                             if p != main and p.is_file() and kind == "openvino")]
    out = []
    for src in sources:
        dst = folder / src.relative_to(main.parent)
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copyfile)(src, dst)
        out.append(dst)
    return folder / main.name, out


def deployment_scale(options: PackageOptions) -> dict:
    if options.replicas is not None or not options.autoscaling_asked:
        return {"num_replicas": options.replicas or 1}
    low, high = options.autoscale_range
    return {"autoscaling_config": {"min_replicas": low, "max_replicas": high, "target_ongoing_requests": 2}}


def serve_config(name: str, model: str, runtime: str, artifacts: Artifacts, options: PackageOptions, host: str) -> dict:
    batch = options.max_batch_size if artifacts.batch_axis() and options.dynamic_batching else 0
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": host, "port": HTTP_PORT},
        "applications": [{
            "name": name,
            "route_prefix": "/",
            "import_path": "modelport.serving.ray_app:build",
            "args": {"model": model, "runtime": runtime, "name": name, "max_batch_size": batch,
                     "max_queue_delay_ms": options.queue_delay_us / 1000,
                     "contract": {"inputs": [s.to_dict() for s in artifacts.inputs], "outputs": [s.to_dict() for s in artifacts.outputs]}},
            "deployments": [{"name": "Replica", **deployment_scale(options)}, {"name": "V2Ingress", "num_replicas": 1}],
        }],
    }


def ray_service(name: str, config: dict, options: PackageOptions) -> dict:
    """KubeRay's RayService (ray.io/v1): a head that serves the config (its proxy on every interface
    of the pod, for the Service in front of it) and an autoscaled CPU worker group."""
    image = options.image or f"modelport-ray-{name}:latest"
    container = {"image": image, "resources": {"requests": {"cpu": options.cpu, "memory": options.memory},
                                               "limits": {"cpu": options.cpu, "memory": options.memory}}}
    return {
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": name.lower().replace("_", "-"), **({"namespace": options.namespace} if options.namespace else {})},
        "spec": {
            "serveConfigV2": yaml.safe_dump(config, sort_keys=False),
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,
                "headGroupSpec": {"rayStartParams": {"num-cpus": "0", "dashboard-host": "127.0.0.1"},
                                  "template": {"spec": {"containers": [{"name": "ray-head", **container,
                                                                         "ports": [{"containerPort": HTTP_PORT, "name": "serve"}]}]}}},
                "workerGroupSpecs": [{"groupName": "cpu", "replicas": 1, "minReplicas": 1,
                                      "maxReplicas": max(1, options.autoscale_range[1]), "rayStartParams": {},
                                      "template": {"spec": {"containers": [{"name": "ray-worker", **container}]}}}],
            },
        },
    }


def package(artifacts: Artifacts, out_dir: Path, options: PackageOptions) -> Bundle:

    name = served_name(artifacts, options)
    kind = _kind(artifacts)
    runtime = RUNNERS.canonical(TARGETS[kind].runtime)
    model, files = _place(artifacts, kind, out_dir / "model")
    local = serve_config(name, str(model.relative_to(out_dir)), runtime, artifacts, options, "127.0.0.1")
    (out_dir / "serve_config.yaml").write_text(yaml.safe_dump(local, sort_keys=False))
    in_image = f"/models/{name}/{model.name}"
    service = ray_service(name, serve_config(name, in_image, runtime, artifacts, options, "0.0.0.0"), options)
    (out_dir / "rayservice.yaml").write_text(yaml.safe_dump(service, sort_keys=False))
    (out_dir / "Dockerfile").write_text(
        f"FROM {RAY_IMAGE}\n"
        f"RUN pip install --no-cache-dir \"modelport[serve]\" && pip install --no-cache-dir --no-deps kserve==0.21.0\n"
        f"COPY model/ /models/{name}/\n")

    request = write_json_request(out_dir / f"{name}.request.json", artifacts, v2_request)
    readme = out_dir / "README.md"
    readme.write_text(
        f"# Ray Serve bundle: {name}\n\n"
        f"The {kind} artifact in `model/`, served on KServe v2 (HTTP) by Ray Serve:\n\n"
        f"```sh\nserve run serve_config.yaml --working-dir .    # from this folder: a local Ray, or --address of a cluster\n"
        f"curl -s http://127.0.0.1:{HTTP_PORT}/v2/health/ready\n"
        f"curl -s -X POST http://127.0.0.1:{HTTP_PORT}/v2/models/{name}/infer -H 'Content-Type: application/json' "
        f"-d @{request.name if request else 'request.json'}\n```\n\n"
        f"`serve_config.yaml` names the artifact relative to this folder, which `--working-dir .` ships to the replicas.\n"
        f"On Kubernetes (KubeRay): `docker build -t {options.image or f'modelport-ray-{name}:latest'} .`, push it, then "
        f"`kubectl apply -f rayservice.yaml`.\n")
    written = [*files, out_dir / "serve_config.yaml", out_dir / "rayservice.yaml", out_dir / "Dockerfile", readme,
               *([request] if request else [])]
    return Bundle(NAME, out_dir, written, {"model_name": name, "runtime": runtime, "artifact": kind,
                                           "replicas": deployment_scale(options), "server": "ray-serve"})
