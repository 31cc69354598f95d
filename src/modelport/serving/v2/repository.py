"""A model repository served live: many models, versions, load and unload without a dropped request.

The folder is Triton's layout: `NAME/config.pbtxt` (optional) and `NAME/<version>/`, each version
a model file (`package --for triton` writes them) or a `modelport convert` output folder. The
config's `version_policy` says which versions serve (`latest { num_versions: N }`, Triton's
default of the newest one; `all {}`; `specific { versions: [...] }`); the newest ready one answers
requests that name no version.

A version goes live in this order: opened in its runtime and checked against its reference sample
(on a thread: the server keeps answering), then switched in (the next request that names no
version gets it), then the version it replaces is drained (its requests in flight finish) and
unloaded. A version that fails to open or to pass its check never serves; the previous one keeps
serving and the index gives the reason: rollback by construction.

`control`: `none` loads everything at start and refuses load/unload calls; `poll` also rescans
the folder every `poll_s` seconds and loads what changed; `explicit` loads everything at start and
takes load/unload calls (a load rescans that model's folder: the way to roll out a new version).

`rollout="parity"` gates the switch: the new version must give the serving version's answers
within the tolerance of its own precision, on the reference sample (both versions run it) and,
with `shadow=N`, on the next N live requests, mirrored to it after the serving version answered
them. A version that disagrees is held back (UNAVAILABLE, the output and the figures in the
index's reason; `modelport_rollout_held_back` in the metrics); the serving version stays.
`rollout="direct"` switches once the version passes its own check (a retrained model's answers
differ from the last one's by design).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelport.packaging.triton import parse_config
from modelport.run.memory import fmt_bytes, give_back, tree_rss
from modelport.serving.v2.codec import RequestError
from modelport.serving.v2.model import ServedModel

log = logging.getLogger("modelport.serve")
CONTROLS = ("none", "poll", "explicit")
ROLLOUTS = ("direct", "parity")
LOAD_FACTOR = 4.0  # a version's allowance under --max-memory: its files' bytes times this (measured: onnxruntime holds 3x a MatMul model's file)


def is_repository(path: Path) -> bool:
    """Whether `path` holds Triton's layout: a model folder with config.pbtxt, or numbered versions."""
    if not path.is_dir() or (path / "report.json").is_file():
        return False
    return any(d.is_dir() and ((d / "config.pbtxt").is_file() or any(v.is_dir() and v.name.isdigit() for v in d.iterdir()))
               for d in path.iterdir())


@dataclass
class Version:
    version: str
    path: Path
    state: str = "UNAVAILABLE"  # READY, LOADING, UNLOADING, UNAVAILABLE
    reason: str = ""
    model: ServedModel | None = None


@dataclass
class Entry:
    name: str
    versions: dict[str, Version] = field(default_factory=dict)
    default: str | None = None  # the version answering requests that name none
    last_used: float = 0.0  # monotonic time of its last request: the least recently used goes first
    note: str = "unloaded"  # the index's reason while no version is loaded
    unloaded: list[str] = field(default_factory=list)  # the versions it served before its unload: the index lists them, as Triton's does


def wanted_versions(model_dir: Path) -> list[tuple[str, Path]]:
    """The versions the model's policy serves, oldest first."""
    found = sorted((int(v.name), v) for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit())
    config = model_dir / "config.pbtxt"
    if config.is_file():

        policy = parse_config(config.read_text()).version_policy
        kind = policy.WhichOneof("policy_choice")
        if kind == "all":
            return [(str(n), p) for n, p in found]
        if kind == "specific":
            keep = set(policy.specific.versions)
            return [(str(n), p) for n, p in found if n in keep]
        if kind == "latest":
            return [(str(n), p) for n, p in found[-max(1, policy.latest.num_versions):]]
    return [(str(n), p) for n, p in found[-1:]]


class Repository:
    """The live registry the front ends answer from. `opener(name, version, path)` opens and checks
    one version and returns its ServedModel (blocking; run on a thread); it raises with the reason."""

    def __init__(self, root: Path, opener: Callable[[str, str, Path], ServedModel], control: str = "none", poll_s: float = 5.0,
                 rollout: str = "direct", shadow: int = 0, max_memory: int | None = None):
        self.root, self.opener, self.control, self.poll_s = root, opener, control, poll_s
        self.rollout, self.shadow, self.max_memory = rollout, shadow, max_memory
        self.lock: asyncio.Lock | None = None  # one change at a time (loads, unloads, evictions)
        self.loads: dict[str, int] = {}
        self.evictions: dict[str, int] = {}
        self.entries: dict[str, Entry] = {}
        self.held_back: dict[tuple[str, str], str] = {}  # (model, version) -> why it does not serve
        self.started = False

    # --- what requests read (on the event loop, no awaits: a switch is atomic for them)

    def resolve(self, name: str, version: str = "") -> ServedModel:
        entry = self.entries.get(name)
        if entry is None:
            raise RequestError(404, f"model '{name}' is not in the repository; it has {sorted(self.entries)}")
        v = entry.versions.get(version or entry.default or "")
        if v is None or v.model is None or v.state != "READY":
            which = f"version '{version}'" if version else "a ready version"
            state = f" ({v.state}{': ' + v.reason if v.reason else ''})" if v is not None else ""
            raise RequestError(404 if v is None else 503, f"model '{name}' has no {which}{state}")
        return v.model

    def ready(self) -> bool:
        return self.started

    def loaded(self) -> list[ServedModel]:
        return [v.model for e in self.entries.values() for v in e.versions.values() if v.model is not None]

    def index(self, ready_only: bool = False) -> list[dict]:
        out = []
        for name in sorted(self.entries):
            entry = self.entries[name]
            if not entry.versions:
                if not ready_only:
                    out += [{"name": name, "version": v, "state": "UNAVAILABLE", "reason": entry.note} for v in entry.unloaded or [""]]
                continue
            for v in sorted(entry.versions.values(), key=lambda v: int(v.version)):
                if not ready_only or v.state == "READY":
                    out.append({"name": name, "version": v.version, "state": v.state, "reason": v.reason})
        return out

    # --- changes

    def _model_dirs(self) -> dict[str, Path]:
        return {d.name: d for d in sorted(self.root.iterdir()) if d.is_dir() and not d.name.startswith(".")}

    async def start(self) -> None:
        """Every model loaded, or with a memory bound, listed: each loads on its first request."""
        self.lock = asyncio.Lock()
        for name in self._model_dirs():
            if self.max_memory is None:
                await self.load(name, strict=False)
            else:
                self.entries.setdefault(name, Entry(name, note="not loaded yet: it loads on its first request (--max-memory)"))
        self.started = True

    async def get(self, name: str, version: str = "") -> ServedModel:
        """The model version a request goes to; under a memory bound, loaded on its first request."""
        entry = self.entries.get(name)
        if entry is not None:
            entry.last_used = time.monotonic()
            if self.max_memory is not None and not entry.versions:
                await self.load(name)
        return self.resolve(name, version)

    async def load(self, name: str, strict: bool = True, peer: bool = False) -> None:
        """Load (or reload) `name` from the folder: new versions in, versions the policy drops out.
        With a shadowed parity rollout the call returns once the candidate passed the reference
        sample; it switches in after its mirrored requests (the index says how many so far)."""
        path = self._model_dirs().get(name)
        if path is None:
            raise RequestError(400, f"no model '{name}' in the repository folder {self.root}")
        entry = self.entries.setdefault(name, Entry(name))
        async with self.lock:
            wanted = wanted_versions(path)
            failed = []
            for version, vpath in wanted:
                have = entry.versions.get(version)
                if have is not None and have.state in ("READY", "LOADING"):
                    continue
                v = Version(version, vpath, "LOADING")
                entry.versions[version] = v
                try:
                    if self.max_memory is not None:
                        await self._make_room(entry, vpath)
                    v.model = await asyncio.get_running_loop().run_in_executor(None, self.opener, name, version, vpath)
                    self.loads[name] = self.loads.get(name, 0) + 1
                    serving = self._serving(entry)
                    if self.rollout == "parity" and serving is not None:
                        await self._gate(entry, serving, v)
                        if self.shadow > 0:
                            v.reason = f"shadowing: 0 of {self.shadow} live requests compared"
                            asyncio.get_running_loop().create_task(self._shadow_then_switch(entry, serving, v, {x for x, _ in wanted}))
                            continue
                    v.state, v.reason = "READY", ""
                    self.held_back.pop((name, version), None)
                    log.info("serve: %s version %s loaded", name, version)
                except Exception as e:  # never served; what serves keeps serving
                    self._fail(entry.name, v, e)
                    failed.append(f"version {version}: {v.reason}")
            await self._switch(entry, {version for version, _ in wanted})
            if failed and strict:
                raise RequestError(400, f"model '{name}': {'; '.join(failed)}")

    def _fail(self, name: str, v: Version, error: Exception) -> None:
        if v.model is not None and v.model.close:
            v.model.close()
        v.model = None
        v.state, v.reason = "UNAVAILABLE", " ".join(str(error).split())[:400]
        log.warning("serve: %s version %s was not loaded: %s", name, v.version, v.reason)

    async def _switch(self, entry: Entry, keep: set[str]) -> None:
        """The newest ready version the policy keeps answers unversioned requests (if none, the one
        serving stays); ready versions the policy drops are drained and unloaded."""
        live = [v for v in entry.versions.values() if v.state == "READY" and v.version in keep]
        if live:
            entry.default = max(live, key=lambda v: int(v.version)).version
        for v in list(entry.versions.values()):
            if v.version not in keep and v.state == "READY" and v.version != entry.default:
                await self._retire(entry, v)

    async def _shadow_then_switch(self, entry: Entry, serving: ServedModel, v: Version, keep: set[str]) -> None:
        try:
            await self._shadow(entry, serving, v)
        except Exception as e:
            self._fail(entry.name, v, e)
            return
        async with self.lock:
            v.state, v.reason = "READY", ""
            log.info("serve: %s version %s loaded after %d mirrored requests", entry.name, v.version, self.shadow)
            await self._switch(entry, keep)

    @staticmethod
    def _serving(entry: Entry) -> ServedModel | None:
        v = entry.versions.get(entry.default or "")
        return v.model if v is not None and v.state == "READY" else None

    async def _gate(self, entry: Entry, serving: ServedModel, v: Version) -> None:
        """The candidate's answers against the serving version's on the reference sample (both run
        it). Raises (held back) with the disagreement."""
        candidate = v.model
        sample = candidate.reference or serving.reference
        if sample is not None:
            feeds = {k: np.asarray(a) for k, a in sample.items()}
            (want, *_), (got, *_) = await serving.call(feeds), await candidate.call(feeds)
            self._judge(entry.name, v.version, candidate, want, got, "the reference sample")

    async def _shadow(self, entry: Entry, serving: ServedModel, v: Version) -> None:
        """The next `shadow` live requests, mirrored to the candidate after the serving version answered."""
        candidate = v.model
        pending: asyncio.Queue = asyncio.Queue()
        taken = [0]

        def mirror(feeds, out):  # no more than the rollout needs
            if taken[0] < self.shadow:
                taken[0] += 1
                pending.put_nowait((feeds, {k: np.array(a) for k, a in out.items()}))

        serving.mirror = mirror
        try:
            for i in range(self.shadow):
                feeds, want = await pending.get()
                got, *_ = await candidate.call(feeds)
                self._judge(entry.name, v.version, candidate, want, got, f"mirrored live request {i + 1}")
                v.reason = f"shadowing: {i + 1} of {self.shadow} live requests compared"
        finally:
            serving.mirror = None

    def _judge(self, name: str, version: str, candidate: ServedModel, want: dict, got: dict, on: str) -> None:
        from modelport.validation import compare, tolerance_for

        parity = compare({k: np.asarray(a) for k, a in want.items() if k in candidate.output_names},
                         {k: np.asarray(a) for k, a in got.items()}, tolerance_for(candidate.precision),
                         hop=f"{name} version {version} against the serving version")
        if not parity.ok:
            why = f"held back: its answers differ from the serving version's on {on}: {parity.summary()}"
            self.held_back[(name, version)] = why
            raise RuntimeError(why)

    def metrics(self) -> str:
        """Prometheus lines: each version held back by a parity rollout, and why."""
        lines = ["# HELP modelport_rollout_held_back a version held back by a parity rollout (the reason in its label)",
                 "# TYPE modelport_rollout_held_back gauge"]
        for (name, version), why in sorted(self.held_back.items()):
            reason = why.replace("\\", "\\\\").replace('"', '\\"')[:200]
            lines.append(f'modelport_rollout_held_back{{model="{name}",version="{version}",reason="{reason}"}} 1')
        for metric, counts, what in (("modelport_model_loads_total", self.loads, "versions loaded"),
                                     ("modelport_model_evictions_total", self.evictions, "unloads to stay under --max-memory")):
            lines += [f"# HELP {metric} {what}", f"# TYPE {metric} counter"]
            lines += [f'{metric}{{model="{name}"}} {counts.get(name, 0)}' for name in sorted(self.entries)]
        return "\n".join(lines) + "\n"

    async def unload(self, name: str, peer: bool = False) -> None:
        entry = self.entries.get(name)
        if entry is None:
            raise RequestError(400, f"model '{name}' is not in the repository")
        async with self.lock:
            await self._unload(entry)

    async def _unload(self, entry: Entry, note: str = "unloaded") -> None:
        entry.default, entry.note = None, note
        entry.unloaded = sorted(entry.versions, key=int)
        for v in list(entry.versions.values()):
            if v.state == "READY":
                await self._retire(entry, v)
        entry.versions.clear()

    async def _make_room(self, entry: Entry, path: Path) -> None:
        """Unload the least recently used models until this version's allowance fits under the
        bound (the process tree's RSS); a version that cannot fit even then is a 503 naming both."""

        files = path.rglob("*") if path.is_dir() else [path]
        need = int(LOAD_FACTOR * sum(p.stat().st_size for p in files if p.is_file()))
        while (tree_rss() or 0) + need > self.max_memory:
            loaded = [e for e in self.entries.values() if e is not entry and any(v.state == "READY" for v in e.versions.values())]
            if not loaded:
                raise RequestError(503, f"model '{entry.name}' needs about {fmt_bytes(need)} to load; with every other model "
                                        f"unloaded the server holds {fmt_bytes(tree_rss() or 0)} of --max-memory {fmt_bytes(self.max_memory)}")
            victim = min(loaded, key=lambda e: e.last_used)
            await self._unload(victim, "unloaded to make room for another model (--max-memory); it loads again on its next request")
            give_back()
            self.evictions[victim.name] = self.evictions.get(victim.name, 0) + 1
            log.info("serve: %s unloaded to make room for %s (--max-memory)", victim.name, entry.name)

    async def _retire(self, entry: Entry, v: Version) -> None:
        """Out of service, drained (requests in flight finish), unloaded."""
        v.state = "UNLOADING"
        model = v.model
        while model is not None and model.inflight:
            await asyncio.sleep(0.005)
        if model is not None and model.close:
            model.close()
        v.model, v.state, v.reason = None, "UNAVAILABLE", "unloaded"
        entry.versions.pop(v.version, None)
        log.info("serve: %s version %s unloaded", entry.name, v.version)

    async def poll(self) -> None:
        """`--model-control poll`: rescan the folder every poll_s seconds."""
        while True:
            await asyncio.sleep(self.poll_s)
            dirs = self._model_dirs()
            for name in dirs:
                try:
                    await self.load(name, strict=False)
                except Exception as e:
                    log.warning("serve: polling %s: %s", name, e)
            for name in [n for n in self.entries if n not in dirs]:
                await self.unload(name)
                self.entries.pop(name, None)


class Fixed:
    """One artifact, always loaded (`serve FOLDER|FILE`): the registry without model control."""

    control = "none"

    def __init__(self, models: dict[str, ServedModel]):
        self.models = models

    def resolve(self, name: str, version: str = "") -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise RequestError(404, f"model '{name}' is not served here; it serves {sorted(self.models)}")
        if version and version != model.version:
            raise RequestError(404, f"model '{name}' has no version '{version}'; it serves {model.version}")
        return model

    async def get(self, name: str, version: str = "") -> ServedModel:
        return self.resolve(name, version)

    def ready(self) -> bool:
        return True

    def loaded(self) -> list[ServedModel]:
        return list(self.models.values())

    def index(self, ready_only: bool = False) -> list[dict]:
        return [{"name": m.name, "version": m.version, "state": "READY", "reason": ""} for m in self.models.values()]

    def metrics(self) -> str:
        return ""

    async def load(self, name: str, peer: bool = False) -> None:
        raise RequestError(400, "model control is off: this server serves one artifact (serve a repository folder with "
                                "--model-control explicit to load and unload)")

    unload = load

    async def start(self) -> None:
        pass
