"""`modelport batch MANIFEST --emit k8s-job -o DIR`: the same batch as a Kubernetes Indexed Job.

Nothing runs here: DIR receives `configmap.yaml` (the manifest as the pods read it, plus the index
table), `job.yaml` (a `batch/v1` Job, `completionMode: Indexed`, one index per model) and
`index.tsv` (index, model name, the convert command that index runs). Model number i of the
manifest's `models:` list is index i, so the mapping is fixed by the manifest's order.

Each pod runs `python -m modelport.orchestration.batch_k8s MANIFEST OUT`: it picks the model of
`$JOB_COMPLETION_INDEX` and runs it exactly as `modelport batch --only NAME` would (the same
`modelport convert` child, timeout and memory limit, orchestration.batch_job), so its result lands
in `OUT/.batch/<name>.json` on the shared volume and a later `modelport batch --rerun-failed`
against that folder reads it. The shared volume (a PersistentVolumeClaim) is mounted at /data:
the manifest's folder is expected under /data/src (sources and data files are rewritten to those
paths), the batch output goes to /data/out.

Failure isolation: `backoffLimitPerIndex: 0` with `restartPolicy: Never` (Kubernetes 1.29+, GA in
1.33): a failed model's index is marked failed and never retried, while every other index still
runs (no `maxFailedIndexes`). A model's own timeout is enforced inside its pod, as the local
executor does; the pod's `activeDeadlineSeconds` (the longest timeout plus a margin) is only a
backstop against a pod that hangs before or after its child.
"""

from __future__ import annotations

import copy
import math
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from modelport.errors import EXIT_VALIDATION, BadInputError, ModelportError
from modelport.orchestration.batch import BatchOptions, load_manifest, run_batch
from modelport.orchestration.batch_job import Job
from modelport.packaging.kubernetes import check_name, k8s_name, write_yaml
from modelport.packaging.quantities import check_quantity, parse_quantity

MOUNT = PurePosixPath("/data")
SOURCES = MOUNT / "src"  # the manifest's folder, copied onto the volume
OUTPUT = MOUNT / "out"  # the batch output folder on the volume
MANIFEST_DIR = PurePosixPath("/etc/modelport")  # the ConfigMap, mounted read-only
PARENT_MEMORY = 512 * 2**20  # the pod's memory limit above the model's: the batch process watching the child
DEADLINE_MARGIN = 300  # seconds the pod gets beyond the longest model timeout

# the container image reference grammar (distribution/reference): [host[:port]/]path[:tag][@digest]
_IMAGE = re.compile(
    r"(?:(?P<host>(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::\d+)?)/)?"
    r"(?P<path>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?")


def check_image(text: str) -> str:
    """`text` when it is a container image reference (`registry:5000/team/modelport:1.4`, `...@sha256:...`), else exit 2."""
    m = _IMAGE.fullmatch(text or "")
    if m is None or len(text) > 255:
        raise BadInputError(f"bad --image {text!r}: not a container image reference (e.g. registry.example.com/modelport:1.4)")
    return text


@dataclass
class K8sJobOptions:
    image: str
    namespace: str | None = None
    pvc: str = "modelport-batch"
    jobs: int = 1  # the Job's parallelism
    keep_failed: bool = False

    def __post_init__(self):

        check_image(self.image)
        if self.namespace is not None:
            check_name(self.namespace, "--namespace")
        check_name(self.pvc, "--pvc", subdomain=True)
        if not isinstance(self.jobs, int) or self.jobs < 1:
            raise BadInputError(f"bad --jobs {self.jobs!r}: a whole number >= 1")


def _pod_path(text: str, manifest: Path, where: str) -> str:
    """A manifest path as the pod sees it: relative to the manifest's folder, under /data/src."""
    if text.startswith("zoo:"):
        return text
    p = Path(text).expanduser()
    if p.is_absolute():
        raise BadInputError(f"{where}: {text!r} is an absolute path; a pod sees only the shared volume",
                            path=manifest, hint="give it relative to the manifest and copy the manifest's folder to the volume")
    parts = PurePosixPath(*p.parts).parts
    depth = 0
    for part in parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            raise BadInputError(f"{where}: {text!r} is outside the manifest's folder, which the pods see as {SOURCES}",
                                path=manifest)
    return str(PurePosixPath(os.path.normpath(str(SOURCES / PurePosixPath(*parts)))))


def pod_manifest(manifest: Path) -> dict:
    """The manifest the pods read: every model with its defaults merged, named, and its files under /data/src."""
    import yaml

    jobs = load_manifest(manifest)  # every check of a local batch, first
    doc = yaml.safe_load(manifest.read_text())
    defaults = doc.get("defaults") or {}
    models = []
    for i, (entry, job) in enumerate(zip(doc["models"], jobs, strict=True)):
        merged = copy.deepcopy({**defaults, **({"source": entry} if isinstance(entry, str) else entry)})  # no YAML anchors
        merged["name"] = job.name
        where = f"models[{i}]"
        merged["source"] = _pod_path(str(merged["source"]), manifest, where)
        if merged.get("data"):
            merged["data"] = _pod_path(str(merged["data"]), manifest, where)
        models.append(merged)
    return {"models": models}


def index_rows(jobs: list[Job], *, keep_failed: bool = False) -> list[tuple[int, str, str]]:
    """(index, model name, the convert command of that index inside a pod)."""
    rows = []
    for i, job in enumerate(jobs):
        cmd = job.command(Path(str(OUTPUT / job.name)), keep_failed=keep_failed)
        rows.append((i, job.name, shlex.join(["python", *cmd[1:]])))
    return rows


def _quantity_mi(nbytes: int) -> str:
    return f"{math.ceil(nbytes / 2**20)}Mi"


def resources_for(jobs: list[Job]) -> dict:
    """The pod template's resources: one template serves every index, so it takes the largest model's needs.

    limits.memory is the largest per-model `memory` plus room for the batch process that watches
    the child: the child is killed (status out-of-memory) before the kernel would kill the pod.
    """

    requests: dict = {}
    limits: dict = {}
    cpus = [str(j.resources["cpus"]) for j in jobs if j.resources.get("cpus") is not None]
    if cpus:
        for c in cpus:
            check_quantity(c, "resources.cpus")

        requests["cpu"] = max(cpus, key=parse_quantity)
    memories = [j.memory for j in jobs if j.memory]
    if memories:
        requests["memory"] = limits["memory"] = _quantity_mi(max(memories) + PARENT_MEMORY)
    try:
        gpus = [int(j.resources.get("gpus") or 0) for j in jobs]
    except (TypeError, ValueError):
        raise BadInputError("resources.gpus must be a whole number of GPUs") from None
    if max(gpus, default=0) > 0:
        limits["nvidia.com/gpu"] = max(gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def job_documents(manifest: Path, pod_doc: dict, jobs: list[Job], options: K8sJobOptions) -> tuple[dict, dict, list]:
    """The ConfigMap (manifest + index table) and the Indexed Job, as dictionaries."""
    import yaml


    name = k8s_name(f"modelport-batch-{manifest.stem}")[:52].rstrip("-")  # room for the pods' index suffixes
    rows = index_rows(jobs, keep_failed=options.keep_failed)
    table = "index\tname\tcommand\n" + "".join(f"{i}\t{n}\t{c}\n" for i, n, c in rows)
    meta = {"name": f"{name}-manifest", "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "modelport"}}
    job_meta = {"name": name, "labels": dict(meta["labels"])}
    if options.namespace:
        meta["namespace"] = job_meta["namespace"] = options.namespace
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                 "data": {"manifest.yaml": yaml.safe_dump(pod_doc, sort_keys=False), "index.tsv": table}}
    command = ["python", "-m", "modelport.orchestration.batch_k8s", str(MANIFEST_DIR / "manifest.yaml"), str(OUTPUT)]
    if options.keep_failed:
        command.append("--keep-failed")
    container = {"name": "convert", "image": options.image, "command": command,
                 "volumeMounts": [{"name": "data", "mountPath": str(MOUNT)},
                                  {"name": "manifest", "mountPath": str(MANIFEST_DIR), "readOnly": True}]}
    resources = resources_for(jobs)
    if resources:
        container["resources"] = resources
    deadline = math.ceil(max(j.timeout for j in jobs)) + DEADLINE_MARGIN
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta,
        "spec": {
            "completionMode": "Indexed",
            "completions": len(jobs),
            "parallelism": min(options.jobs, len(jobs)),
            "backoffLimitPerIndex": 0,
            "template": {
                "metadata": {"labels": dict(meta["labels"])},
                "spec": {
                    "restartPolicy": "Never",
                    "activeDeadlineSeconds": deadline,
                    "containers": [container],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": options.pvc}},
                                {"name": "manifest", "configMap": {"name": meta["name"]}}],
                },
            },
        },
    }
    return configmap, job, rows


def emit_k8s_job(manifest: str | Path, out: str | Path, options: K8sJobOptions) -> dict:
    """Write DIR/configmap.yaml, DIR/job.yaml and DIR/index.tsv for `manifest`; nothing runs. DIR must be new or empty."""
    import tempfile


    manifest, out = Path(manifest), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInputError("the output folder exists and is not empty", path=out,
                            hint="choose a new folder for the Kubernetes manifests")
    pod_doc = pod_manifest(manifest)
    with tempfile.TemporaryDirectory() as tmp:  # the pods' manifest, loaded as a pod loads it
        import yaml

        pod_file = Path(tmp) / "manifest.yaml"
        pod_file.write_text(yaml.safe_dump(pod_doc, sort_keys=False))
        jobs = load_manifest(pod_file)
    configmap, job, rows = job_documents(manifest, pod_doc, jobs, options)
    out.mkdir(parents=True, exist_ok=True)
    write_yaml(out / "configmap.yaml", configmap)
    write_yaml(out / "job.yaml", job)
    (out / "index.tsv").write_text(configmap["data"]["index.tsv"])
    return {"manifest": str(manifest.resolve()), "output": str(out.resolve()), "job": job["metadata"]["name"],
            "files": ["configmap.yaml", "job.yaml", "index.tsv"], "completions": len(jobs),
            "parallelism": job["spec"]["parallelism"], "index": [{"index": i, "name": n} for i, n, _ in rows]}


def run_index(manifest: str | Path, out: str | Path, index: int, *, keep_failed: bool = False) -> dict:
    """Run model number `index` of `manifest` into `out` as `modelport batch --only NAME` does; its summary entry."""
    jobs = load_manifest(manifest)
    if not 0 <= index < len(jobs):
        raise BadInputError(f"index {index} is outside the manifest's {len(jobs)} model(s)", path=Path(manifest))
    name = jobs[index].name
    summary = run_batch(manifest, out, BatchOptions(only=[name], keep_failed=keep_failed))
    return next(m for m in summary["models"] if m["name"] == name)


def main(argv: list[str] | None = None) -> int:
    """A pod's entry point: MANIFEST OUT [--keep-failed], the index from $JOB_COMPLETION_INDEX; exit 0 ok, 4 failed."""

    args = list(sys.argv[1:] if argv is None else argv)
    keep_failed = "--keep-failed" in args
    args = [a for a in args if a != "--keep-failed"]
    text = os.environ.get("JOB_COMPLETION_INDEX", "")
    try:
        if len(args) != 2 or not text.isdigit():
            raise BadInputError("usage: python -m modelport.orchestration.batch_k8s MANIFEST OUT [--keep-failed], "
                                "with JOB_COMPLETION_INDEX set (an Indexed Job sets it)")
        entry = run_index(args[0], args[1], int(text), keep_failed=keep_failed)
    except ModelportError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return e.exit_code
    print(f"{entry['name']}: {entry['status']}" + (f": {entry['error']}" if entry.get("error") else ""), file=sys.stderr)
    return 0 if entry["status"] == "ok" else EXIT_VALIDATION


if __name__ == "__main__":
    sys.exit(main())
