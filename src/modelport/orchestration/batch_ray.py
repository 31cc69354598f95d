"""The Ray executor of `modelport batch`: each job as a Ray task on an existing cluster (or a local one).

A task runs the same child process as the local executor (orchestration.batch.run_job), so a
crash, hang or out-of-memory stays inside that job. Per-task resources come from the manifest
(`resources: {cpus, memory, gpus}`). Workers write `OUT/<name>/` themselves when they see the
driver's output folder (a shared path); a worker that does not (another machine without the
shared mount) converts into a folder of its own and returns it to the driver as a tar archive,
which the driver unpacks in place. A task that dies with its worker is recorded as crashed;
tasks are never retried (a retry would hide a crash).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from modelport.errors import BadInputError, MissingDependencyError, one_line
from modelport.orchestration.batch_job import parse_size, run_job

# Passed to every worker, so a worker imports the same modelport and behaves like the driver.
FORWARDED_ENV = ("PYTHONPATH", "MODELPORT_DEBUG", "SOURCE_DATE_EPOCH", "HF_HUB_OFFLINE", "TF_CPP_MIN_LOG_LEVEL")


def _ray():
    try:
        import ray
    except ImportError as e:
        raise MissingDependencyError("the ray executor needs Ray", hint='pip install "modelport[ray]"') from e
    return ray


def _remote_job(job, out: str, keep_failed: bool, token: str) -> dict:
    """Run on a worker: convert into OUT/<name> when OUT is shared, else into a private folder returned as a tar."""

    out_path = Path(out)
    if (out_path / token).is_file():
        return run_job(job, out_path / job.name, keep_failed=keep_failed)
    with tempfile.TemporaryDirectory(prefix="modelport-batch-") as tmp:
        entry = run_job(job, Path(tmp) / job.name, keep_failed=keep_failed)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name in (job.name, f"{job.name}.failed", f".batch/{job.name}.log"):
                if (Path(tmp) / name).exists():
                    tar.add(Path(tmp) / name, arcname=name)
        return {**entry, "_archive": buf.getvalue()}


def _unpack(entry: dict, out: Path) -> dict:
    archive = entry.pop("_archive", None)
    if archive is None:
        return entry
    name = entry["name"]
    with tempfile.TemporaryDirectory(prefix=f".{name}.unpack-", dir=out) as tmp, \
            tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(tmp, filter="data")  # refuses links and paths outside tmp
        for part in (name, f"{name}.failed"):
            if (Path(tmp) / part).exists():
                if (out / part).exists():
                    shutil.rmtree(out / part)
                os.replace(Path(tmp) / part, out / part)
        log = Path(tmp) / ".batch" / f"{name}.log"
        if log.is_file():
            os.replace(log, out / ".batch" / f"{name}.log")
    entry["returned"] = True
    return entry


def task_options(job) -> dict:

    res = job.resources or {}
    opts = {"num_cpus": float(res.get("cpus", 1)), "max_retries": 0}
    if res.get("gpus"):
        opts["num_gpus"] = float(res["gpus"])
    if res.get("memory"):
        opts["memory"] = parse_size(res["memory"], "ray memory")
    return opts


def run_on_ray(todo, out: Path, options, record) -> None:
    ray = _ray()
    if not todo:
        return
    env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    started_here = not ray.is_initialized()
    if started_here:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray reports usage to its servers unless told not to
        kwargs = {"runtime_env": {"env_vars": env}, "log_to_driver": False, "include_dashboard": False,
                  "configure_logging": False}
        if options.address:
            kwargs["address"] = options.address
        else:
            kwargs["address"] = "local"
            kwargs["_node_ip_address"] = "127.0.0.1"
        try:
            ray.init(**kwargs)
        except ConnectionError as e:
            raise BadInputError(f"cannot reach the Ray cluster at {options.address}: {one_line(e)}") from None
    token = f".batch/ray-{os.getpid()}-{os.urandom(4).hex()}"
    (out / token).write_text("shared output folder\n")
    try:
        remote = ray.remote(_remote_job)
        pending = {remote.options(**task_options(job)).remote(job, str(out.resolve()), options.keep_failed, token): (job, key)
                   for job, key in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            ref = done[0]
            job, key = pending.pop(ref)
            try:
                entry = _unpack(ray.get(ref), out)
            except Exception as e:  # the task itself died (its worker crashed or was killed)
                entry = {"name": job.name, "source": job.source, "targets": job.targets, "status": "crashed",
                         "exit_code": None, "error": f"the Ray task failed: {one_line(e, typed=True)}"}
            record(entry, key)
    finally:
        with contextlib.suppress(OSError):
            (out / token).unlink()
        if started_here:
            ray.shutdown()
