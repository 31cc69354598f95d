"""`modelport serve PATH --http-port N --grpc-port M`: the artifact on the Open Inference Protocol."""

from __future__ import annotations

import typer

from modelport.cli._common import console, run

PANEL = "Server"
SCALE = "Scale-out (Ray Serve)"


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        path: str = typer.Argument(..., help="A 'modelport convert' output folder, a model file, or a repository folder "
                                                 "(Triton's layout: NAME/config.pbtxt, NAME/<version>/)."),
        http_port: int = typer.Option(8000, "--http-port", help="HTTP port (KServe v2 REST: /v2/health/ready, /v2/models/NAME/infer).", rich_help_panel=PANEL),
        grpc_port: int = typer.Option(8001, "--grpc-port", help="gRPC port (KServe v2 GRPCInferenceService).", rich_help_panel=PANEL),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (0.0.0.0: every interface).", rich_help_panel=PANEL),
        artifact: str | None = typer.Option(None, "--artifact", help="Which artifact of a convert folder (a target: onnx, openvino, tflite, ...).", rich_help_panel=PANEL),
        name: str | None = typer.Option(None, "--name", help="Model name in the server (default: the folder's or file's name).", rich_help_panel=PANEL),
        max_batch_size: int = typer.Option(0, "--max-batch-size", help="Dynamic batching: rows run together (0: off; needs a dynamic batch dim).", rich_help_panel=PANEL),
        max_queue_delay_ms: float = typer.Option(2.0, "--max-queue-delay-ms", help="Dynamic batching: the longest a request waits for others.", rich_help_panel=PANEL),
        max_request_bytes: int = typer.Option(64 << 20, "--max-request-bytes", help="Larger request bodies are refused (413).", rich_help_panel=PANEL),
        threads: int | None = typer.Option(None, "--threads", help="The runtime's intra-op threads (default with --workers N: the cores / N).", rich_help_panel=PANEL),
        workers: int = typer.Option(1, "--workers", help="Server processes sharing the ports, each with its own runner; one that dies is replaced.", rich_help_panel=PANEL),
        access_log: bool = typer.Option(False, "--access-log", help="Log one line per REST request.", rich_help_panel=PANEL),
        model_control: str = typer.Option("none", "--model-control", help="A repository: none (load all at start), poll "
                                          "(rescan every --poll-seconds) or explicit (load and unload calls).", rich_help_panel=PANEL),
        poll_seconds: float = typer.Option(5.0, "--poll-seconds", help="--model-control poll: seconds between rescans.",
                                           rich_help_panel=PANEL),
        rollout: str = typer.Option("direct", "--rollout", help="A repository's new version: direct (after its own check) or "
                                    "parity (after it gives the serving version's answers).", rich_help_panel=PANEL),
        max_memory: str | None = typer.Option(None, "--max-memory", help="A repository: the server's memory bound (e.g. 4G); "
                                              "models load on their first request and the least recently used is unloaded to fit.",
                                              rich_help_panel=PANEL),
        shadow: int = typer.Option(0, "--shadow", help="--rollout parity: live requests mirrored to the new version before it "
                                   "switches in.", rich_help_panel=PANEL),
        replicas: int = typer.Option(1, "--replicas", help="Replicas on Ray Serve behind the one front end (1: in-process).",
                                     rich_help_panel=SCALE),
        min_replicas: int | None = typer.Option(None, "--min-replicas", help="Autoscaling minimum (with --max-replicas).",
                                                rich_help_panel=SCALE),
        max_replicas: int | None = typer.Option(None, "--max-replicas", help="Autoscaling maximum: Ray Serve scales on ongoing requests.",
                                                rich_help_panel=SCALE),
        address: str | None = typer.Option(None, "--address", help="An existing Ray cluster (default: a local one on 127.0.0.1).",
                                           rich_help_panel=SCALE),
    ):
        """Serve an artifact on KServe v2 (HTTP and gRPC; Triton's clients speak it), checked against its reference first."""

        def body():
            from modelport.errors import BadInputError
            from modelport.orchestration.serve import serve
            from modelport.serving.ray_serve import Scale
            from modelport.serving.v2.server import ServeOptions

            for flag, port in (("--http-port", http_port), ("--grpc-port", grpc_port)):
                if not 0 < port < 65536:
                    raise BadInputError(f"{flag} {port}: a port is 1..65535")
            if model_control not in ("none", "poll", "explicit"):
                raise BadInputError(f"unknown --model-control '{model_control}'; known: none, poll, explicit")
            bound = None
            if max_memory is not None:
                from modelport.run.memory import parse_size

                try:
                    bound = parse_size(max_memory)
                except ValueError as e:
                    raise BadInputError(f"--max-memory: {e}") from None
            if rollout not in ("direct", "parity"):
                raise BadInputError(f"unknown --rollout '{rollout}'; known: direct, parity")
            if poll_seconds <= 0:
                raise BadInputError(f"--poll-seconds {poll_seconds}: must be positive")
            if workers < 1:
                raise BadInputError(f"--workers {workers}: at least 1")
            if http_port == grpc_port:
                raise BadInputError(f"--http-port and --grpc-port are both {http_port}")
            options = ServeOptions(host=host, http_port=http_port, grpc_port=grpc_port, max_request_bytes=max_request_bytes,
                                   max_batch_size=max_batch_size, max_queue_delay_ms=max_queue_delay_ms, workers=workers,
                                   access_log=access_log, model_control=model_control, poll_seconds=poll_seconds,
                                   rollout=rollout, shadow=shadow, max_memory=bound)

            def ready(served, model):
                if served is None:  # a repository: the versions that loaded
                    console.print(f"serving the repository {path} on http://{host}:{http_port} and grpc {host}:{grpc_port}: {model}",
                                  soft_wrap=True, markup=False)
                    return
                checked = served.checked
                note = (f"answers checked against the reference sample (max abs {checked['max_abs']:.3g})" if checked["checked"]
                        else f"answers not checked: {checked['reason']}")
                many = f" by {workers} workers" if workers > 1 else ""
                console.print(f"serving {served.path} as '{model}' on http://{host}:{http_port} and grpc {host}:{grpc_port}{many}; {note}",
                              soft_wrap=True, markup=False)

            scale = Scale(replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas, address=address)
            scale.deployment_options()  # bad bounds are exit 2 before anything starts
            serve(path, options, artifact=artifact, name=name, threads=threads, scale=scale, on_ready=ready)

        run(body, command="serve", json_out=False, quiet=False)
