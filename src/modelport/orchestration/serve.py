"""`modelport serve PATH`: an artifact answering on the Open Inference Protocol (`serving/v2/`).

PATH is a `modelport convert` output folder (its report.json gives the contract; the artifact is
the one `--artifact` names, else the first of the report's that opens here), a `package` bundle
(its first model file that opens, the contract from the bundle's report.json), a model file (its
runner describes its inputs and outputs), or an `s3://bucket/prefix` repository `package -o s3://`
wrote: pulled into a temporary folder and checked against its manifest's sha256s first
(`packaging/s3_repository.py`; a missing or changed object refuses to start, exit 2). Before the server goes ready the artifact answers
the reference sample its convert run wrote (`reference.npz`), judged with its precision's
tolerance: a mismatch refuses to start (exit 4) naming the output; a folder without one is
served with a warning that it was not checked. Then one server process answers (`serving/v2/server.py`),
or `--workers N` processes share its ports (`serving/v2/workers.py`), or Ray Serve replicas run the
artifact behind this process's front end (`serving/ray_serve.py`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from modelport.deps import require
from modelport.errors import BadInputError, ValidationError
from modelport.ir import TensorSpec, contract_from_onnx
from modelport.onnxfile.onnx_io import load_onnx
from modelport.orchestration.bench import KINDS, open_artifact
from modelport.packaging.bundle import report_path
from modelport.packaging.reference_file import read_reference
from modelport.packaging.s3_repository import is_s3, pull
from modelport.run.file_checks import check_model_file
from modelport.serving import ray_serve
from modelport.serving.s3_mirror import Mirror, keep_in_step
from modelport.serving.v2.model import ServedModel, batch_dynamic, local_model, timed
from modelport.serving.v2.repository import CONTROLS, ROLLOUTS, Fixed, Repository, is_repository, wanted_versions
from modelport.serving.v2.stats import Stats
from modelport.targets import TARGETS

log = logging.getLogger("modelport.serve")


@dataclass
class Served:
    name: str
    path: Path
    runner: object
    runtime: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    precision: str
    reference: tuple[dict, dict] | None
    checked: dict


def _read_report(folder: Path) -> dict:
    """The folder's report.json ({} when it has none); an unreadable one is exit 2."""
    path = folder / "report.json"
    if not path.is_file():
        return {}
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BadInputError(f"report.json cannot be read ({type(e).__name__}: {e})", path=path) from None
    if not isinstance(report, dict):
        raise BadInputError("report.json is not a JSON object", path=path)
    return report


def _from_folder(folder: Path, report: dict, artifact: str | None, threads: int | None) -> Served:

    contract = report.get("contract") or {}
    if not contract.get("inputs"):
        raise BadInputError("report.json has no I/O contract (a text-generation folder is not served by `serve`)", path=folder)
    entries = [a for a in report.get("artifacts") or [] if a.get("path")]
    if artifact:
        wanted = {artifact, *(t.name for t in TARGETS.values() if artifact in t.aliases)}
        entries = [a for a in entries if a.get("target") in wanted]
        if not entries:
            known = sorted({a.get("target") for a in report.get("artifacts") or []})
            raise BadInputError(f"the folder has no {artifact} artifact; it has {known}", path=folder)
    tried = []
    for entry in entries:
        path = report_path(folder, entry["path"])  # a path report.json names, refused when it leaves the folder (exit 3)
        try:
            runner, runtime = open_artifact(path, threads=threads)
        except Exception as e:  # the next artifact: this one does not open here
            tried.append(f"{entry.get('target')}: {' '.join(str(e).split())[:120]}")
            continue
        return Served(folder.resolve().name, path, runner, runtime,
                      [TensorSpec.from_dict(s) for s in contract["inputs"]], [TensorSpec.from_dict(s) for s in contract["outputs"]],
                      entry.get("precision") or "fp32", read_reference(folder, report.get("reference")), {})
    raise BadInputError(f"no artifact of the folder opens here ({'; '.join(tried) or 'none listed'})", path=folder)


def _from_file(path: Path, threads: int | None, contract: dict | None = None) -> Served:
    """A model file: the contract's specs where given (a bundle's report.json), else its runner's."""

    runner, runtime = open_artifact(path, threads=threads)
    if contract and contract.get("inputs") and contract.get("outputs"):
        inputs = [TensorSpec.from_dict(s) for s in contract["inputs"]]
        outputs = [TensorSpec.from_dict(s) for s in contract["outputs"]]
    else:
        inputs, outputs = list(runner.input_specs()), runner.output_specs()
        if not outputs and path.suffix.lower() == ".onnx":  # onnxruntime does not describe outputs; the graph does

            outputs = contract_from_onnx(load_onnx(path, weights=False))[1]
    if not outputs:
        raise BadInputError("the runtime does not describe this file's outputs; serve its convert output folder", path=path)
    return Served(path.stem, path, runner, runtime, inputs, list(outputs), "fp32", None, {})


def model_name(text: str) -> str:
    import re

    name = re.sub(r"[^A-Za-z0-9_.-]", "-", text).strip("-.") or "model"
    return name[:64]


def _from_bundle(folder: Path, report: dict, threads: int | None) -> Served:
    """A `package` bundle (a Triton or OVMS repository, ...): its first model file a runner opens
    (shallowest first), named as the repository names it (`<name>/<version>/model.onnx`), with the
    contract of the bundle's report.json where it has one."""

    found = sorted((p for p in folder.rglob("*") if KINDS.name_for(p) is not None), key=lambda p: (len(p.parts), str(p)))
    contract = report.get("contract") or {}
    tried = []
    for path in found:
        try:
            served = _from_file(path, threads, contract)
        except Exception as e:
            tried.append(f"{path.relative_to(folder)}: {' '.join(str(e).split())[:120]}")
            continue
        if path.parent.name.isdigit():
            served.name = path.parent.parent.name
        return served
    raise BadInputError(f"no model file in the folder opens here ({'; '.join(tried) or 'none of a known kind'})", path=folder)


def open_served(path: str | Path, *, artifact: str | None = None, threads: int | None = None) -> Served:

    p = Path(path)
    report = _read_report(p) if p.is_dir() else {}
    if report.get("artifacts"):
        return _from_folder(p, report, artifact, threads)
    if p.is_dir() and not (p / "model.py").is_file() and not (p / "saved_model.pb").is_file():
        return _from_bundle(p, report, threads)
    return _from_file(check_model_file(p), threads)


def check_reference(served: Served) -> dict:
    """The artifact's answers to the reference sample, judged by its precision's tolerance; a miss
    is exit 4 naming the output (the server does not start)."""
    import numpy as np

    from modelport.validation import compare, tolerance_for

    if served.reference is None:
        return {"checked": False, "reason": "no reference.npz beside the artifact"}
    inputs, expected = served.reference
    fixed = {s.name: s.shape for s in served.runner.input_specs()}
    rows = None
    for name, shape in fixed.items():  # a file that fixes the batch (at 1) answers the first rows
        if name in inputs and shape and isinstance(shape[0], int) and inputs[name].ndim and inputs[name].shape[0] > shape[0]:
            rows = shape[0]
    if rows is not None:
        inputs = {k: v[:rows] for k, v in inputs.items()}
        expected = {k: v[:rows] for k, v in expected.items()}
    got = served.runner.run({k: np.asarray(v) for k, v in inputs.items()})
    parity = compare(expected, {k: np.asarray(v) for k, v in got.items()}, tolerance_for(served.precision),
                     hop=f"{served.path.name} served, against the reference sample")
    if not parity.ok:
        raise ValidationError(f"the artifact does not give the reference outputs, so the server does not start: {parity.summary()}",
                              path=served.path, parity=parity.to_dict())
    return {"checked": True, "outputs": [o.name for o in parity.outputs],
            "max_abs": max((float(o.max_abs) for o in parity.outputs), default=0.0)}


def serve(path: str | Path, options, *, artifact: str | None = None, name: str | None = None, threads: int | None = None,
          scale=None, on_ready=None) -> None:
    """Open, check, and serve until interrupted. `options`: `serving.v2.server.ServeOptions`;
    `scale`: `serving.ray_serve.Scale` (replicas on Ray Serve), None for runners in this host's processes."""
    import tempfile


    stop_mirror = None
    with tempfile.TemporaryDirectory(prefix="modelport-serve-") as tmp:
        if is_s3(str(path)):  # pulled and checked against its manifest before anything opens it
            uri, path = str(path), pull(str(path), Path(tmp) / "repository")
            # S3's changes reach the folder the scan (poll) or a load call (explicit) reads
            if options.model_control in ("poll", "explicit") and is_repository(path):

                stop_mirror = keep_in_step(Mirror(uri, path), options.poll_seconds)
        try:
            _serve(path, options, artifact, name, threads, scale, on_ready)
        finally:
            if stop_mirror:
                stop_mirror()


def require_server() -> None:
    """The serve extra's libraries, or exit 5 naming the install (before anything is opened)."""

    for module in ("uvicorn", "grpc", "orjson", "tritonclient.grpc"):
        require(module, purpose="modelport serve")


WORKER = "modelport.orchestration.serve_worker"  # what `--workers N` starts N of


def repository_registry(root: Path, options, threads, stats, tag: dict | None = None, replicas=None):
    """The live `Repository` of a folder in Triton's layout: each version opened and checked like
    a single artifact (`serving/v2/repository.py`); `tag`: the response parameter naming a worker;
    `replicas`: the Ray Serve handle of a repository's replicas, which then answer every version
    once it passed its check here."""
    import itertools


    opened = itertools.count()

    def opener(name: str, version: str, path: Path):
        served = open_served(path, threads=threads)
        served.checked = check_reference(served)
        if not served.checked["checked"]:
            log.warning("serve: %s version %s is not checked before it serves: %s", name, version, served.checked["reason"])
        batching = options.max_batch_size if options.max_batch_size > 1 and batch_dynamic(served.inputs) else 0
        if replicas is not None:  # checked here, answered there: a reload is a new model id, never a replica's stale copy
            served.runner = None
            call = timed(ray_serve.version_infer(replicas, f"{name}/{version}/{next(opened)}", str(served.path), served.runtime))
            model = ServedModel(name, served.inputs, served.outputs, call, stats, version=version, platform=served.runtime,
                                tag=tag or {})
            if batching:
                model.enable_batching(batching, options.max_queue_delay_ms)
        else:
            model = local_model(name, served.runner, served.inputs, served.outputs, stats, platform=served.runtime,
                                version=version, max_batch_size=batching, max_queue_delay_ms=options.max_queue_delay_ms, tag=tag)
        model.precision = served.precision
        model.reference = served.reference[0] if served.reference else None
        return model

    bound = options.max_memory // max(1, options.workers) if options.max_memory else None  # each worker holds its own models
    return Repository(root, opener, options.model_control, options.poll_seconds, rollout=options.rollout, shadow=options.shadow,
                      max_memory=bound)


def _serve_repository(root: Path, options, threads, on_ready, scale) -> None:
    """A folder in Triton's layout: every model and the versions its policy keeps, in this process,
    or with `--workers N` in N workers that hand each other load and unload calls, or answered by
    Ray Serve replicas behind this process's repository."""
    from modelport.serving.v2 import server, workers

    def said(index: list[dict]) -> str:
        return ", ".join(f"'{m['name']}' v{m['version']}" for m in index) or "no model ready"

    if scale.on_ray:
        if options.workers > 1:
            raise BadInputError(f"--workers {options.workers} and Ray Serve replicas do not combine: the replicas are the workers")
        app = model_name(f"repository-{root.resolve().name}")
        # room for every version the folder serves now, and a second one of each during a rollout
        per_replica = 2 * max(1, sum(len(wanted_versions(d)) for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")))
        handle = ray_serve.start_repository_replicas(app, threads, scale, per_replica)
        try:
            stats = Stats()
            repo = repository_registry(root, options, threads, stats, replicas=handle)
            server.run(repo, stats, options, on_serving=lambda: on_ready and on_ready(None, said(repo.index(ready_only=True))))
        finally:
            ray_serve.stop(app, started_here=not scale.address)
        return
    if options.workers > 1:
        workers.Supervisor({"repository": str(root.resolve())}, options, threads, WORKER).run(
            on_ready=lambda: on_ready and on_ready(None, f"{options.workers} workers, each with the repository's models"))
        return
    stats = Stats()
    repo = repository_registry(root, options, threads, stats)
    server.run(repo, stats, options, on_serving=lambda: on_ready and on_ready(None, said(repo.index(ready_only=True))))


def _serve(path, options, artifact, name, threads, scale, on_ready) -> None:
    require_server()
    from modelport.serving.v2 import server, workers

    if options.model_control not in CONTROLS:
        raise BadInputError(f"unknown --model-control '{options.model_control}'; known: {', '.join(CONTROLS)}")
    if options.rollout not in ROLLOUTS or options.shadow < 0 or (options.shadow and options.rollout != "parity"):
        raise BadInputError(f"--rollout {options.rollout} --shadow {options.shadow}: --rollout is one of {', '.join(ROLLOUTS)}, "
                            "and --shadow N (N >= 0) goes with --rollout parity")
    if is_repository(Path(path)):
        _serve_repository(Path(path), options, threads, on_ready, scale or ray_serve.Scale())
        return
    if options.model_control != "none" or options.rollout != "direct" or options.max_memory is not None:
        raise BadInputError("--model-control, --rollout and --max-memory are for a repository folder (Triton's layout: "
                            "NAME/config.pbtxt, NAME/<version>/)", path=path)
    scale = scale or ray_serve.Scale()
    if options.workers > 1 and scale.on_ray:
        raise BadInputError(f"--workers {options.workers} and Ray Serve replicas do not combine: the replicas are the workers")
    served = open_served(path, artifact=artifact, threads=workers.threads_per_worker(threads, options.workers))
    served.checked = check_reference(served)
    if not served.checked["checked"]:
        log.warning("serve: the answers are not checked before ready: %s", served.checked["reason"])
    if options.max_batch_size > 1 and not batch_dynamic(served.inputs):
        raise BadInputError("--max-batch-size needs a dynamic batch dim (axis 0 of every input); this model's inputs are "
                            + ", ".join(f"{s.name} {s.shape}" for s in served.inputs), path=served.path)
    name = model_name(name or served.name)
    if options.workers > 1:
        served.runner = None  # each worker opens its own
        spec = {"path": str(served.path), "runtime": served.runtime, "name": name, "platform": served.runtime,
                "inputs": [s.to_dict() for s in served.inputs], "outputs": [s.to_dict() for s in served.outputs]}
        workers.Supervisor(spec, options, threads, WORKER).run(on_ready=lambda: on_ready and on_ready(served, name))
        return
    stats = Stats()
    try:
        if scale.on_ray:
            served.runner = None  # the replicas open their own
            handle = ray_serve.start_replicas(name, str(served.path), served.runtime, threads, scale)
            model = ServedModel(name, served.inputs, served.outputs, timed(ray_serve.replica_infer(handle)), stats,
                                platform=served.runtime)
            if options.max_batch_size > 1:
                model.enable_batching(options.max_batch_size, options.max_queue_delay_ms)
        else:
            model = local_model(name, served.runner, served.inputs, served.outputs, stats, platform=served.runtime,
                                max_batch_size=options.max_batch_size, max_queue_delay_ms=options.max_queue_delay_ms)
        if on_ready:
            on_ready(served, model.name)
        server.run(Fixed({model.name: model}), stats, options)
    finally:
        if scale.on_ray:
            ray_serve.stop(name, started_here=not scale.address)
