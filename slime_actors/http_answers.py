"""HTTP answers from servers this process does not control -- a remote reward model (`--rm-url`), a retriever
(`--retriever-url`, or the job's own replicas), an inference engine (SGLang's, or the user's `--engine-url`) -- read
with a bound. aiohttp's `resp.read()` / `resp.text()` / `resp.json()` take the whole body, whatever its size: a
server that answers without end (or with a multi-GB body, or a small gzip one that decompresses to GBs) fills the
reading process's memory. Here the answer is refused at once when its Content-Length is over the bound, and read no
further than the bound (and one chunk) when it has none or is compressed.

    body = await read_answer(resp, limit=1 << 20)        # bytes, or AnswerTooLarge naming the URL, status, bound

and json_files.parse_json(body) parses it without the RecursionError a deeply nested answer raises in Python's json
(a ValueError instead, like any other answer that is not JSON).
"""

from __future__ import annotations

from typing import Any

CHUNK = 64 << 10


class AnswerTooLarge(ValueError):
    """An answer over its bound: `url`, `status`, `limit` (bytes), `seen` (what was read before it was given up)."""

    def __init__(self, url: str, status: int, limit: int, seen: int):
        super().__init__(f"{url} answered HTTP {status} with more than {limit:,} bytes")
        self.url, self.status, self.limit, self.seen = url, status, limit, seen


async def read_answer(resp: Any, limit: int) -> bytes:
    """The body of aiohttp's ClientResponse `resp`, at most `limit` bytes; AnswerTooLarge past it (said by the
    Content-Length before anything is read, or found while reading)."""
    if resp.content_length is not None and resp.content_length > limit:
        raise AnswerTooLarge(str(resp.url), resp.status, limit, 0)
    if resp.content_length is not None and resp.headers.get("Content-Encoding", "identity").lower() == "identity":
        return await resp.read()   # (exactly Content-Length bytes: the bound holds; one copy fewer)
    # without a length, or compressed (the length is the compressed one: 10 KB of gzip can be 10 MB of answer):
    # aiohttp decompresses as it goes, a piece at a time -- read to the bound, no further
    url = str(resp.url)
    body = bytearray()
    async for chunk in resp.content.iter_chunked(CHUNK):
        body += chunk
        if len(body) > limit:
            raise AnswerTooLarge(url, resp.status, limit, len(body))
    return bytes(body)

