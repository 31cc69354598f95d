"""A repository served by several workers (`serve REPO --workers N`): each worker's repository
hands the loads and unloads it takes to the others over their private unix sockets, and a worker
that starts while others serve follows their index before it serves."""

from __future__ import annotations

import asyncio
import json
import logging

from modelport.serving.v2.codec import RequestError
from modelport.serving.v2.repository import Repository

log = logging.getLogger("modelport.serve")

PEER_HEADER = "x-modelport-peer"  # a load or unload handed on by another worker: not handed on again


class Peers:
    """A repository served by several workers: a load or unload one worker takes reaches the others
    (over their private unix sockets, in the supervisor's 0700 folder) before it answers; their
    failures are part of the answer. A worker that starts while others serve (one replacing a worker
    that died) takes their loads and unloads before it serves: it follows the index of the first
    peer that answers. Everything else is the worker's own repository's."""

    def __init__(self, repo: Repository, sockets: list[str]):
        self.repo, self.sockets = repo, sockets

    def __getattr__(self, name):
        return getattr(self.repo, name)

    async def start(self) -> None:
        await self.repo.start()
        for path in self.sockets:
            index = await _index_of(path)
            if index is not None:
                await self._follow(index)
                return

    async def _follow(self, index: list[dict]) -> None:
        """Load what the peer serves and this worker does not; unload what the peer's user unloaded."""
        mine = self.repo.index()
        ready = {r["name"] for r in mine if r["state"] == "READY"}
        theirs: dict[str, list[dict]] = {}
        for row in index:
            theirs.setdefault(row["name"], []).append(row)
        for name, rows in theirs.items():
            if name not in self.repo.entries:
                continue
            try:
                if any(r["state"] == "READY" for r in rows) and name not in ready:
                    await self.repo.load(name)
                elif name in ready and all(r["state"] == "UNAVAILABLE" and r["reason"] == "unloaded" for r in rows):
                    await self.repo.unload(name)
            except Exception as e:  # the index gives this worker's own reason; the others serve on
                log.warning("serve: %s could not follow the other workers: %s", name, e)

    async def load(self, name: str, peer: bool = False) -> None:
        await self.repo.load(name)
        if not peer:
            await self._tell(name, "load")

    async def unload(self, name: str, peer: bool = False) -> None:
        await self.repo.unload(name)
        if not peer:
            await self._tell(name, "unload")

    async def _tell(self, name: str, action: str) -> None:
        results = await asyncio.gather(*[_post_unix(path, f"/v2/repository/models/{name}/{action}") for path in self.sockets],
                                       return_exceptions=True)
        failed = [f"worker {i}: {r}" for i, r in enumerate(results) if r is not None]
        if failed:
            raise RequestError(500, f"{action} of '{name}' did not reach every worker: {'; '.join(failed)}")


async def _index_of(path: str) -> list[dict] | None:
    """The repository index of the worker on unix socket `path`; None when it does not answer."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), 5)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(f"POST /v2/repository/index HTTP/1.1\r\nhost: worker\r\n{PEER_HEADER}: 1\r\ncontent-length: 2\r\n"
                     "connection: close\r\n\r\n{}".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
        return None
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    try:
        return json.loads(body)
    except ValueError:
        return None


def _unchunk(body: bytes) -> bytes:
    out, rest = b"", body
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2:]
    return out


async def _post_unix(path: str, route: str) -> str | None:
    """POST `route` to a worker's unix socket; None when it answered 200, else why not."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), 10)
    except (OSError, TimeoutError) as e:
        return f"unreachable ({type(e).__name__})"
    try:
        writer.write(f"POST {route} HTTP/1.1\r\nhost: worker\r\n{PEER_HEADER}: 1\r\ncontent-length: 0\r\n"
                     "connection: close\r\n\r\n".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 600)
    finally:
        writer.close()
    status = answer.split(b" ", 2)[1] if answer.count(b" ") >= 2 else b"?"
    return None if status == b"200" else answer.split(b"\r\n\r\n", 1)[-1].decode(errors="replace")[:300]
