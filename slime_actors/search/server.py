"""The retriever's HTTP server: Search-R1's retrieval protocol over a BM25 index (aiohttp).

    server = RetrieverServer(index, api_key="...")         # index: search/index.py's Bm25Index
    host, port = await server.start()                      # 127.0.0.1 and a free port unless told
    ...
    await server.stop()

    python -m slime_actors.search.server --corpus examples/search/tiny/corpus.jsonl --port 8000 [--api-key-file F]

The protocol is the one Search-R1's `retrieval_server.py` serves and slime's and verl's search examples call:

    POST /retrieve   {"queries": ["q1", ...], "topk": 3, "return_scores": true}
      return_scores true:  {"result": [[{"document": DOC, "score": 12.3}, ...], ...]}   one list per query
      return_scores false: {"result": [[DOC, ...], ...]}
      DOC: {"id": "...", "contents": "\\"Title\\"\\ntext", "title": "Title", "text": "text"}
    GET /health      200 {"status": "ok", "docs": N} (open: no key needed)

`topk` may be left out or null (the server's default, --topk), `return_scores` defaults to false. A query's list
holds up to `topk` documents that share at least one token with it, best first -- fewer, or none, when fewer match.

Refusals, in the shapes FastAPI gives (Search-R1's server is a FastAPI app): a body that is not JSON, not an object,
or whose fields are missing, of the wrong type or out of bounds gets 422 {"detail": [{"type", "loc", "msg", "input",
"ctx"?}, ...]} listing every problem; a body over `max_body_bytes` 413; a missing or wrong key 401 (header
`Authorization: Bearer <key>`, as the engines take theirs: backends/engine_auth.py); a method or path that does
not exist 405 / 404; more than `max_inflight` requests at once 503. The limits bound one request's work: at most
`max_queries` queries of at most `max_query_chars` characters, `topk` at most `max_topk`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..json_files import parse_json

from ..log import get_logger

DEFAULT_TOPK = 3            # Search-R1's and slime's search-r1 example's topk
MAX_TOPK = 100
MAX_QUERIES = 512
MAX_QUERY_CHARS = 4096
MAX_BODY_BYTES = 4 << 20
MAX_INFLIGHT = 1024


class Invalid(Exception):
    """A request body that does not validate: FastAPI's 422 detail entries."""

    def __init__(self, errors: list[dict]):
        super().__init__(f"{len(errors)} validation error(s)")
        self.errors = errors


def _err(typ: str, loc: list, msg: str, value: Any, **ctx) -> dict:
    e = {"type": typ, "loc": ["body", *loc], "msg": msg, "input": value}
    if ctx:
        e["ctx"] = ctx
    return e


def parse_request(body: Any, *, default_topk: int = DEFAULT_TOPK, max_topk: int = MAX_TOPK,
                  max_queries: int = MAX_QUERIES, max_query_chars: int = MAX_QUERY_CHARS) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a /retrieve body, or Invalid with every problem (pydantic's wording, as
    FastAPI answers it: `Field required`, `Input should be a valid list`, ...)."""
    if not isinstance(body, dict):
        raise Invalid([_err("model_attributes_type", [], "Input should be a valid dictionary or object to extract "
                                                         "fields from", body)])
    errors: list[dict] = []
    queries = body.get("queries")
    if "queries" not in body:
        errors.append(_err("missing", ["queries"], "Field required", body))
    elif not isinstance(queries, list):
        errors.append(_err("list_type", ["queries"], "Input should be a valid list", queries))
    else:
        if len(queries) > max_queries:
            errors.append(_err("too_long", ["queries"], f"List should have at most {max_queries} items after "
                               f"validation, not {len(queries)}", "...", field_type="List", max_length=max_queries,
                               actual_length=len(queries)))
        else:
            for i, q in enumerate(queries):
                if not isinstance(q, str):
                    errors.append(_err("string_type", ["queries", i], "Input should be a valid string", q))
                elif len(q) > max_query_chars:
                    errors.append(_err("string_too_long", ["queries", i], f"String should have at most "
                                       f"{max_query_chars} characters", q[:64] + "...", max_length=max_query_chars))
    topk = body.get("topk")
    if topk is None:
        topk = default_topk
    elif isinstance(topk, bool) or not (isinstance(topk, int) or (isinstance(topk, float) and topk.is_integer())):
        errors.append(_err("int_type", ["topk"], "Input should be a valid integer", topk))
    elif topk < 1:
        errors.append(_err("greater_than_equal", ["topk"], "Input should be greater than or equal to 1", topk, ge=1))
    elif topk > max_topk:
        errors.append(_err("less_than_equal", ["topk"], f"Input should be less than or equal to {max_topk}", topk,
                           le=max_topk))
    scores = body.get("return_scores", False)
    if scores is None or (isinstance(scores, int) and not isinstance(scores, bool) and scores in (0, 1)):
        scores = bool(scores)
    elif not isinstance(scores, bool):
        errors.append(_err("bool_type", ["return_scores"], "Input should be a valid boolean", scores))
    if errors:
        raise Invalid(errors)
    return list(queries), int(topk), scores


class RetrieverServer:
    def __init__(self, index, *, api_key: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 default_topk: int = DEFAULT_TOPK, max_topk: int = MAX_TOPK, max_queries: int = MAX_QUERIES,
                 max_query_chars: int = MAX_QUERY_CHARS, max_body_bytes: int = MAX_BODY_BYTES,
                 max_inflight: int = MAX_INFLIGHT, reuse_port: bool = False):
        self.index, self.api_key, self.host, self.port = index, api_key, host, port
        self.limits = {"default_topk": default_topk, "max_topk": max_topk, "max_queries": max_queries,
                       "max_query_chars": max_query_chars}
        self.max_body_bytes, self.max_inflight, self.reuse_port = max_body_bytes, max_inflight, reuse_port
        self.counters = {"requests": 0, "queries": 0, "bad_requests": 0, "unauthorized": 0, "overloaded": 0,
                         "errors": 0}
        self.inflight = 0
        self.log = get_logger(component="retriever")
        self._runner = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="bm25")   # the index searches one at a time

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    async def start(self) -> tuple[str, int]:
        from aiohttp import web
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._errors])
        app.router.add_post("/retrieve", self._retrieve)
        app.router.add_get("/health", self._health)
        from ..backends.generate_proxy import start_site
        self._runner, self.port = await start_site(app, self.host, self.port, self.reuse_port)
        return self.host, self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------------------ handlers
    @staticmethod
    def _json(data: Any, status: int = 200, headers: dict | None = None):
        from aiohttp import web
        return web.Response(text=json.dumps(data), status=status, content_type="application/json", headers=headers)

    @property
    def _errors(self):
        from aiohttp import web

        @web.middleware
        async def errors(request, handler):
            """aiohttp's own refusals (404, 405, 413) as FastAPI's JSON {"detail": ...}; a crash as 500."""
            try:
                return await handler(request)
            except web.HTTPException as exc:
                if exc.status == 413:
                    return self._json({"detail": f"request body larger than {self.max_body_bytes} bytes"}, 413)
                if exc.status >= 400:
                    return self._json({"detail": exc.reason}, exc.status)
                raise
            except Exception as exc:
                self.counters["errors"] += 1
                self.log.error("retrieve failed", error=repr(exc))
                return self._json({"detail": "Internal Server Error"}, 500)
        return errors

    async def _health(self, request):
        return self._json({"status": "ok", "docs": len(self.index.docs)})

    def _authorized(self, request) -> bool:
        if not self.api_key:
            return True
        from ..backends.engine_auth import bearer_matches
        return bearer_matches(request.headers.get("Authorization"), self.api_key)

    async def _retrieve(self, request):
        self.counters["requests"] += 1
        if not self._authorized(request):
            self.counters["unauthorized"] += 1
            return self._json({"detail": "Unauthorized: this retriever needs its key (Authorization: Bearer <key>)"},
                              401, headers={"WWW-Authenticate": "Bearer"})
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return self._json({"detail": f"request body larger than {self.max_body_bytes} bytes"}, 413)
        raw = await request.read()   # (aiohttp refuses a body over client_max_size: 413 by the middleware)
        try:
            body = parse_json(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            self.counters["bad_requests"] += 1
            pos = getattr(exc, "pos", 0)
            return self._json({"detail": [{"type": "json_invalid", "loc": ["body", pos], "msg": "JSON decode error",
                                           "input": {}, "ctx": {"error": getattr(exc, "msg", str(exc))}}]}, 422)
        try:
            queries, topk, scores = parse_request(body, **self.limits)
        except Invalid as bad:
            self.counters["bad_requests"] += 1
            return self._json({"detail": bad.errors}, 422)
        if self.inflight >= self.max_inflight:
            self.counters["overloaded"] += 1
            return self._json({"detail": f"overloaded: {self.inflight} requests in flight"}, 503)
        self.inflight += 1
        try:
            hits = await asyncio.get_running_loop().run_in_executor(self._pool, self.index.search, queries, topk) \
                if queries else []
        finally:
            self.inflight -= 1
        self.counters["queries"] += len(queries)
        return self._json({"result": format_hits(hits, scores)})


def format_hits(hits: list[list[tuple[Any, float]]], return_scores: bool) -> list[list[dict]]:
    """Search-R1's result lists: [{"document": DOC, "score": s}] with scores, the documents themselves without."""
    if return_scores:
        return [[{"document": d.to_json(), "score": s} for d, s in q] for q in hits]
    return [[d.to_json() for d, _ in q] for q in hits]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slime_actors.search.server",
                                description="Serve a corpus with BM25 in Search-R1's retrieval protocol.")
    p.add_argument("--corpus", required=True, help="jsonl corpus (slime_actors/search/corpus.py)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--topk", type=int, default=DEFAULT_TOPK, help="documents per query when a request gives none")
    p.add_argument("--max-topk", type=int, default=MAX_TOPK)
    p.add_argument("--max-queries", type=int, default=MAX_QUERIES, help="queries per request")
    p.add_argument("--api-key-file", help="file holding the key clients must send (mode 0600); or set "
                                          "SLIME_ACTORS_RETRIEVER_KEY")
    p.add_argument("--cache-dir", help="where the BM25 index is cached (default: ~/.cache/slime-actors/retriever)")
    ns = p.parse_args(argv)
    from ..log import setup_logging
    from .index import Bm25Index, default_cache_dir
    from .keys import RetrieverKeyError, key_from
    setup_logging(None, "retriever")
    try:
        key = key_from(ns.api_key_file)
        index = Bm25Index.open(ns.corpus, ns.cache_dir or default_cache_dir(None))
    except (RetrieverKeyError, ValueError) as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    if not key:
        print(f"{p.prog}: warning: no key (--api-key-file): anyone who reaches "
              f"{ns.host}:{ns.port} can query it", file=sys.stderr)

    async def serve() -> None:
        server = RetrieverServer(index, api_key=key, host=ns.host, port=ns.port, default_topk=ns.topk,
                                 max_topk=ns.max_topk, max_queries=ns.max_queries)
        await server.start()
        print(f"{p.prog}: serving {len(index.docs)} documents at {server.url}/retrieve", file=sys.stderr)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()
    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
