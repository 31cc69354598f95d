"""One served model version: its contract check, where it runs, dynamic batching, and its timings.

`ServedModel.infer(feeds, t_in)` runs checked arrays and records the statistics extension's phases
for the request: queue (from the end of decoding to the start of the runtime call: the hop to the
runtime's thread, or the wait for a batch) and compute_infer (the runtime call). The runtime runs
on one thread of its own (`LocalRunner`), so the event loop decodes the next requests while it
computes; or on Ray Serve replicas (`serving/ray_serve.py`), awaited through their handle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from modelport.ir import TensorSpec
from modelport.packaging.requests import V2_DATATYPES
from modelport.serving.v2.codec import RequestError
from modelport.serving.v2.stats import Stats

log = logging.getLogger("modelport.serve")
REPLICA = "__replica__"  # a Ray replica's answer names itself under this key (`ray_serve.py`)
# (outputs, start of the runtime call, its duration in ns, requests in the call)
Result = tuple[dict[str, np.ndarray], int, int, int]


def shape_of(spec: TensorSpec) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in spec.shape]


def tensor_metadata(spec: TensorSpec) -> dict:
    """A tensor as v2 metadata names it: name, datatype, shape (-1 for a dynamic dim)."""
    return {"name": spec.name, "datatype": V2_DATATYPES[spec.dtype], "shape": shape_of(spec)}


def batch_dynamic(inputs: list[TensorSpec]) -> bool:
    """Whether every input leads with one symbolic dim (a batch requests can be stacked along)."""
    leads = {s.shape[0] if s.shape else None for s in inputs}
    return len(leads) == 1 and isinstance(next(iter(leads)), str)


def check_inputs(feeds: dict[str, np.ndarray], inputs: list[TensorSpec]) -> str | None:
    """Why `feeds` cannot run (a name, dtype or shape the contract does not take), or None."""
    if len(feeds) != len(inputs) or any(s.name not in feeds for s in inputs):
        return f"inputs {sorted(feeds)} given; the model takes {[s.name for s in inputs]}"
    for s in inputs:
        a = feeds[s.name]
        if a.dtype != np.dtype(s.dtype):
            return f"input '{s.name}' is {V2_DATATYPES.get(a.dtype.name, a.dtype.name)}; the model takes {V2_DATATYPES.get(s.dtype, s.dtype)}"
        want = shape_of(s)
        if a.ndim != len(want) or any(w not in (-1, n) for w, n in zip(want, a.shape, strict=True)):
            return f"input '{s.name}' has the shape {list(a.shape)}; the model takes {want} (-1: any size)"
    return None


INLINE_NS = 2_000_000  # a model whose last call took less runs on the event loop's thread


class LocalRunner:
    """The artifact's runner: `await call(feeds)` -> Result. A call runs on a thread of its own, so
    the event loop goes on decoding and answering health checks while it computes; a model whose
    last call took under `INLINE_NS` runs on the loop's thread instead, where the hop to a thread
    and back would cost more than the call (about 0.3 ms a request, measured)."""

    def __init__(self, runner):
        self.runner = runner
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="modelport-infer")
        self.last_ns = INLINE_NS  # the first call goes to the thread

    def _timed(self, feeds):
        start = time.perf_counter_ns()
        out = self.runner.run(feeds)
        self.last_ns = time.perf_counter_ns() - start
        return out, start, self.last_ns, 1

    async def call(self, feeds: dict[str, np.ndarray]) -> Result:
        if self.last_ns < INLINE_NS:
            return self._timed(feeds)
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._timed, feeds)

    def close(self) -> None:
        self.pool.shutdown(wait=False)


def timed(infer: Callable[[dict], Awaitable[dict]]):
    """A plain `infer(feeds) -> outputs` coroutine (a Ray replica's) as a Result-returning call."""

    async def call(feeds: dict[str, np.ndarray]) -> Result:
        start = time.perf_counter_ns()
        out = await infer(feeds)
        return out, start, time.perf_counter_ns() - start, 1

    return call


class Batcher:
    """Requests queued for at most `delay` seconds and run together, up to `limit` rows along axis 0;
    `call(feeds)` runs one (a `LocalRunner`'s or `timed(...)`); each caller gets its own rows."""

    def __init__(self, call, limit: int, delay: float):
        self.call, self.limit, self.delay = call, limit, delay
        self.queue: asyncio.Queue | None = None
        self.worker: asyncio.Task | None = None

    async def submit(self, feeds: dict[str, np.ndarray]) -> Result:
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.worker = asyncio.get_running_loop().create_task(self._loop())
        done = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((feeds, done))
        return await done

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self.queue.get()
            group, rows = [first], _rows(first[0])
            deadline = loop.time() + self.delay
            while rows < self.limit:
                if self.queue.empty():
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(self.queue.get(), left)
                    except TimeoutError:
                        break
                else:
                    item = self.queue.get_nowait()
                if not _same_shapes(first[0], item[0]):
                    loop.create_task(self._run([item]))  # another size: its own call
                    continue
                group.append(item)
                rows += _rows(item[0])
            await self._run(group)

    async def _run(self, group: list) -> None:
        feeds = {k: np.concatenate([g[0][k] for g in group]) for k in group[0][0]} if len(group) > 1 else group[0][0]
        try:
            out, start, ns, _ = await self.call(feeds)
            replica = {REPLICA: out.pop(REPLICA)} if REPLICA in out else {}
            at = 0
            for item, done in group:
                n = _rows(item)
                if not done.done():
                    mine = {k: v[at:at + n] for k, v in out.items()} if len(group) > 1 else out
                    done.set_result(({**mine, **replica}, start, ns, len(group)))
                at += n
        except Exception as e:  # every caller of the group still waiting gets the error; the loop goes on
            for _, done in group:
                if not done.done():
                    done.set_exception(e)


def _rows(feeds: dict[str, np.ndarray]) -> int:
    return int(next(iter(feeds.values())).shape[0])


def _same_shapes(a: dict, b: dict) -> bool:
    return all(k in b and a[k].shape[1:] == b[k].shape[1:] and a[k].dtype == b[k].dtype for k in a)


@dataclass
class ServedModel:
    """A model version the front ends answer for. `call`: the runtime (a `LocalRunner.call`, or
    `timed(ray replica)`); `batcher` when dynamic batching is on; `tag`: a response parameter
    naming this worker (set when several workers serve)."""

    name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    call: Callable[[dict], Awaitable[Result]]
    stats: Stats
    version: str = "1"
    platform: str = ""
    batcher: Batcher | None = None
    tag: dict = field(default_factory=dict)
    close: Callable[[], None] | None = None
    precision: str = "fp32"  # the artifact's: the tolerance a candidate version is judged with
    reference: dict | None = None  # the reference sample's inputs, where the artifact has one
    mirror: Callable[[dict, dict], None] | None = None  # set while a candidate version shadows this one

    def __post_init__(self):
        self.slot = self.stats.slot(self.name, self.version)
        self.stats.restart(self.slot)
        self.inflight = 0
        self.output_names = [s.name for s in self.outputs]
        self.datatypes = {s.name: V2_DATATYPES[s.dtype] for s in self.outputs}
        self.dtypes = {s.name: np.dtype(s.dtype) for s in self.outputs}
        self.batch_dim = batch_dynamic(self.inputs)  # inference_count counts rows

    def begin(self) -> None:
        """A request of this version is in the server (until `end`): counted for draining and the pending gauge."""
        self.inflight += 1
        self.stats.pending(self.slot, 1)

    def end(self) -> None:
        self.inflight -= 1
        self.stats.pending(self.slot, -1)

    def enable_batching(self, max_batch_size: int, max_queue_delay_ms: float) -> None:
        self.batcher = Batcher(self.execute, max_batch_size, max_queue_delay_ms / 1000)

    def metadata(self) -> dict:
        return {"name": self.name, "versions": [self.version], "platform": self.platform,
                "inputs": [tensor_metadata(s) for s in self.inputs], "outputs": [tensor_metadata(s) for s in self.outputs]}

    async def execute(self, feeds: dict[str, np.ndarray]) -> Result:
        """One runtime call (of one request, or of a batch), counted once."""
        result = await self.call(feeds)
        self.stats.execution(self.slot, _rows(feeds) if self.batch_dim else 1)
        return result

    async def answer(self, feeds: dict[str, np.ndarray], wanted: list[str] | None, received_at: int):
        """What both front ends do with a decoded request: the contract check (400 with the reason),
        compute_input recorded from `received_at`, the run, and the outputs asked for (None: all)."""
        reason = check_inputs(feeds, self.inputs)
        if reason:
            raise RequestError(400, reason)
        unknown = [o for o in wanted or () if o not in self.datatypes]
        if unknown:
            raise RequestError(400, f"output {unknown[0]!r} is not one of the model's {self.output_names}")
        decoded_at = time.perf_counter_ns()
        self.stats.phase(self.slot, "compute_input", decoded_at - received_at)
        outputs, params = await self.infer(feeds, decoded_at)
        if wanted is not None:
            outputs = [o for o in outputs if o[0] in wanted]
        return outputs, params

    async def infer(self, feeds: dict[str, np.ndarray], decoded_at: int) -> tuple[list[tuple[str, str, np.ndarray]], dict]:
        """Run checked `feeds`; (name, datatype, array) per output in the contract's order, and the
        response's parameters. Records queue and compute_infer; the caller records the rest."""
        out, start, ns, _ = await (self.batcher.submit(feeds) if self.batcher is not None else self.execute(feeds))
        self.stats.phase(self.slot, "queue", max(0, start - decoded_at))
        self.stats.phase(self.slot, "compute_infer", ns)
        if self.mirror is not None:
            self.mirror(feeds, out)
        params = dict(self.tag)
        if REPLICA in out:
            params["replica"] = str(out.pop(REPLICA))
            log.info("infer answered by replica %s", params["replica"])
        got = []
        for name in self.output_names:
            a = out[name]
            if not isinstance(a, np.ndarray) or a.dtype != self.dtypes[name]:
                a = np.asarray(a).astype(self.dtypes[name], copy=False)
            got.append((name, self.datatypes[name], a))
        return got, params


def local_model(name: str, runner, inputs: list[TensorSpec], outputs: list[TensorSpec], stats: Stats, *, platform: str,
                max_batch_size: int = 0, max_queue_delay_ms: float = 2.0, tag: dict | None = None, version: str = "1") -> ServedModel:
    """A model answered by `runner` (the artifact's, `modelport.runtimes`) in this process."""
    local = LocalRunner(runner)
    model = ServedModel(name, inputs, outputs, local.call, stats, version=version, platform=platform, tag=tag or {}, close=local.close)
    if max_batch_size > 1:
        model.enable_batching(max_batch_size, max_queue_delay_ms)
    return model
