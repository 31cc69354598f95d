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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modelport.serving.v2.codec import RequestError
from modelport.serving.v2.model import ServedModel

log = logging.getLogger("modelport.serve")
CONTROLS = ("none", "poll", "explicit")


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
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def wanted_versions(model_dir: Path) -> list[tuple[str, Path]]:
    """The versions the model's policy serves, oldest first."""
    found = sorted((int(v.name), v) for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit())
    config = model_dir / "config.pbtxt"
    if config.is_file():
        from modelport.serving.triton import parse_config

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

    def __init__(self, root: Path, opener: Callable[[str, str, Path], ServedModel], control: str = "none", poll_s: float = 5.0):
        self.root, self.opener, self.control, self.poll_s = root, opener, control, poll_s
        self.entries: dict[str, Entry] = {}
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
                    out.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": "unloaded"})
                continue
            for v in sorted(entry.versions.values(), key=lambda v: int(v.version)):
                if not ready_only or v.state == "READY":
                    out.append({"name": name, "version": v.version, "state": v.state, "reason": v.reason})
        return out

    # --- changes

    def _model_dirs(self) -> dict[str, Path]:
        return {d.name: d for d in sorted(self.root.iterdir()) if d.is_dir() and not d.name.startswith(".")}

    async def start(self) -> None:
        for name in self._model_dirs():
            await self.load(name, strict=False)
        self.started = True

    async def load(self, name: str, strict: bool = True) -> None:
        """Load (or reload) `name` from the folder: new versions in, versions the policy drops out."""
        path = self._model_dirs().get(name)
        if path is None:
            raise RequestError(400, f"no model '{name}' in the repository folder {self.root}")
        entry = self.entries.setdefault(name, Entry(name))
        async with entry.lock:
            wanted = wanted_versions(path)
            failed = []
            for version, vpath in wanted:
                have = entry.versions.get(version)
                if have is not None and have.state == "READY":
                    continue
                v = Version(version, vpath, "LOADING")
                entry.versions[version] = v
                try:
                    v.model = await asyncio.get_running_loop().run_in_executor(None, self.opener, name, version, vpath)
                    v.state, v.reason = "READY", ""
                    log.info("serve: %s version %s loaded", name, version)
                except Exception as e:  # never served; what serves keeps serving
                    v.state, v.reason = "UNAVAILABLE", " ".join(str(e).split())[:300]
                    failed.append(f"version {version}: {v.reason}")
                    log.warning("serve: %s version %s was not loaded: %s", name, version, v.reason)
            keep = {version for version, _ in wanted}
            ready = [v for v in entry.versions.values() if v.state == "READY"]
            # the newest ready version the policy keeps answers unversioned requests; if none, the one serving stays
            live = [v for v in ready if v.version in keep]
            if live:
                entry.default = max(live, key=lambda v: int(v.version)).version
            for v in list(entry.versions.values()):
                if v.version not in keep and v.state == "READY" and v.version != entry.default:
                    await self._retire(entry, v)
            if failed and strict:
                raise RequestError(400, f"model '{name}': {'; '.join(failed)}")

    async def unload(self, name: str) -> None:
        entry = self.entries.get(name)
        if entry is None:
            raise RequestError(400, f"model '{name}' is not in the repository")
        async with entry.lock:
            entry.default = None
            for v in list(entry.versions.values()):
                if v.state == "READY":
                    await self._retire(entry, v)
            entry.versions.clear()

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

    def ready(self) -> bool:
        return True

    def loaded(self) -> list[ServedModel]:
        return list(self.models.values())

    def index(self, ready_only: bool = False) -> list[dict]:
        return [{"name": m.name, "version": m.version, "state": "READY", "reason": ""} for m in self.models.values()]

    async def load(self, name: str) -> None:
        raise RequestError(400, "model control is off: this server serves one artifact (serve a repository folder with "
                                "--model-control explicit to load and unload)")

    unload = load

    async def start(self) -> None:
        pass
