"""`modelport package ARTIFACT_OR_OUT_DIR --for triton|torchserve|tfserving|k8s|kserve -o DIR`."""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import choice, console, run, split_list, stage_status
from modelport.registry import PACKAGERS


def parse_sizes(text: str | None) -> list[int]:
    from modelport.errors import BadInputError

    if not text:
        return []
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BadInputError(f"bad --preferred-batch '{text}': comma-separated integers, e.g. 4,8") from None


def render_package(report: dict) -> None:
    from rich.table import Table

    t = Table(title="bundles", title_justify="left")
    for col in ("system", "path", "model", "files", "details"):
        t.add_column(col)
    for b in report.get("bundles", []):
        details = ", ".join(f"{k}={b[k]}" for k in ("version", "platform", "runtime", "max_batch_size", "server", "image", "gpu") if k in b)
        t.add_row(b["system"], b["path"], str(b.get("model_name", "")), str(len(b["files"])), details)
    console.print(t)
    up = report.get("upload")  # -o s3://…: the bundle paths above are inside the uploaded prefix
    if up:
        console.print(f"uploaded {up['objects']} objects ({up['bytes']} bytes) to {up['uri']}, manifest last: {up['manifest']}",
                      markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    @app.command("package")
    def package_cmd(
        source: str = typer.Argument(..., help="A 'modelport convert' output folder, an .onnx file, or a SavedModel folder."),
        systems: flags.Systems = ...,
        output: flags.OutputDir = ...,
        name: str | None = typer.Option(None, "--name", help="Model name in the server (default: the source's name)."),
        version: int | None = typer.Option(None, "--version", help="Model version (default 1, or the next with --add-version)."),
        add_version: bool = typer.Option(False, "--add-version", help="Add a version to an existing Triton/TF Serving bundle."),
        backend: str | None = typer.Option(None, "--backend", help="Triton backend: onnx, tensorrt, savedmodel, torchscript, openvino."),
        runtime: str | None = typer.Option(None, "--runtime", help="TorchServe handler: onnxruntime or torch (default: torch when the PyTorch code is there)."),
        trust: bool = typer.Option(False, "--trust", help="Triton torchscript: allow importing the emitted model.py to trace it."),
        max_batch: int = typer.Option(8, "--max-batch", help="Triton max_batch_size when the contract has a batch axis (0: off)."),
        preferred_batch: str | None = typer.Option(None, "--preferred-batch", help="Triton preferred batch sizes, e.g. 4,8."),
        queue_delay_us: int = typer.Option(100, "--queue-delay-us", help="Triton dynamic-batching queue delay (microseconds)."),
        no_dynamic_batching: bool = typer.Option(False, "--no-dynamic-batching", help="Leave Triton's dynamic batcher off."),
        instances: int = typer.Option(1, "--instances", help="Model instances (Triton) or workers (TorchServe)."),
        device: str = typer.Option("cpu", "--device", help="cpu or gpu."),
        trt_accel: bool = typer.Option(False, "--trt-accel", help="Triton: TensorRT acceleration for ONNX on GPU."),
        postprocess: str = typer.Option("none", "--postprocess", help="TorchServe handler: none, softmax or topk=K."),
        no_preprocess: bool = typer.Option(False, "--no-preprocess", help="TorchServe handler: don't apply the contract's preprocessing."),
        server: str = typer.Option("triton", "--server", help="k8s/kserve: the server inside: triton, torchserve, tfserving, ovms."),
        image: str | None = typer.Option(None, "--image", help="k8s: the image name the manifests use."),
        replicas: int | None = typer.Option(None, "--replicas", help="k8s/KServe: a fixed number of replicas (no autoscaler)."),
        min_replicas: int | None = typer.Option(None, "--min-replicas", help="Autoscaling minimum (default 1)."),
        max_replicas: int | None = typer.Option(None, "--max-replicas", help="Autoscaling maximum (default 4)."),
        scale_on: str = typer.Option("cpu", "--scale-on", help="k8s autoscaler: cpu, or pending-requests (the server's queue; Triton)."),
        target_pending: int = typer.Option(4, "--target-pending", help="--scale-on pending-requests: requests per pod to keep."),
        cpu: str = typer.Option("1", "--cpu", help="CPU request per pod, e.g. 500m or 2."),
        memory: str = typer.Option("2Gi", "--memory", help="Memory request and limit per pod."),
        gpus: int | None = typer.Option(None, "--gpus", help="GPUs per pod when a GPU is needed (default 1)."),
        namespace: str | None = typer.Option(None, "--namespace", help="Kubernetes namespace of the manifests."),
        storage_uri: str | None = typer.Option(None, "--storage-uri", help="KServe: where the bundle is uploaded (s3://, gs://, pvc://)."),
        force: flags.Force = False,
        json_out: flags.JsonOut = False,
        quiet: flags.Quiet = False,
    ):
        """Package converted artifacts as bundles a model server loads as they are."""

        def body():
            from modelport.orchestration.package import package
            from modelport.packaging import PackageOptions
            from modelport.packaging.torchserve import RUNTIMES
            from modelport.packaging.triton import BACKENDS

            names = [choice(s, PACKAGERS, "serving system") for s in split_list(systems)]
            options = PackageOptions(
                model_name=name, version=version, add_version=add_version, force=force, backend=choice(backend, BACKENDS, "Triton backend"),
                runtime=choice(runtime, RUNTIMES, "TorchServe runtime"), trust=trust,
                max_batch_size=max_batch, preferred_batch_sizes=parse_sizes(preferred_batch), queue_delay_us=queue_delay_us,
                dynamic_batching=not no_dynamic_batching, instances=instances, device=device, trt_acceleration=trt_accel,
                postprocess=postprocess, preprocess=not no_preprocess, server=server, image=image, replicas=replicas,
                min_replicas=min_replicas, max_replicas=max_replicas, cpu=cpu, memory=memory, gpus=gpus, namespace=namespace,
                storage_uri=storage_uri, scale_on=scale_on, target_pending=target_pending,
            )
            with stage_status(quiet or json_out) as on_stage:
                return package(source, output, names, options, on_stage=on_stage)

        run(body, command="package", json_out=json_out, quiet=quiet, render=render_package)
