"""Calling a retriever: one or several replicas behind one client, with failover and retries; and the one-address
proxy a rollout worker gives slime-style generate functions.

    pool = RetrieverPool([lambda: "http://127.0.0.1:8000"], key="...", timeout=30)
    answer = await pool.retrieve(["zorvik age"], topk=3, return_scores=True)    # Search-R1's {"result": ...}
    status, answer = await pool.post({"queries": [...], ...})                     # as the replica answered
    await pool.close()

    proxy = RetrieveProxy(pool.post)          # POST /retrieve on 127.0.0.1, forwarded with the key
    url = await proxy.start()                 # http://127.0.0.1:PORT (its /retrieve is Search-R1's)

Replicas. Each replica is reached at the URL its `resolve` gives (a coroutine function or a plain one: the job's
replicas are asked for theirs -- a restarted replica listens on a new port -- an external retriever's is fixed).
Requests go round-robin. A replica that cannot be reached, times out (`timeout`), or answers 5xx is set aside for a
moment (its URL asked again before its next use) and the request goes to the next one; when every replica is set
aside the client waits and tries again, until `deadline` seconds have passed since the request began -- long enough
for a killed replica to be restarted. Retrieval only reads, so sending a request again is harmless. A 4xx answer
(a bad body, a wrong key) is the request's own fault: returned (`post`) or raised (`retrieve`) at once. So is an
answer of more than `max_answer_bytes` (64 MiB; Search-R1's answer to a batch of queries is a few MB): read no further
(http_answers.py), RetrieverError at once -- a replica that answers without end does not fill the worker's memory.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..http_answers import AnswerTooLarge, read_answer
from ..json_files import parse_json
from ..log import get_logger

RETRY_STATUSES = frozenset({500, 502, 503, 504})
SET_ASIDE_S = 1.0
MAX_ANSWER_BYTES = 64 << 20


class RetrieverError(RuntimeError):
    """A retrieval that failed: `status` the HTTP status (None: no replica answered), `detail` the answer's."""

    def __init__(self, message: str, status: int | None = None, detail: Any = None):
        super().__init__(message)
        self.status, self.detail = status, detail


def retrieve_url(base: str) -> str:
    """http://host:port or http://host:port/retrieve -> the /retrieve URL."""
    base = base.rstrip("/")
    return base if base.endswith("/retrieve") else base + "/retrieve"


class ReplicaUnreachable(RuntimeError):
    """One try at one replica that got no answer (refused connection, reset, timeout)."""


async def _direct(fn, *args):
    return await fn(*args)


class RetrieverPool:
    """`clock`: the monotonic clock the set-aside moments and the deadline are read from; `call(fn, *args)`: how
    each try (`fn`: one HTTP request, raising ReplicaUnreachable) is made -- a rollout worker records each as an
    input of its trace (actors/rollout_retrieval.py), so that a replay takes the same turns."""

    def __init__(self, resolvers: list[Callable[[], Any]], key: str | None = None, timeout: float = 30.0,
                 deadline: float = 120.0, clock: Callable[[], float] = time.monotonic,
                 call: Callable[..., Awaitable[Any]] = _direct, max_answer_bytes: int = MAX_ANSWER_BYTES):
        if not resolvers:
            raise ValueError("a retriever pool needs at least one replica")
        self.resolvers, self.key, self.timeout, self.deadline = resolvers, key, timeout, deadline
        self.clock, self.call, self.max_answer_bytes = clock, call, max_answer_bytes
        self._urls: list[str | None] = [None] * len(resolvers)
        self._aside: list[float] = [0.0] * len(resolvers)
        self._next = 0
        self._session = None
        self.counters = {"requests": 0, "retries": 0, "failed": 0}
        self.log = get_logger(component="retriever-client")

    @property
    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    async def _url(self, i: int) -> str:
        if self._urls[i] is None:
            got = self.resolvers[i]()
            if inspect.isawaitable(got):
                got = await got
            self._urls[i] = retrieve_url(str(got))
        return self._urls[i]

    def _set_aside(self, i: int, now: float) -> None:
        self._urls[i] = None
        self._aside[i] = now + SET_ASIDE_S

    def _pick(self, now: float) -> int | None:
        n = len(self.resolvers)
        for k in range(n):
            i = (self._next + k) % n
            if self._aside[i] <= now:
                self._next = (i + 1) % n
                return i
        return None

    async def _try(self, url: str, data: str) -> list:
        """One HTTP request: [status, text]; ReplicaUnreachable when no answer came, RetrieverError (not retried) when
        the answer is over the bound."""
        import aiohttp
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.post(url, data=data, headers=self.headers,
                                          timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                body = await read_answer(resp, self.max_answer_bytes)
                return [resp.status, body.decode("utf-8", "replace")]
        except AnswerTooLarge as exc:
            raise RetrieverError(f"{exc}; a retriever's answer is a few MB (not retried)") from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise ReplicaUnreachable(f"{url}: {type(exc).__name__}: {exc}") from None

    async def post(self, body: Any) -> tuple[int, Any]:
        """(status, JSON answer) of the first replica that answers other than 5xx; RetrieverError when none does
        within `deadline` seconds."""
        self.counters["requests"] += 1
        data = json.dumps(body)
        t0 = self.clock()
        last = "no replica tried"
        tries = 0
        while True:
            now = self.clock()
            i = self._pick(now)
            if i is None:
                if now - t0 > self.deadline:
                    break
                await asyncio.sleep(min(SET_ASIDE_S, max(0.05, min(self._aside) - now)))
                continue
            if tries:
                self.counters["retries"] += 1
            tries += 1
            try:
                url = await self._url(i)
                status, text = await self.call(self._try, url, data)
                if status in RETRY_STATUSES:
                    last = f"replica {i} answered {status}: {text[:200]}"
                    self._set_aside(i, self.clock())
                else:
                    try:
                        return status, parse_json(text)
                    except ValueError:
                        return status, {"detail": text[:2000]}
            except RetrieverError:
                self.counters["failed"] += 1
                raise
            except RuntimeError as exc:
                # (ReplicaUnreachable; or the job's replica could not be asked for its address: not up yet)
                last = f"replica {i}: {exc}"
                self._set_aside(i, self.clock())
            if self.clock() - t0 > self.deadline:
                break
            self.log.warning("retrieval failed; trying again", error=last, attempt=tries)
        self.counters["failed"] += 1
        raise RetrieverError(f"no retriever replica answered within {self.deadline:g}s ({tries} tries); last: {last}")

    async def retrieve(self, queries: list[str], topk: int | None = None, return_scores: bool = True) -> dict:
        """Search-R1's answer {"result": [...]} for these queries; RetrieverError for a refusal or no answer."""
        status, answer = await self.post({"queries": list(queries), "topk": topk, "return_scores": return_scores})
        if status != 200:
            raise RetrieverError(f"the retriever refused the request (HTTP {status}): "
                                 f"{json.dumps(answer.get('detail') if isinstance(answer, dict) else answer)[:500]}",
                                 status, answer)
        return answer

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


Forward = Callable[[dict], Awaitable[tuple[int, Any]]]


class RetrieveProxy:
    """POST /retrieve on 127.0.0.1 (and GET /health), each body forwarded by `forward` -- a pool's `post`, with the
    job's key and failover. For functions written against one retriever URL and no key (slime's search-r1
    generate function): they get this proxy's URL."""

    def __init__(self, forward: Forward, host: str = "127.0.0.1", max_body_bytes: int = 4 << 20):
        self.forward, self.host, self.max_body_bytes = forward, host, max_body_bytes
        self.port: int | None = None
        self._runner = None

    async def start(self) -> str:
        from aiohttp import web
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post("/retrieve", self._retrieve)
        app.router.add_get("/health", self._health)
        from ..backends.generate_proxy import start_site
        self._runner, self.port = await start_site(app, self.host)
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @staticmethod
    async def _health(request):
        from aiohttp import web
        return web.json_response({"status": "ok"})

    async def _retrieve(self, request):
        from aiohttp import web
        try:
            body = parse_json(await request.read())
        except ValueError as exc:   # (also UnicodeDecodeError, and JSON nested too deep to be read)
            return web.json_response({"detail": [{"type": "json_invalid", "loc": ["body", getattr(exc, "pos", 0)],
                                                  "msg": "JSON decode error", "input": {}}]}, status=422)
        try:
            status, answer = await self.forward(body)
        except RetrieverError as exc:
            return web.json_response({"detail": str(exc)}, status=exc.status or 503)
        return web.Response(text=json.dumps(answer), status=status, content_type="application/json")
