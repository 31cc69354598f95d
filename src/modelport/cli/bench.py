"""`modelport bench ARTIFACT... | URL`: latency, throughput and memory of artifacts, or a load test of a served model."""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import fmt_size, print_rows, run, split_list, stage_status
from modelport.errors import BadInputError

PANEL_RUN = "Measurement"
PANEL_HTTP = "Served models (URL)"


def _ms(row: dict, key: str) -> str:
    lat = row.get("latency_ms") or {}
    return "-" if lat.get(key) is None else f"{lat[key]:.3f}"


def _rate(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def print_bench(doc: dict) -> None:
    if doc.get("target") == "http":
        columns = ["url", "protocol", "requests", "ok", "errors", "p50 ms", "p90 ms", "p99 ms", "mean ms", "min ms", "req/s"]
        protocol = f"{doc['protocol']}/{doc['wire']}" if doc.get("wire") and doc["protocol"] == "kserve" else doc["protocol"]
        row = [doc["url"], protocol, doc["requests"], doc["ok"], doc["errors"], *(_ms(doc, k) for k in ("p50", "p90", "p99", "mean", "min")),
               _rate(doc["throughput"])]
        print_rows("load test", columns, [row], right=tuple(columns[2:]))
        server = doc.get("server") or {}
        if "server_ms" in server:
            parts = ["server_ms", "queue_ms", "compute_input_ms", "compute_infer_ms", "compute_output_ms", "client_and_network_ms"]
            print_rows("mean ms per request, from the server's statistics", [p.removesuffix("_ms") for p in parts],
                       [[f"{server[p]:.3f}" if p in server else "-" for p in parts]], right=tuple(p.removesuffix("_ms") for p in parts))
        return
    columns = ["artifact", "runtime", "batch", "p50 ms", "p90 ms", "p99 ms", "mean ms", "min ms", "items/s", "vs 1st", "rss Δ"]
    rows = [[r["artifact"], r["runtime"], r["batch"], *(_ms(r, k) for k in ("p50", "p90", "p99", "mean", "min")), _rate(r["throughput"]),
             f"{r['speedup']:.2f}x" if r.get("speedup") else "-", fmt_size(r.get("rss_delta"))] for r in doc["results"]]
    print_rows("bench", columns, rows, right=tuple(columns[2:]))


def _warn_errors(doc: dict) -> None:
    from rich.markup import escape

    from modelport.cli._common import console

    if doc.get("errors"):
        console.print(f"[bold yellow]warning:[/] {doc['errors']} of {doc['requests']} requests failed; first: "
                      f"{escape(str(doc['first_error']))}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    @app.command("bench")
    @flags.taking(flags.SAMPLES, flags.RESULT)
    def bench_cmd(
        artifacts: list[str] = typer.Argument(..., help="Artifacts (.onnx, .ort, .tflite, .plan, .xml, an emitted pytorch/ folder), "
                                                        "measured interleaved, or one http://127.0.0.1:PORT/... URL of a served model."),
        runs: int | None = typer.Option(None, "--runs", "-n", help="Timed calls per artifact (default 50 unless --duration).",
                                        rich_help_panel=PANEL_RUN),
        duration: float | None = typer.Option(None, "--duration", help="Seconds to measure for (all artifacts together).",
                                              rich_help_panel=PANEL_RUN),
        warmup: int = typer.Option(5, "--warmup", help="Untimed calls per artifact first.", rich_help_panel=PANEL_RUN),
        batch: list[str] = typer.Option([], "--batch", "-b", help="Batch sizes to sweep, e.g. 1,8,32 (the symbolic dim at axis 0 "
                                                                  "of the first input).", rich_help_panel=PANEL_RUN),
        threads: int | None = typer.Option(None, "--threads", help="Intra-op threads of the runtime (default: its own).",
                                           rich_help_panel=PANEL_RUN),
        concurrency: int = typer.Option(1, "--concurrency", "-c", help="Requests in flight at once against one loaded model "
                                                                       "(or one server).", rich_help_panel=PANEL_RUN),
        runtime: str | None = typer.Option(None, "--runtime", help="Runner to load the artifacts with (default: the artifact's "
                                                                   "own, e.g. onnxruntime for .onnx).", rich_help_panel=PANEL_RUN),
        trust: flags.Trust = False,
        rate: float | None = typer.Option(None, "--rate", help="URL: requests per second to offer (default: as fast as "
                                                               "--concurrency allows).", rich_help_panel=PANEL_HTTP),
        requests: int | None = typer.Option(None, "--requests", help="URL: requests to send (default 100 unless --duration).",
                                            rich_help_panel=PANEL_HTTP),
        header: list[str] = typer.Option([], "--header", "-H", help="URL: 'Name: value' HTTP header, e.g. "
                                                                    "'Authorization: Bearer KEY' (repeatable).", rich_help_panel=PANEL_HTTP),
        allow_remote: bool = typer.Option(False, "--allow-remote", help="URL: allow a host other than 127.0.0.1/localhost.",
                                          rich_help_panel=PANEL_HTTP),
        protocol: str | None = typer.Option(None, "--protocol", help="URL (KServe v2): json, binary (the HTTP binary extension) or "
                                                                     "grpc (default: the fastest the server's metadata names).",
                                            rich_help_panel=PANEL_HTTP),
        grpc_address: str | None = typer.Option(None, "--grpc-address", help="URL: the server's gRPC HOST:PORT (default: the "
                                                                             "port its metadata names).", rich_help_panel=PANEL_HTTP),
        **shared,
    ):
        """Measure latency (p50/p90/p99, mean, min), throughput and memory of artifacts, or load-test a served model."""

        def body():
            from modelport.orchestration.load_test import is_url
            from modelport.resolve.specs import parse_dims

            try:
                batches = [int(b) for b in split_list(batch)] or None
            except ValueError:
                raise BadInputError(f"--batch takes sizes like 1,8,32, got {','.join(batch)!r}") from None
            urls = [a for a in artifacts if is_url(a)]
            if urls:
                if len(artifacts) > 1:
                    raise BadInputError("bench takes either artifacts or one URL, not both or several URLs")
                from modelport.orchestration.load_test import load_test
                from modelport.resolve.specs import parse_input_spec

                headers = {}
                for h in header:
                    name, sep, value = h.partition(":")
                    if not sep or not name.strip():
                        raise BadInputError(f"--header takes 'Name: value', got {h!r}")
                    headers[name.strip()] = value.strip()
                if batches and len(batches) > 1:
                    raise BadInputError("a URL takes one --batch size")
                return load_test(urls[0], specs=[parse_input_spec(t) for t in shared["inputs"]], data=shared["data"],
                                 values=shared["values"], dims=parse_dims(shared["dim"]), seed=shared["seed"],
                                 batch=batches[0] if batches else None, requests=requests, duration=duration,
                                 concurrency=concurrency, rate=rate, headers=headers, allow_remote=allow_remote, wire=protocol,
                                 grpc_address=grpc_address)
            if rate is not None or requests is not None or header or allow_remote or protocol or grpc_address:
                raise BadInputError("--rate, --requests, --header, --allow-remote, --protocol and --grpc-address are for a URL, "
                                    "not for artifacts")
            if shared["inputs"]:
                raise BadInputError("--input is for a URL; an artifact states its inputs (size their dims with --dim)")
            from modelport.orchestration.bench import bench

            with stage_status(shared["quiet"] or shared["json_out"]) as on_stage:
                return bench(artifacts, runs=runs, duration=duration, warmup=warmup, batches=batches, threads=threads,
                             concurrency=concurrency, runtime=runtime, data=shared["data"], values=shared["values"],
                             dims=parse_dims(shared["dim"]), seed=shared["seed"], trust=trust, on_stage=on_stage)

        run(body, command="bench", json_out=shared["json_out"], quiet=shared["quiet"], render=_warn_errors, print_result=print_bench)
