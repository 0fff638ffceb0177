"""Tracing is a plug-in of the mailbox (slime_actors/mailbox/tracing.py): the mailbox records through the tracer object
it is handed and imports nothing above it; the trace writer is one such tracer."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import msgpack
import numpy as np

from slime_actors.mailbox import codec
from slime_actors.mailbox.mailbox import Mailbox
from slime_actors.mailbox.tracing import HotPathTracer, Tracer, fast_entries
from slime_actors.traces.writer import TraceWriter

MAILBOX_DIR = Path(__file__).resolve().parent.parent / "slime_actors" / "mailbox"
ENV_PY = MAILBOX_DIR.parent / "env.py"   # the declared environment variables: below every layer, mailbox included


def _imports_outside(path: Path) -> list[str]:
    """The slime_actors modules outside slime_actors.mailbox that `path` imports (at any depth of the file)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 2 and node.module == "env" and path.parent == MAILBOX_DIR:
                continue  # slime_actors/env.py, the one module under the mailbox (it imports nothing of ours)
            if node.level >= 2 or (node.level == 0 and (node.module or "").startswith("slime_actors")
                                   and not (node.module or "").startswith("slime_actors.mailbox")):
                out.append(f"{path.name}: from {'.' * node.level}{node.module or ''} import ...")
        elif isinstance(node, ast.Import):
            out += [f"{path.name}: import {a.name}" for a in node.names
                    if a.name.startswith("slime_actors") and not a.name.startswith("slime_actors.mailbox")]
    return out


def test_the_mailbox_imports_nothing_above_it():
    """mailbox/ is the bottom layer: no import of traces/, actors/, launch/ or anything else of the package, save
    slime_actors/env.py (the environment variables declared once), which itself imports nothing of the package."""
    files = sorted(MAILBOX_DIR.glob("*.py"))
    assert len(files) >= 6
    assert [bad for f in files for bad in _imports_outside(f)] == []
    env_imports = [n for n in ast.walk(ast.parse(ENV_PY.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in env_imports if isinstance(n, ast.ImportFrom) and (n.level or "slime_actors" in (n.module or ""))]
    assert not [a.name for n in env_imports if isinstance(n, ast.Import) for a in n.names if "slime_actors" in a.name]


class ListTracer:
    """The least a tracer is: record() and two attributes -- no hot-path entries, no trace file."""

    body_limit = 1 << 16
    keep_arrays = False

    def __init__(self):
        self.records = []

    def record(self, ev, header, body=None, refs=None, buffers=None, extra=None):
        self.records.append((ev, bytes(header) if header is not None else None,
                             bytes(body) if body is not None else None, refs, extra))


def test_the_trace_writer_is_a_hot_path_tracer_and_a_plain_object_is_a_tracer(tmp_path):
    w = TraceWriter(tmp_path / "x.trace", "x/0")
    try:
        assert isinstance(w, HotPathTracer) and fast_entries(w) == (w.append, w.pack, w.rec)
    finally:
        w.close()
    plain = ListTracer()
    assert isinstance(plain, Tracer) and not isinstance(plain, HotPathTracer)
    assert fast_entries(plain) == (None, None, None) and fast_entries(None) == (None, None, None)


def test_a_mailbox_records_through_the_tracer_it_is_handed(tmp_path):
    """A record-only tracer gets every message the mailbox sends and receives -- header and body as the bytes on the
    wire, arrays by checksum -- and the drop of a malformed one, with its reason."""
    server_t, client_t = ListTracer(), ListTracer()

    async def go():
        server = Mailbox("srv/0", tracer=server_t)
        client = Mailbox("cli/0", tracer=client_t)

        def on_request(inbound):
            server.reply_nowait(inbound, {"frames": len(inbound.arrays)})

        server.on_request = on_request
        ep = await server.bind(f"ipc://{tmp_path}/srv.sock")
        await client.bind(f"ipc://{tmp_path}/cli.sock")
        client.connect("srv/0", ep)
        try:
            assert await client.ask("srv/0", "echo", {"x": 7}, timeout=10) == {"frames": 0}
            arr = np.arange(6, dtype=np.float32)
            assert await client.ask("srv/0", "echo", {"x": arr}, timeout=10) == {"frames": 1}
            server._on_router([b"someone", b"\xc1", b""])  # a malformed header: dropped, and traced as such
        finally:
            client.close()
            server.close()

    asyncio.run(go())
    assert [r[0] for r in client_t.records] == ["send", "recv", "send", "recv"]
    assert [r[0] for r in server_t.records] == ["recv", "send", "recv", "send", "drop"]
    sent, received = client_t.records[0], server_t.records[0]
    assert sent[1] == received[1] and sent[2] == received[2] == msgpack.packb({"x": 7})  # the wire's bytes
    assert codec.decode_header(sent[1])["method"] == "echo"
    (ref,) = client_t.records[2][3]  # the array: dtype, shape and its checksum, the same on both sides
    assert (ref.dtype, tuple(ref.shape)) == ("float32", (6,)) and ref.sum == server_t.records[2][3][0].sum
    drop = server_t.records[-1]
    assert drop[1] is None and drop[4]["identity"] == b"someone".hex(), drop
    assert drop[4]["reason"].startswith("header is not valid msgpack"), drop
