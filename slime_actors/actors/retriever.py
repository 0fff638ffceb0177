"""A retriever replica: the BM25 index of --retriever-corpus served over HTTP in Search-R1's protocol
(slime_actors/search/server.py), as a role of the job like the engines -- placed by the topology
(`[roles.retriever]`, any node group), supervised by its node's launcher (restarted when it dies, killed when its
heartbeats stop), reached with the job's retriever key (search/keys.py).

Its index is built once per corpus and setting and cached on disk (search/index.py): a restarted replica, or a
second one, loads it. It listens on 127.0.0.1 -- on this node's address when the job spans hosts
(--transport tcp), since callers on other nodes must reach it -- at a free port, which callers learn by asking
`retriever/N.address` (a restarted replica has a new one). Every PROBE_S seconds it asks itself for a search over
HTTP, as a caller would; PROBE_FAILURES failures in a row mean the server is wedged though the process lives, and
the replica exits (code 70) so that its launcher starts it again.
"""

from __future__ import annotations

import asyncio
import os

from typing import TYPE_CHECKING

from .base import Actor, handler

if TYPE_CHECKING:
    from ..search.index import Bm25Index
    from ..search.server import RetrieverServer

PROBE_S = 5.0
PROBE_TIMEOUT_S = 10.0
PROBE_FAILURES = 3
EXIT_UNHEALTHY = 70


class Retriever(Actor):
    role = "retriever"
    needs_job = True

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.server: RetrieverServer | None = None
        self.bm25: Bm25Index | None = None   # (on_start)
        self.url = ""
        self.counters.update({"probes_failed": 0})

    async def on_start(self) -> None:
        from ..env import RETRIEVER_KEY
        from ..search.index import Bm25Index, default_cache_dir
        r = self.cfg.retriever
        if not r.retriever_corpus:
            raise RuntimeError("the retriever role serves --retriever-corpus, and the job has none (with "
                               "--retriever-url the job uses a retriever started elsewhere: drop [roles.retriever])")
        self.key = RETRIEVER_KEY.get()
        if not self.key:
            raise RuntimeError(f"no retriever key ({RETRIEVER_KEY.name}): the launcher hands it to the job's "
                               "processes")
        cache = r.retriever_cache_dir or default_cache_dir(self.runtime.run_dir)
        self.bm25 = bm25 = await self.run_blocking(Bm25Index.open, r.retriever_corpus, cache)
        # the server is this process's outside world: its start (and address) is a recorded input, replay starts none
        host, port = await self.recorded_async("server.start", self._start_server, bm25)
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        self.log.info("retriever serving", url=self.url, docs=len(bm25.docs), cached_index=bm25.cached)
        if not self.replaying:
            self.spawn(self._probe(), name="probe")

    async def _start_server(self, bm25: Bm25Index) -> list:
        """[host, port] it serves at (a list: as the recording holds it)."""
        from ..search.server import RetrieverServer
        host = self.runtime.node_address() if self.runtime.transport == "tcp" else "127.0.0.1"
        self.server = server = RetrieverServer(bm25, api_key=self.key, host=host,
                                               default_topk=self.cfg.retriever.retriever_topk)
        return list(await server.start())

    async def on_stop(self) -> None:
        if self.server is not None:
            await self.server.stop()

    async def _probe(self) -> None:
        """Search over HTTP, as a caller would; exit when the server stops answering (module docstring)."""
        import aiohttp
        failures = 0
        assert self.bm25 is not None  # (started)
        body = {"queries": [self.bm25.docs[0].title or "probe"], "topk": 1, "return_scores": False}
        headers = {"Authorization": f"Bearer {self.key}"}
        async with aiohttp.ClientSession() as session:
            while self.running:
                await asyncio.sleep(PROBE_S)
                try:
                    async with session.post(self.url + "/retrieve", json=body, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
                        ok = resp.status == 200 and isinstance((await resp.json()).get("result"), list)
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                    ok = False
                failures = 0 if ok else failures + 1
                if not ok:
                    self.counters["probes_failed"] += 1
                    self.log.warning("retriever probe failed", failures=failures, url=self.url)
                if failures >= PROBE_FAILURES:
                    self.log.error("retriever does not answer its own probe; exiting to be restarted",
                                   failures=failures)
                    os._exit(EXIT_UNHEALTHY)

    @handler
    def address(self) -> dict:
        """Where this replica serves: {url, docs, corpus_sha256, requests, queries}."""
        s: dict[str, int] = self.server.counters if self.server is not None else {}
        bm25 = self.bm25
        assert bm25 is not None  # (requests wait until on_start has finished)
        return {"url": self.url, "docs": len(bm25.docs), "corpus_sha256": bm25.corpus_sha,
                "requests": s.get("requests", 0), "queries": s.get("queries", 0)}
