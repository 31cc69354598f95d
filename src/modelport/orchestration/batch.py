"""`modelport batch`: many models per run, each in its own process, resumable, with one summary.

A manifest (YAML) lists models; each becomes one `modelport convert` job run as a child process
(`python -m modelport convert ... --json`) with a timeout and a memory limit, so a crash, hang or
out-of-memory in one model never stops the others. Each job writes `OUT/<name>/` atomically (the
convert command stages it), and its result lands in `OUT/.batch/<name>.json` the moment it ends,
so killing the batch and starting it again loses nothing already done. `OUT/summary.json`
collects every result (schema `modelport.batch/1`).

A job is skipped when its key (the source's bytes, the job's arguments and the tool versions)
matches the key of its last successful run. Executors run the jobs: `local` (a thread pool of
child processes, `--jobs N`) and `ray` (orchestration.batch_ray: the same child process as a
Ray task on a cluster).

Manifest:

    defaults:                 # every key of a model entry may be given here once
      to: [onnx]
      timeout: 600            # seconds per model
      memory: 8GiB            # resident memory of the model's process tree
    models:
      - name: cnn             # OUT/<name>/ (letters, digits, '_', '.', '-')
        source: zoo:cnn_small # a path (relative to the manifest), zoo:NAME or a Hugging Face folder
        input: ["input:batch,3,64,64"]
        to: [onnx, tflite]
        optimize: all
        precision: fp16
        data: inputs.npz      # relative to the manifest
        value: ["sr=16000"]
        tolerances: {atol: 1e-4, rtol: 1e-3, min_cosine: 0.999, outputs: {probs: {atol: 0.1}}}
        package: [triton]
        args: ["--opset", "17"]   # any other convert flags, verbatim
        resources: {cpus: 1, memory: 2GiB, gpus: 0}   # for the ray executor
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from modelport.deps import target_distributions
from modelport.errors import EXIT_VALIDATION, BadInputError, one_line
from modelport.orchestration.batch_job import DEFAULT_TIMEOUT, STATE_DIR, Job, parse_size, run_job
from modelport.orchestration.batch_ray import run_on_ray
from modelport.run.names import check_path_name
from modelport.validation.html_report import render_batch, write_html
from modelport.version import __version__
from modelport.zoo import ZOO_FILE

SCHEMA = "modelport.batch/1"
KEYS = {"name", "source", "to", "input", "optimize", "precision", "data", "value", "tolerances", "package", "args",
        "timeout", "memory", "resources", "dim", "seed", "route", "task", "trust"}
# distributions whose versions key a job's cached result; every target's runtime and needs besides (deps.target_distributions)
VERSIONED = ("onnx", "onnxruntime", "torch", "tensorflow", "keras", "onnx2tf", "tf2onnx", "onnxscript", "transformers")


def _list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, int, float)):
        return [str(v).strip() for v in str(value).split(",") if str(v).strip()]
    return [str(v) for v in value]


def _tolerance_args(tol: dict, where: str) -> list[str]:
    if not isinstance(tol, dict):
        raise BadInputError(f"{where}: tolerances must be a mapping (atol, rtol, min_cosine, outputs)")
    args: list[str] = []
    flags = {"atol": "--atol", "rtol": "--rtol", "min_cosine": "--min-cosine"}
    for key, value in tol.items():
        if key == "outputs":
            if not isinstance(value, dict):
                raise BadInputError(f"{where}: tolerances.outputs must map output names to tolerances")
            for out_name, per in value.items():
                if not isinstance(per, dict) or set(per) - set(flags):
                    raise BadInputError(f"{where}: tolerances.outputs.{out_name}: known: {', '.join(flags)}")
                for k, v in per.items():
                    args += [flags[k], f"{out_name}={v}"]
        elif key in flags:
            args += [flags[key], str(value)]
        else:
            raise BadInputError(f"{where}: unknown tolerance {key!r}; known: {', '.join([*flags, 'outputs'])}")
    return args


def _resolve_path(text: str, base: Path) -> str:
    if text.startswith("zoo:"):
        return text
    p = Path(text).expanduser()
    return str(p if p.is_absolute() else (base / p))


def load_manifest(path: str | Path) -> list[Job]:
    """The manifest's jobs, checked: bad YAML, unknown keys, bad names or duplicates are exit 2."""
    import yaml

    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise BadInputError("no such manifest", path=path) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise BadInputError(f"cannot read the manifest: {one_line(e)}", path=path) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list) or not doc["models"]:
        raise BadInputError("the manifest needs a non-empty `models:` list", path=path)
    defaults = doc.get("defaults") or {}
    unknown = set(doc) - {"defaults", "models"}
    if unknown or not isinstance(defaults, dict):
        raise BadInputError(f"unknown manifest key(s) {sorted(unknown)}; known: defaults, models", path=path)
    jobs, seen = [], set()
    for i, entry in enumerate(doc["models"]):
        if isinstance(entry, str):
            entry = {"source": entry}
        if not isinstance(entry, dict):
            raise BadInputError(f"models[{i}] must be a mapping or a source string", path=path)
        merged = {**defaults, **entry}
        bad = set(merged) - KEYS
        if bad:
            raise BadInputError(f"models[{i}]: unknown key(s) {sorted(bad)}; known: {', '.join(sorted(KEYS))}", path=path)
        if not merged.get("source"):
            raise BadInputError(f"models[{i}] has no source", path=path)
        job = _job(merged, path.parent.resolve(), f"{path}: models[{i}]")
        if job.name in seen:
            raise BadInputError(f"two models are named {job.name!r}: give each a unique `name`", path=path)
        seen.add(job.name)
        jobs.append(job)
    return jobs


def _default_name(source: str) -> str:
    text = source[4:] if source.startswith("zoo:") else Path(source.rstrip("/")).name
    stem = text.split(".")[0] if not source.startswith("zoo:") else text
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in stem) or "model"


def _job(m: dict, base: Path, where: str) -> Job:
    source = _resolve_path(str(m["source"]), base)
    name = check_path_name(str(m.get("name") or _default_name(str(m["source"]))), "model name")
    targets = _list(m.get("to")) or ["onnx"]
    argv = ["--to", ",".join(targets)]
    for spec in _list(m.get("input")) if isinstance(m.get("input"), str) else [str(s) for s in m.get("input") or []]:
        argv += ["--input", spec]
    for key, flag in (("optimize", "--optimize"), ("precision", "--precision"), ("seed", "--seed"), ("route", "--route"),
                      ("task", "--task")):
        if m.get(key) is not None:
            argv += [flag, str(m[key])]
    for key, flag in (("value", "--value"), ("dim", "--dim")):
        for v in _list(m.get(key)) if isinstance(m.get(key), str) else [str(v) for v in m.get(key) or []]:
            argv += [flag, v]
    inputs = [] if source.startswith("zoo:") else [source]
    if m.get("data"):
        data = _resolve_path(str(m["data"]), base)
        argv += ["--data", data]
        inputs.append(data)
    if m.get("package"):
        argv += ["--package", ",".join(_list(m["package"]))]
    if m.get("trust"):
        argv.append("--trust")
    argv += _tolerance_args(m.get("tolerances") or {}, where)
    extra = m.get("args") or []
    if not isinstance(extra, list):
        raise BadInputError(f"{where}: args must be a list of convert flags")
    argv += [str(a) for a in extra]
    try:
        timeout = float(m.get("timeout", DEFAULT_TIMEOUT))
    except (TypeError, ValueError):
        timeout = -1.0
    if timeout <= 0:
        raise BadInputError(f"{where}: timeout must be a number of seconds > 0")
    resources = m.get("resources") or {}
    if not isinstance(resources, dict) or set(resources) - {"cpus", "memory", "gpus"}:
        raise BadInputError(f"{where}: resources takes cpus, memory and gpus")
    return Job(name=name, source=source, argv=argv, timeout=timeout, memory=parse_size(m.get("memory"), "memory limit"),
               resources=resources, inputs=inputs, targets=targets)


# --- the key of a job: what it reads, how it runs, and with which tools --------------------------

def _hash_path(h, path: Path) -> None:
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(path)).encode() + b"\0")
                _hash_file(h, p)
    elif path.is_file():
        _hash_file(h, path)
    else:
        h.update(b"missing\0")


def _hash_file(h, path: Path) -> None:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)


def tool_versions() -> dict[str, str]:
    from importlib import metadata


    out = {"modelport": __version__, "python": sys.version.split()[0]}

    for dist in dict.fromkeys((*VERSIONED, *target_distributions())):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


def job_key(job: Job, versions: dict[str, str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"source": job.source, "argv": job.argv, "versions": versions}, sort_keys=True).encode())
    for path in job.inputs:
        h.update(path.encode() + b"\0")
        _hash_path(h, Path(path))
    if job.source.startswith("zoo:"):

        _hash_file(h, ZOO_FILE)
    return h.hexdigest()


# --- the batch ---------------------------------------------------------------------------------

@dataclass
class BatchOptions:
    jobs: int = 1
    rerun_failed: bool = False
    keep_failed: bool = False
    only: list[str] = field(default_factory=list)  # model names to run (others keep their last result)
    executor: str = "local"  # local | ray
    address: str | None = None  # ray cluster address (None: start a local one)

    def __post_init__(self):
        if not isinstance(self.jobs, int) or self.jobs < 1:
            raise BadInputError(f"bad --jobs {self.jobs!r}: a whole number >= 1")
        if self.executor not in EXECUTORS:
            raise BadInputError(f"unknown executor {self.executor!r}; known: {', '.join(EXECUTORS)}")


def _atomic_write(path: Path, data: dict) -> None:
    # unique across hosts too: pods sharing the output volume are each pid 1
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(6)}")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def previous_results(out: Path) -> dict[str, dict]:
    state = out / STATE_DIR
    results = {}
    if state.is_dir():
        for p in state.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                results[p.stem] = json.loads(p.read_text())
    return results


def check_batch_output(out: Path) -> None:
    """OUT must be new, empty, or a folder a batch wrote (it holds .batch/): a batch only adds to it.

    Each model's folder OUT/<name>/ is written by its convert job, which refuses to replace
    anything modelport did not write and any folder holding one of its inputs.
    """
    if out.exists() and not (out / STATE_DIR).is_dir():
        if not out.is_dir() or any(out.iterdir()):
            raise BadInputError("the output folder exists and was not written by `modelport batch`", path=out,
                                hint="choose a new folder (a batch output is resumed, never replaced)")


def run_batch(manifest: str | Path, out: str | Path, options: BatchOptions | None = None,
              on_result: Callable[[dict], None] | None = None) -> dict:
    """Run every job of `manifest` into `out`; returns the summary (also written to OUT/summary.json)."""
    options = options or BatchOptions()
    manifest, out = Path(manifest), Path(out)
    jobs = load_manifest(manifest)
    unknown = sorted(set(options.only) - {j.name for j in jobs})
    if unknown:
        raise BadInputError(f"no model named {', '.join(unknown)} in the manifest; known: {', '.join(j.name for j in jobs)}",
                            path=manifest)
    check_batch_output(out)
    (out / STATE_DIR).mkdir(parents=True, exist_ok=True)
    versions = tool_versions()
    before = previous_results(out)
    results: dict[str, dict] = {}
    todo: list[tuple[Job, str]] = []
    for job in jobs:
        key = job_key(job, versions)
        last = before.get(job.name)
        done = last and last.get("status") == "ok" and (out / job.name / "report.json").is_file()
        if options.only and job.name not in options.only:
            run = False
        elif options.rerun_failed:
            run = bool(last) and last.get("status") != "ok"
        else:
            run = not (done and last.get("key") == key)
        if run:
            todo.append((job, key))
        elif last:
            results[job.name] = {**last, "skipped": True}
        else:
            results[job.name] = {"name": job.name, "source": job.source, "targets": job.targets, "status": "not-run",
                                 "skipped": True, "error": None}
    lock = threading.Lock()
    t0 = time.monotonic()

    def record(entry: dict, key: str) -> None:
        entry = {**entry, "key": key, "skipped": False, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with lock:
            _atomic_write(out / STATE_DIR / f"{entry['name']}.json", entry)
            results[entry["name"]] = entry
            if on_result:
                on_result(entry)

    EXECUTORS[options.executor](todo, out, options, record)
    summary = {"schema": SCHEMA, "manifest": str(manifest.resolve()), "output": str(out.resolve()),
               "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.monotonic() - t0, 3),
               "executor": options.executor, "tool": versions,
               "models": [results[j.name] for j in jobs]}
    summary["counts"] = count(summary["models"])
    summary["exit_code"] = EXIT_VALIDATION if summary["counts"]["failed"] else 0
    _atomic_write(out / "summary.json", summary)

    write_html(out / "report.html", render_batch(summary, out))
    return summary


def count(models: Iterable[dict]) -> dict:
    models = list(models)
    ok = sum(m.get("status") == "ok" for m in models)
    not_run = sum(m.get("status") == "not-run" for m in models)
    return {"models": len(models), "ok": ok, "failed": len(models) - ok - not_run, "not_run": not_run,
            "skipped": sum(bool(m.get("skipped")) for m in models)}


def run_local(todo: list[tuple[Job, str]], out: Path, options: BatchOptions, record) -> None:
    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        futures = [pool.submit(lambda j=job, k=key: record(run_job(j, out / j.name, keep_failed=options.keep_failed), k))
                   for job, key in todo]
        for f in futures:
            f.result()


def run_ray(todo, out, options, record) -> None:

    run_on_ray(todo, out, options, record)


EXECUTORS = {"local": run_local, "ray": run_ray}

