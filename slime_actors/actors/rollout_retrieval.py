"""A rollout worker's side of the retriever: one client for the job's replicas (or the retriever named by
--retriever-url), every call recorded in the worker's trace like an engine's answer, so `slime-actors replay`
serves it back; and, for slime-style generate functions, one address on the worker's loopback.

    link = RetrieverLink(worker)                     # in RolloutWorker.on_start, with --retriever-corpus / -url
    answer = await link.retrieve(["zorvik age"])     # Search-R1's {"result": [...]} (return_scores true)
    url = await link.start_proxy()                   # http://127.0.0.1:PORT: args.retriever_url of slime-style fns
    await link.stop()

The job's replicas are found by name (`retriever/0` .. `retriever/N-1`, asked for their address: a restarted one
listens on a new port) and spread over by search/client.py's RetrieverPool: a replica that dies mid-request is set
aside and the request sent to another, or to the same one once restarted, within --retriever-timeout per try and
two minutes in all; then the call fails with RetrieverError, which the generate function (or environment) sees.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

from ..mailbox.errors import MailboxError
from ..role_handles import RetrieverHandle

POOL_DEADLINE_S = 120.0   # how long one call keeps trying (a replica's restart takes seconds)


def body_key(body: Any) -> str:
    """Which request a recorded answer belongs to (concurrent answers come back in any order)."""
    return hashlib.blake2b(json.dumps(body, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


class RetrieverLink:
    def __init__(self, worker):
        from ..env import RETRIEVER_KEY
        from ..search.client import RetrieverPool
        self.worker = worker
        r = worker.cfg.retriever
        resolvers: list[Callable[[], Any]]
        if r.retriever_url:
            url = r.retriever_url
            resolvers = [lambda: url]
        else:
            resolvers = [self._resolver(i) for i in range(r.retriever_num_replicas)]
        self.topk = r.retriever_topk
        # each HTTP try is a recorded input and the clock the recorded one; the addresses are asked by message: so
        # the retry loop runs here, in the worker, and a replay takes the same turns
        self.pool = RetrieverPool(resolvers, key=RETRIEVER_KEY.get(), timeout=r.retriever_timeout,
                                  deadline=POOL_DEADLINE_S, clock=worker.monotonic, call=self._recorded_try)
        self.proxy = None
        self.proxy_url: str | None = None

    def _resolver(self, i: int):
        async def resolve() -> str:
            try:
                return (await RetrieverHandle(self.worker, f"retriever/{i}").address(ask_timeout=10)).url
            except MailboxError as exc:   # not up (yet, again): the pool sets this replica aside for a moment
                raise RuntimeError(f"retriever/{i} is not reachable: {exc}") from None
        return resolve

    async def _recorded_try(self, fn, url: str, data: str) -> list:
        # keyed by the body alone: a replay's try of it may go to the replica at another port
        return await self.worker.recorded_async("retriever.retrieve", fn, url, data, key=body_key(data))

    def _count(self) -> None:
        """The pool's counts in the worker's (`_stats`): retriever_requests, retriever_retries (tries after the
        first: a replica down, restarting, answering 5xx), retriever_failed (calls no replica answered in time)."""
        self.worker.counters.update({f"retriever_{k}": v for k, v in self.pool.counters.items()})

    async def post(self, body: Any) -> tuple[int, Any]:
        """(status, answer) of a /retrieve body, as the retriever gave it (every try recorded)."""
        try:
            return await self.pool.post(body)
        finally:
            self._count()

    async def retrieve(self, queries: list[str], topk: int | None = None, return_scores: bool = True) -> dict:
        """Search-R1's answer for `queries` (topk: --retriever-topk unless given); RetrieverError when refused or
        no replica answers (every try recorded: a replay serves the answers back)."""
        try:
            return await self.pool.retrieve(list(queries), topk or self.topk, return_scores)
        finally:
            self._count()

    async def start_proxy(self) -> str:
        """A /retrieve on the worker's loopback for slime-style generate functions (which call one URL with no key):
        each body goes through `post`. The worker's slime-style args then carry its URL as `retriever_url`."""
        from ..search.client import RetrieveProxy
        self.proxy = RetrieveProxy(self.post)
        # (recorded, as the generate proxy's start: a replay starts no proxy, the function's results are recorded)
        self.proxy_url = await self.worker.recorded_async("retriever.proxy.start", self.proxy.start)
        g = self.worker.generation
        if g.slime_args is not None:
            cfg = g.slime_args._cfg
            g.slime_args = dataclasses.replace(
                cfg, retriever=dataclasses.replace(cfg.retriever, retriever_url=self.proxy_url)).flat()
        return self.proxy_url

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.worker.recorded_async("retriever.proxy.stop", self.proxy.stop)
        # (its HTTP session: this process's outside world, as each try is -- a replay has none to close)
        await self.worker.recorded_async("retriever.close", self.pool.close)
