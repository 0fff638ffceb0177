"""HTTP answers from servers we do not control are read with a bound (slime_actors/http_answers.py): the reader
itself, and its users -- the retriever client and the engine client -- each against a server that answers too much
(with its length, and chunked without one), and one whose JSON is nested deeper than Python's parser goes. (The
remote reward's bound: tests/test_rewards.py.)"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from slime_actors.backends.engine_client import EngineAnswerTooLarge, EngineClient, EngineError
from slime_actors.http_answers import AnswerTooLarge, read_answer
from slime_actors.json_files import parse_json
from slime_actors.search.client import RetrieverError, RetrieverPool

DEEP = b"[" * 200_000 + b"]" * 200_000          # Python's json raises RecursionError on it, orjson a JSONDecodeError


class Server:
    """One aiohttp app on 127.0.0.1 whose every answer is `answer(request)`; `sent` counts the bytes written."""

    def __init__(self, answer):
        self.answer, self.sent = answer, 0

    async def __aenter__(self):
        async def handle(request):
            return await self.answer(self, request)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


def sized(n: int):
    """An answer of n bytes with its Content-Length."""
    async def answer(srv, request):
        srv.sent += n
        return web.Response(body=b"x" * n, content_type="application/json")
    return answer


def chunked(n_chunks: int, chunk: int = 64 << 10):
    """A chunked answer with no Content-Length: it stops writing once the client has gone."""
    async def answer(srv, request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            for _ in range(n_chunks):
                await resp.write(b"x" * chunk)
                srv.sent += chunk
        except ConnectionError:   # (the client read enough and went)
            pass
        return resp
    return answer


def body_of(data: bytes, status: int = 200):
    async def answer(srv, request):
        return web.Response(body=data, status=status, content_type="application/json")
    return answer


# ------------------------------------------------------------------------------------------------ the reader
def test_read_answer_keeps_to_its_bound_with_a_length_and_without():
    async def main():
        got = {}
        async with aiohttp.ClientSession() as cs:
            async with Server(sized(1000)) as srv:
                async with cs.get(srv.url) as resp:          # exactly the bound: read whole
                    got["exact"] = len(await read_answer(resp, 1000))
                async with cs.get(srv.url) as resp:          # one byte over, said by Content-Length: nothing read
                    with pytest.raises(AnswerTooLarge) as e:
                        await read_answer(resp, 999)
                    got["length"] = (str(e.value), e.value.seen, e.value.status)
            async with Server(chunked(200)) as srv:          # 12.5 MiB sent without a length
                async with cs.get(srv.url) as resp:
                    with pytest.raises(AnswerTooLarge) as e:
                        await read_answer(resp, 1 << 20)
                    got["chunked"] = (e.value.seen, resp.content.total_bytes)
        return got
    got = asyncio.run(main())
    assert got["exact"] == 1000
    msg, seen, status = got["length"]
    assert msg.endswith("answered HTTP 200 with more than 999 bytes") and msg.startswith("http://127.0.0.1:"), msg
    assert (seen, status) == (0, 200)
    seen, total = got["chunked"]
    assert (1 << 20) < seen <= (1 << 20) + (64 << 10)          # the bound and at most one chunk
    assert total < 2 << 20, total                             # what the stream had taken in: far from 12.5 MiB


def test_parse_json_turns_deep_nesting_into_a_value_error():
    with pytest.raises(json.JSONDecodeError, match="nested too deep"):
        parse_json(DEEP)
    with pytest.raises(ValueError):
        parse_json(b"not json")
    assert parse_json(b'{"result": [1]}') == {"result": [1]}


# --------------------------------------------------------------------------------------------- the retriever
def retrieve_with(answer, **kw):
    """What RetrieverPool.retrieve makes of a replica giving `answer`: ("ok", answer) or ("error", message), with
    the pool's counters and how many requests the replica saw."""
    async def main():
        calls = []

        async def counting(srv, request):
            calls.append(1)
            return await answer(srv, request)
        async with Server(counting) as srv:
            pool = RetrieverPool([lambda: srv.url], timeout=10, deadline=5, **kw)
            try:
                try:
                    out = ("ok", await pool.retrieve(["q"], topk=1))
                except RetrieverError as exc:
                    out = ("error", str(exc))
            finally:
                await pool.close()
            return out, pool.counters, len(calls), srv.sent
    return asyncio.run(main())


def test_a_retriever_answer_over_the_bound_fails_at_once_read_no_further():
    for answer in (sized(3 << 20), chunked(200)):
        (kind, msg), counters, calls, _ = retrieve_with(answer, max_answer_bytes=1 << 20)
        assert kind == "error", msg
        assert "answered HTTP 200 with more than 1,048,576 bytes; a retriever's answer is a few MB (not retried)" \
            in msg, msg
        assert calls == 1 and counters == {"requests": 1, "retries": 0, "failed": 1}, (calls, counters)
    # under the default bound (64 MiB) a 3 MiB answer is an answer
    (kind, out), _, _, _ = retrieve_with(body_of(b'{"result": [[{"document": {"contents": "' + b"x" * (3 << 20)
                                                 + b'"}}]]}'))
    assert kind == "ok" and len(out["result"][0][0]["document"]["contents"]) == 3 << 20


def test_a_retriever_answer_nested_too_deep_is_not_json_to_the_client():
    """Before: Python's RecursionError (a RuntimeError) was taken for an unreachable replica: set aside and asked
    again until the deadline, then "no retriever replica answered"."""
    (kind, msg), counters, calls, _ = retrieve_with(body_of(DEEP))
    assert kind == "ok" and set(msg) == {"detail"} and msg["detail"].startswith("[[[["), msg   # as any non-JSON
    (kind, msg), _, _, _ = retrieve_with(body_of(DEEP, status=400))
    assert kind == "error" and "the retriever refused the request (HTTP 400)" in msg, msg


# ------------------------------------------------------------------------------------------------ the engine
def engine_call(answer, what: str, **kw):
    async def main():
        async with Server(answer) as srv:
            async with EngineClient(srv.url, timeout=10, **kw) as client:
                try:
                    if what == "generate":
                        return "ok", await client.generate([1, 2, 3], {"max_new_tokens": 4})
                    return "ok", await client.get_server_info()
                except EngineAnswerTooLarge as exc:
                    return "error", (str(exc), exc.status)
                except EngineError as exc:
                    return "other error", (str(exc), exc.status)
    return asyncio.run(main())


def test_an_engine_answer_over_its_bound_is_an_engine_error():
    kind, (msg, status) = engine_call(sized(3 << 20), "generate", max_answer_bytes=1 << 20)
    assert kind == "error" and status == 200, msg
    assert msg == "/generate: HTTP 200: an answer of more than 1,048,576 bytes, read no further (not an engine's " \
                  "answer to this request)", msg
    kind, (msg, _) = engine_call(chunked(200), "generate", max_answer_bytes=1 << 20)
    assert kind == "error" and "more than 1,048,576 bytes" in msg, msg
    # control requests have their own, smaller bound (16 MiB), whatever max_answer_bytes says
    kind, (msg, _) = engine_call(chunked(400), "server_info", max_answer_bytes=1 << 30)
    assert kind == "error" and "more than 16,777,216 bytes" in msg, msg


def test_an_engine_answer_nested_too_deep_is_an_engine_error():
    """orjson refuses it (depth 1024), then Python's json raised RecursionError out of the client."""
    kind, (msg, status) = engine_call(body_of(DEEP), "generate")
    assert kind == "other error" and status == 200 and "expected JSON, got '[[[[" in msg, msg


def test_an_answer_over_the_bound_counts_as_its_groups_failure():
    """A rollout worker gives a group back uncounted when the engine was out of reach (it is generated again); an
    answer over the bound is counted like a refusal, so an engine that always sends one cannot make a group be
    generated for ever."""
    from types import SimpleNamespace

    from slime_actors.actors.rollout import RolloutWorker
    from slime_actors.backends.engine_client import EngineTimeout, EngineUnavailable
    ok = asyncio.Event()
    ok.set()
    worker = SimpleNamespace(_engine_ok=ok, _restarting=False)

    def counted(exc):
        return RolloutWorker._groups_fault(worker, exc)
    assert counted(EngineAnswerTooLarge("/generate", 200, "an answer of more than 1,024 bytes"))
    assert counted(EngineError("/generate", 400, "bad request"))
    assert not counted(EngineError("/generate", 503, "busy"))
    assert not counted(EngineUnavailable("/generate", None, "cannot reach"))
    assert not counted(EngineTimeout("/generate", None, "no answer"))


def test_a_compressed_answer_is_bounded_by_what_it_decompresses_to():
    """Content-Length is the compressed size: 10 MiB of zeros gzipped is ~10 KB, under any bound; aiohttp
    decompresses what it reads. The reader stops at the bound of the answer as decompressed."""
    import gzip
    bomb = gzip.compress(b"0" * (10 << 20))

    async def answer(srv, request):
        srv.sent += len(bomb)
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    async def main():
        async with aiohttp.ClientSession() as cs:
            async with Server(answer) as srv:
                async with cs.get(srv.url) as resp:
                    assert resp.content_length == len(bomb) < 1 << 20
                    with pytest.raises(AnswerTooLarge) as e:
                        await read_answer(resp, 1 << 20)
                    return e.value.seen
    seen = asyncio.run(main())
    assert (1 << 20) < seen < 2 << 20, seen    # decompressed as read, given up past the bound: not 10 MiB
    # the engine client's bound holds the same way
    kind, (msg, _) = engine_call(answer, "generate", max_answer_bytes=1 << 20)
    assert kind == "error" and "more than 1,048,576 bytes" in msg, msg
