"""The engine client drops an idle connection before the server does (backends/engine_client.KEEPALIVE_S).

SGLang's HTTP server closes a connection after 5 s idle; a client that keeps it longer may send its next request on it
just as the server closes it, and the request fails with "Server disconnected" (seen on one H100: a rollout group
failed after the first weight sync and was generated again). The server below closes, instead of answering, any
request that arrives on a connection idle for longer than its keep-alive -- the race, made certain -- so the outcome
depends only on which side gives up an idle connection first; the sleeps only ever make a connection idler.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from slime_actors.backends.engine_client import KEEPALIVE_S, EngineClient, EngineUnavailable


class IdleClosingServer:
    """HTTP/1.1 with keep-alive; a request on a connection idle for more than `keep_alive` s is met with a close."""

    def __init__(self, keep_alive: float):
        self.keep_alive = keep_alive
        self.connections = 0
        self.closed_on_request = 0
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        last_answer: float | None = None
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode().split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                if length:
                    await reader.readexactly(length)
                if last_answer is not None and time.monotonic() - last_answer > self.keep_alive:
                    self.closed_on_request += 1
                    writer.close()
                    return
                body = json.dumps({"text": "", "output_ids": [7], "meta_info": {}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                last_answer = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def _two_requests(client_keepalive: float | None, server_keep_alive: float, pause: float):
    server = IdleClosingServer(server_keep_alive)
    port = await server.start()
    try:
        async with EngineClient(f"http://127.0.0.1:{port}", timeout=10, keepalive=client_keepalive) as c:
            first = await c.generate([1, 2], {"max_new_tokens": 1})
            await asyncio.sleep(pause)
            try:
                second = await c.generate([1, 2], {"max_new_tokens": 1})
            except EngineUnavailable as exc:
                second = exc
        return first, second, server
    finally:
        await server.stop()


def test_a_connection_idle_longer_than_the_clients_keepalive_is_not_reused():
    first, second, server = asyncio.run(_two_requests(client_keepalive=0.2, server_keep_alive=0.4, pause=0.6))
    assert first["output_ids"] == [7] and second["output_ids"] == [7]
    assert server.connections == 2 and server.closed_on_request == 0   # a new connection for the second request


def test_without_it_the_request_meets_the_servers_close():
    """The failure the keep-alive avoids (a client keeping idle connections longer than the server)."""
    first, second, server = asyncio.run(_two_requests(client_keepalive=30.0, server_keep_alive=0.4, pause=0.6))
    assert first["output_ids"] == [7]
    assert isinstance(second, EngineUnavailable) and "disconnected" in str(second).lower()
    assert server.closed_on_request == 1


def test_the_default_keepalive_is_shorter_than_sglangs_server():
    # SGLang 0.5.15's HTTP server: uvicorn with timeout_keep_alive=SGLANG_TIMEOUT_KEEP_ALIVE, 5 s by default
    assert KEEPALIVE_S < 5.0
    assert EngineClient("http://127.0.0.1:1").keepalive == KEEPALIVE_S


@pytest.mark.parametrize("pause", [0.0, 0.05])
def test_a_connection_reused_within_the_keepalive_stays_one_connection(pause):
    first, second, server = asyncio.run(_two_requests(client_keepalive=30.0, server_keep_alive=30.0, pause=pause))
    assert second["output_ids"] == [7] and server.connections == 1
