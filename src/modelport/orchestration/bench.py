"""`bench ARTIFACT...`: latency percentiles, throughput and memory of artifacts, measured interleaved.

Each artifact is opened by a runner of the `runtimes.RUNNERS` registry: the default one for its
kind (RUNTIME_FOR_KIND: `.onnx`/`.ort` onnxruntime, `.tflite` LiteRT, an emitted `pytorch/`
folder torch, `.plan` TensorRT, `.xml` OpenVINO), or the one `--runtime` names. Inputs come from
`--data` or the same deterministic sample generator `convert` uses, per batch size of the sweep:
the batch is the symbolic dim at axis 0 of the first input. Every artifact of one batch size is
timed in the same interleaved run (`runtimes.timing.measure`), so the ratio against the first
artifact holds on a noisy machine. A `.tflite` is loaded in this process (a child process would
time the pipe, not the interpreter) after its identifier is checked.

Result fields (`schema: modelport.bench/1`): `settings` {runs, duration, warmup, concurrency,
threads, batches, seed, data}; `results[]` one per artifact and batch size: {artifact, runtime,
batch, runs, latency_ms {p50, p90, p99, mean, min, max}, throughput (samples/s), speedup (p50 of
the first artifact over this one's, same batch), rss_delta (bytes this process's resident memory
grew by while the artifact loaded, its runtime's first import included), serialized (calls made one at a time although concurrency > 1)};
`peak_rss` (bytes, this process's high-water mark); `tool` (versions).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.errors import BadInputError, UnsafeInputError
from modelport.ir import TensorSpec
from modelport.reference.samples import load_data, make_inputs, parse_values
from modelport.registry import from_targets
from modelport.run.file_checks import check_model_file
from modelport.runtimes import RUNNERS, runner_class, timing
from modelport.version import __version__

SCHEMA = "modelport.bench/1"

# artifact kind -> the runner `bench` opens it with unless --runtime names another (a RUNNERS name):
# each target's runtime, by its suffixes (`modelport.targets`), and an emitted pytorch/ folder
KINDS = from_targets("artifact kind", lambda t: t.runtime if t.bench and t.runner and t.suffixes else None, suffixes=True)
RUNTIME_FOR_KIND = {**KINDS, "pytorch_code": "torch_source"}
# runners that may be called from several threads at once on one loaded model
THREAD_SAFE = {"onnxruntime", "torch", "torch_source"}


def artifact_kind(path: Path) -> str:
    if path.is_dir() and (path / "model.py").is_file():
        return "pytorch_code"
    if path.is_dir() and (path / "pytorch" / "model.py").is_file():
        return "pytorch_code"
    kind = KINDS.name_for(path)
    if kind is None:
        raise BadInputError(f"cannot benchmark this kind of file; known: {', '.join(KINDS.suffixes)}, a pytorch/ folder",
                            path=path)
    return kind


def pytorch_code_contract(folder: Path) -> tuple[Path, list[TensorSpec], list[str]]:
    """(the code folder, its input specs, its output names) from the report.json `convert` wrote
    beside the emitted `pytorch/` folder: generated code does not state its shapes."""
    import json

    folder = folder / "pytorch" if (folder / "pytorch" / "model.py").is_file() else folder
    report = folder.parent / "report.json"
    try:
        contract = json.loads(report.read_text()).get("contract") or {}
    except (OSError, ValueError):
        contract = {}
    if not contract.get("inputs"):
        raise BadInputError("no I/O contract for the generated code: report.json of its convert run is missing beside it",
                            path=folder, hint="give the pytorch/ folder inside the folder 'modelport convert -o OUT' wrote")
    inputs = [TensorSpec.from_dict(s) for s in contract["inputs"]]
    return folder, inputs, [o["name"] for o in contract.get("outputs") or []]


def open_artifact(path: str | Path, *, runtime: str | None = None, threads: int | None = None, trust: bool = False):
    """(runner, runtime name) for one artifact; `threads` sets the runtime's intra-op threads."""

    path = check_model_file(path)
    kind = artifact_kind(path)
    name = RUNNERS.canonical(runtime or RUNTIME_FOR_KIND[kind])
    if kind == "pytorch_code":
        if not trust:

            raise UnsafeInputError("running generated PyTorch code imports its model.py", path=path,
                                   hint="pass --trust if you trust the folder")
        folder, inputs, outputs = pytorch_code_contract(path)
        if threads:
            import torch

            torch.set_num_threads(threads)
        return RUNNERS.load(name)(folder, input_names=[s.name for s in inputs], output_names=outputs, inputs=inputs), name
    return RUNNERS.load(name).open(path, threads=threads), name


def batch_dim(specs: list[TensorSpec]) -> str | int | None:
    """The batch dim: axis 0 of the first input (a name when symbolic)."""
    return specs[0].shape[0] if specs and specs[0].shape else None


def feeds_for(specs: list[TensorSpec], batch: int | None, *, dims: dict, seed: int, given: dict, path) -> dict[str, np.ndarray]:
    """Inputs of `batch` samples: the given arrays (rows repeated or cut to the batch) and seeded random ones."""

    dims = dict(dims)
    lead = batch_dim(specs)
    if batch is not None:
        if isinstance(lead, str):
            dims[lead] = batch
        elif lead != batch:
            raise BadInputError(f"the batch dim of input '{specs[0].name}' is fixed at {lead}; --batch {batch} cannot run",
                                path=path)
        given = {k: _rows(v, batch) if v.ndim == len(_spec(specs, k).shape) and v.ndim and _spec(specs, k).shape[0] == lead
                 else v for k, v in given.items() if _spec(specs, k) is not None}
    return make_inputs(specs, dims, seed=seed, given=given, path=path)


def _spec(specs: list[TensorSpec], name: str) -> TensorSpec | None:
    return next((s for s in specs if s.name == name), None)


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    return a if a.shape[0] == n else np.take(a, np.arange(n) % a.shape[0], axis=0)


def bench(artifacts: list[str | Path], *, runs: int | None = None, duration: float | None = None, warmup: int = 5,
          batches: list[int] | None = None, threads: int | None = None, concurrency: int = 1, runtime: str | None = None,
          data: str | Path | None = None, values: list[str] = (), dims: dict[str, int] | None = None, seed: int = 0,
          trust: bool = False, on_stage=None) -> dict:
    """Benchmark every artifact at every batch size; returns the result document described above."""

    if not artifacts:
        raise BadInputError("no artifact to benchmark", hint="modelport bench model.onnx [model.tflite ...]")
    if runs is not None and runs < 1 or duration is not None and duration <= 0 or concurrency < 1 or warmup < 0:
        raise BadInputError("--runs, --duration and --concurrency must be positive, --warmup not negative")
    if any(b < 1 for b in batches or []):
        raise BadInputError(f"--batch sizes must be positive, got {batches}")
    given = {**(load_data(data) if data else {}), **parse_values(list(values))}
    opened = []
    for a in artifacts:
        if on_stage:
            on_stage(f"load:{Path(a).name}")
        before = timing.rss_bytes()
        runner, name = open_artifact(a, runtime=runtime, threads=threads, trust=trust)
        after = timing.rss_bytes()
        opened.append({"path": str(a), "runner": runner, "runtime": name, "specs": runner.input_specs(),
                       "rss_delta": after - before if after is not None and before is not None else None})
    results = []
    for batch in batches or [None]:
        subjects = []
        for o in opened:
            feeds = feeds_for(o["specs"], batch, dims=dims or {}, seed=seed, given=given, path=data or o["path"])
            items = int(next(iter(feeds.values())).shape[0]) if feeds and next(iter(feeds.values())).ndim else 1
            subjects.append(timing.Subject(o["path"], (lambda r=o["runner"], f=feeds: r.run(f)), items=items,
                                           thread_safe=o["runtime"] in THREAD_SAFE))
        if on_stage:
            on_stage(f"bench:batch {batch}" if batch else "bench")
        timing.measure(subjects, runs=runs, duration=duration, warmup=warmup, concurrency=concurrency)
        first = None
        for o, s in zip(opened, subjects, strict=True):
            row = {"artifact": o["path"], "runtime": o["runtime"], "batch": s.items, **timing.stats(s.latencies, s.items, s.busy)}
            p50 = row["latency_ms"]["p50"] if row["latency_ms"] else None
            first = p50 if first is None else first
            row["speedup"] = round(first / p50, 3) if p50 and first else None
            row["rss_delta"] = o["rss_delta"]
            row["serialized"] = concurrency > 1 and not s.thread_safe
            results.append(row)
    return {"schema": SCHEMA, "command": "bench", "status": "ok", "tool": _versions({o["runtime"] for o in opened}),
            "settings": {"runs": runs if runs is not None or duration is not None else timing.DEFAULT_RUNS,
                         "duration": duration, "warmup": warmup, "concurrency": concurrency, "threads": threads,
                         "batches": batches, "seed": seed, "data": str(data) if data else None},
            "results": results, "peak_rss": timing.peak_rss_bytes()}


def _versions(runtimes: set[str]) -> dict:
    import platform
    from importlib import metadata


    out = {"modelport": __version__, "python": platform.python_version()}

    for r in sorted(runtimes):
        dist = runner_class(r).distribution or r
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out
