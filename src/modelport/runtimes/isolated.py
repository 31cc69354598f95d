"""Running untrusted model files in a child process with a timeout.

FlatBuffers have no bounds checks of their own (TFSA-2018-003, CVE-2020-15211) and TensorFlow
treats CHECK-fail aborts as non-vulnerabilities, so a hostile `.tflite` or graph may kill the
process that loads it. Work that parses or runs such a file happens here in a fresh
`python -c` child; the parent only reads back what the child wrote into a temporary folder
(JSON, `.npz` arrays, an ONNX file it produced). A child killed by a signal or overrunning its
timeout becomes a BadInputError (exit 2) naming the signal; an error the child raised comes back
as the same ModelportError class with its reason. For an artifact modelport wrote itself
(`ours=True`), a runtime that fails on it, hangs or crashes is no bad input but a conversion that
failed its own check: a ValidationError (exit 4) with the runtime's message cut to one short line,
its full text kept as the error's `detail` (report.json).

`call_in_child(target, request)` runs any `module:function(work, request) -> dict` there;
`IsolatedRunner` wraps any registered runner so that loading and running happen in the child.

Artifacts are validated the same way, and the child is also *clean* (`clean_runner`): an
artifact must load where its users load it, with that runtime alone. The child imports nothing
but modelport's runner and that runtime (the runner class's `frameworks()`, runtimes/base.py):
every other framework is blocked
at import (a SavedModel that only loads where `tf_keras` was imported, generated code that
reaches for onnxruntime, fail there as they would for a user), and the environment variables
modelport sets for its own quiet (`TF_ENABLE_ONEDNN_OPTS=0` changes TensorFlow's kernels) are
taken back, so the runtime runs with its defaults.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from modelport import errors
from modelport.deps import QUIET_ENV, runtime_defaults_env
from modelport.errors import BadInputError, ModelportError, ValidationError, one_line
from modelport.ir import TensorSpec
from modelport.runtimes import RUNNERS, runner_class
from modelport.runtimes.base import Runner

RUN_TIMEOUT_S = 120.0  # loading and running one model on one batch
CONVERT_TIMEOUT_S = 1800.0  # parsing + converting a whole model (large graphs take minutes)
TIMEOUT_ENV = "MODELPORT_CHILD_TIMEOUT"
CHILD_CODE = "import sys; from modelport.runtimes.isolated import child_main; sys.exit(child_main(sys.argv[1]))"
PER_SET_TIMEOUT_S = 20.0  # added to the run timeout for each sample set beyond the first

# The frameworks a clean child blocks unless its runtime needs them (top-level module names).
FRAMEWORKS = ("torch", "torchvision", "torchaudio", "tensorflow", "tf_keras", "keras", "jax", "jaxlib", "onnxruntime",
              "onnxruntime_genai", "openvino", "nncf", "onnx", "onnxscript", "onnx_ir", "onnxsim", "onnx2tf", "tf2onnx",
              "transformers", "ai_edge_litert", "litert_torch", "tensorrt", "executorch", "coremltools", "safetensors")


def timeout_for(default: float) -> float:
    """`MODELPORT_CHILD_TIMEOUT` (seconds) overrides every child's limit."""
    raw = os.environ.get(TIMEOUT_ENV)
    try:
        return float(raw) if raw else default
    except ValueError:
        raise BadInputError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def run_isolated(code: str, args: list[str], *, path, timeout: float = RUN_TIMEOUT_S, what: str = "the model loader",
                 clean: bool = False, ours: bool = False):
    """Run `python -c code args` in a child; a signal death or timeout becomes BadInputError (a
    ValidationError for an artifact modelport wrote: `ours`). `clean`: with the runtime's own
    defaults (`deps.numeric_env_defaults`), not modelport's quiet settings."""

    env = dict(os.environ)
    if not env.get("MODELPORT_DEBUG"):
        env.update({k: v for k, v in QUIET_ENV.items() if not env.get(k)})
    if clean:
        env = runtime_defaults_env(env)
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                              timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        if ours:
            raise ValidationError(f"{what} did not finish within {timeout:g} s on the artifact modelport wrote", path=path,
                                  hint=f"{TIMEOUT_ENV}=<seconds> gives it longer") from None
        raise BadInputError(f"{what} did not finish within {timeout:g} s (corrupt or hostile file?)", path=path) from None
    if proc.returncode < 0:
        if ours:
            raise ValidationError(f"{what} crashed ({signal_name(proc.returncode)}) on the artifact modelport wrote",
                                  path=path, detail=(proc.stderr or "")[-20000:] or None)
        raise BadInputError(f"{what} crashed ({signal_name(proc.returncode)}): the file is corrupt or not a valid model",
                            path=path)
    return proc


def _rebuild_error(record: dict, path, *, what: str, ours: bool) -> ModelportError:
    """The error the child recorded, as the same class; for an artifact modelport wrote (`ours`), a
    bad-input error of its runtime is the artifact failing its check (exit 4), in one short line."""
    cls = getattr(errors, record.get("type", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, ModelportError)) or cls is errors.StageError:
        cls = ModelportError
    where = record.get("path") or path
    if ours and issubclass(cls, BadInputError):
        return ValidationError(f"{what} failed on the artifact modelport wrote: {one_line(record['reason'])}", path=where,
                               hint=record.get("hint"), detail=record.get("detail") or record["reason"])
    if cls is ModelportError:
        return cls(record["reason"], path=where, hint=record.get("hint"),
                   exit_code=int(record.get("exit_code", errors.EXIT_UNEXPECTED)))
    return cls(record["reason"], path=where, hint=record.get("hint"))


def call_in_child(target: str, request: dict, *, path, arrays: dict[str, np.ndarray] | None = None,
                  timeout: float = RUN_TIMEOUT_S, what: str = "the model loader",
                  collect: Callable[[Path, dict], object] | None = None, unexpected: type[ModelportError] = BadInputError,
                  clean: bool = False, prepare: Callable[[Path], None] | None = None, ours: bool = False):
    """Run `target(work, request)` in a child and return its JSON response (or `collect(work, response)`).

    `arrays` reach the child as `work/arrays_in.npz`; the child may leave files in `work` for
    `collect`, which runs before the folder is removed. An exception that is not a
    ModelportError inside the child is raised here as `unexpected` with its first line (a
    ValidationError for an artifact modelport wrote: `ours`, see the module docstring).
    """
    with tempfile.TemporaryDirectory(prefix="modelport-child-") as tmp:
        work = Path(tmp)
        (work / "request.json").write_text(json.dumps({"target": target, "args": request}))
        if arrays is not None:
            write_arrays(work, "arrays_in", arrays)
        if prepare is not None:
            prepare(work)
        proc = run_isolated(CHILD_CODE, [str(work)], path=path, timeout=timeout, what=what, clean=clean, ours=ours)
        error = work / "error.json"
        if error.exists():
            record = json.loads(error.read_text())
            if record.get("type") == "unexpected" and ours:
                raise ValidationError(f"{what} failed on the artifact modelport wrote: {one_line(record['reason'])}",
                                      path=path, detail=record.get("detail") or record["reason"])
            if record.get("type") == "unexpected":
                raise unexpected(f"{what} failed: {record['reason']}", path=path)
            raise _rebuild_error(record, path, what=what, ours=ours)
        response_file = work / "response.json"
        if proc.returncode != 0 or not response_file.exists():
            tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            if ours:
                raise ValidationError(f"{what} failed on the artifact modelport wrote: {one_line(tail[0])}", path=path,
                                      detail=(proc.stderr or "")[-20000:] or None)
            raise unexpected(f"{what} failed: {tail[0][:300]}", path=path)
        response = json.loads(response_file.read_text())
        return collect(work, response) if collect else response


def read_arrays(work: Path, stem: str) -> dict[str, np.ndarray]:
    """Arrays written by `write_arrays`, in their original order and under their original names."""
    names = json.loads((work / f"{stem}.json").read_text())
    with np.load(work / f"{stem}.npz", allow_pickle=False) as z:
        return {n: z[str(i)] for i, n in enumerate(names)}


def write_arrays(work: Path, stem: str, arrays: dict[str, np.ndarray]) -> None:
    """Arrays keyed by position in the .npz (names may hold '/' or ':'), names in a JSON list."""
    with open(work / f"{stem}.npz", "wb") as f:
        np.savez(f, **{f"{i}": np.asarray(v) for i, v in enumerate(arrays.values())})
    (work / f"{stem}.json").write_text(json.dumps(list(arrays)))


def child_main(workdir: str) -> int:
    """The child's side: import the target, call it, write response.json or error.json."""
    work = Path(workdir)
    req = json.loads((work / "request.json").read_text())
    try:
        if req["args"].get("block"):
            block_imports(req["args"]["block"], req["args"].get("runtime", "this"))
        module, _, attr = req["target"].partition(":")
        fn = getattr(importlib.import_module(module), attr)
        response = fn(work, req["args"])
        (work / "response.json").write_text(json.dumps(response if response is not None else {}, default=str))
        return 0
    except Exception as e:
        from modelport.deps import missing_dependency

        err = missing_dependency(e) or e
        if isinstance(err, ModelportError):
            record = {"type": type(err).__name__, "exit_code": err.exit_code, "reason": err.reason, "hint": err.hint,
                      "path": err.path, "detail": err.detail}
        else:
            record = {"type": "unexpected", "reason": one_line(e, 300, typed=True),
                      "detail": f"{type(e).__name__}: {str(e).strip()}"[:20000]}
    (work / "error.json").write_text(json.dumps(record))
    return 2


class _Blocked:
    """A meta-path finder that refuses the top-level modules a clean child must not import."""

    def __init__(self, names, runtime: str):
        self.names, self.runtime = frozenset(names), runtime

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named '{fullname}' (where a {self.runtime} artifact is used, only "
                                      f"that runtime is installed)", name=fullname)
        return None


def block_imports(names, runtime: str) -> None:
    """Make `names` (top-level modules) unimportable in this process from now on. To
    `importlib.util.find_spec` they are absent (None), as where they are not installed: libraries
    probe for optional frameworks that way (torch._dynamo for onnx, tensorflow, tensorrt)."""
    blocked = _Blocked(names, runtime)
    sys.meta_path.insert(0, blocked)
    absent_to_find_spec(blocked.names)


def absent_to_find_spec(names):
    """Make `importlib.util.find_spec` answer None for `names` (top-level modules) and their
    submodules, as where they are not installed; returns the function that undoes it."""
    import importlib.util

    probe = importlib.util.find_spec
    hidden = frozenset(names)

    def find_spec(name, package=None):
        top = (importlib.util.resolve_name(name, package) if name.startswith(".") else name).partition(".")[0]
        return None if top in hidden else probe(name, package)

    def undo() -> None:
        importlib.util.find_spec = probe

    importlib.util.find_spec = find_spec
    return undo


def blocked_for(runtime: str) -> list[str]:
    """The frameworks a clean child validating a `runtime` artifact blocks: all but those a user of
    its artifacts has (its runner class's `frameworks()`)."""

    allowed = set(runner_class(runtime).frameworks())
    return [m for m in FRAMEWORKS if m not in allowed]


def _runner_in_child(work: Path, args: dict) -> dict:
    from modelport.targets import load

    runner = load(args["runner"])(args["model"], **args.get("options", {}))  # "module:Class": a plug-in's runner too
    response: dict = {}
    if args.get("describe"):
        response["describe"] = runner.describe()
        response["input_specs"] = [s.to_dict() for s in runner.input_specs()]
        outputs = runner.output_specs()
        response["output_specs"] = [s.to_dict() for s in outputs] if outputs is not None else None
        response["io_note"] = runner.io_note()
    if args.get("run"):
        outs = runner.run(read_arrays(work, "arrays_in"))
        write_arrays(work, "arrays_out", outs)
        response["ran"] = True
    for i in range(int(args.get("sets", 0))):
        write_arrays(work, f"arrays_out_{i}", runner.run(read_arrays(work, f"arrays_in_{i}")))
    if args.get("clean"):
        response["modules"] = sorted({m.partition(".")[0] for m in sys.modules} & set(FRAMEWORKS))
    return response


class IsolatedRunner(Runner):
    """Any registered runner, loaded and run in a child process on each call.

    `run(feeds)` costs a process start and the runtime's import each time (about 1 s for LiteRT):
    meant for validating untrusted files and artifacts, not for benchmarks. `run_many` runs
    several feed sets in one child. `clean=True`: the child imports nothing but the runtime
    (`blocked_for`) and runs it with its defaults; `modules` then lists the frameworks it imported.
    Its abilities are the inner runner class's (read here; the class's module imports no runtime).
    """

    def __init__(self, runner: str, model, *, timeout: float | None = None, clean: bool = False, ours: bool = False,
                 **options):

        self.inner = runner
        self._inner_class = runner_class(runner)
        self.capabilities = self._inner_class.capabilities
        self.name = f"{runner} (isolated)"
        self.path = Path(model)
        self.options = options
        self.timeout = timeout or timeout_for(RUN_TIMEOUT_S)
        self.clean = clean
        self.ours = ours  # an artifact modelport wrote: its runtime failing on it is exit 4 (see the module docstring)
        self.modules: list[str] | None = None
        self._described: dict | None = None

    def _call(self, *, describe: bool = False, feeds: dict | None = None, sets: list[dict] | None = None):

        request = {"runner": RUNNERS[RUNNERS.canonical(self.inner)], "model": str(self.path.resolve()), "options": self.options,
                   "describe": describe, "run": feeds is not None, "sets": len(sets or ())}
        if self.clean:
            request.update(clean=True, runtime=self.inner, block=blocked_for(self.inner))

        def collect(work: Path, response: dict):
            if feeds is not None:
                response["outputs"] = read_arrays(work, "arrays_out")
            if sets:
                response["sets"] = [read_arrays(work, f"arrays_out_{i}") for i in range(len(sets))]
            return response

        def arrays_for(work: Path) -> None:
            for i, s in enumerate(sets or ()):
                write_arrays(work, f"arrays_in_{i}", s)

        timeout = self.timeout + PER_SET_TIMEOUT_S * max(0, len(sets or ()) - 1)
        response = call_in_child("modelport.runtimes.isolated:_runner_in_child", request, path=self.path, arrays=feeds,
                                 timeout=timeout, what=f"the {self.inner} runtime", collect=collect, clean=self.clean, ours=self.ours,
                                 prepare=arrays_for if sets else None)
        if "modules" in response:
            self.modules = response["modules"]
        return response

    def run_many(self, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Each feed set's outputs, all from one child process."""
        return self._call(sets=feeds)["sets"]

    def _description(self) -> dict:
        if self._described is None:
            self._described = self._call(describe=True)
        return self._described

    def describe(self) -> dict | None:
        """The inner runner's `describe()` (input/output details), computed in the child (once)."""
        return self._description()["describe"]

    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(d) for d in self._description()["input_specs"]]

    def output_specs(self) -> list[TensorSpec] | None:
        """The inner runner's outputs, where it describes them (None: it does not)."""
        specs = self._description().get("output_specs")
        return None if specs is None else [TensorSpec.from_dict(d) for d in specs]

    def io_note(self) -> str | None:
        """What the inner runner says about its I/O types (quantised TFLite I/O), or None."""
        return self._description()["io_note"]

    def cannot_run(self) -> str | None:  # the inner runner class's answer
        return self._inner_class.cannot_run()

    def plain_load_warning(self, target: str, entry: dict) -> str | None:
        return self._inner_class.plain_load_warning(target, entry)

    def ran_in(self) -> dict | None:
        """{"process": "child", "frameworks": [...]} once a clean child has run the model; None before."""
        return {"process": "child", "frameworks": self.modules} if self.modules is not None else None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._call(feeds=feeds)["outputs"]
