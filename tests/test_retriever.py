"""The retriever (slime_actors/search/): Search-R1's /retrieve protocol as slime's and verl's search examples call it,
its refusals, its key, the BM25 index cache, the client's failover, and the made-up worlds."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from helpers import LoopThread
from slime_actors.search.corpus import CorpusError, Doc, natural_world, read_corpus, tiny_world
from slime_actors.search.index import Bm25Index, tokenize
from slime_actors.search.server import RetrieverServer

ROOT = Path(__file__).resolve().parents[1]
KEY = "k3y-" + "0123456789abcdef" * 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    tiny_world(7).write(d)
    return d


@pytest.fixture(scope="module")
def lt():
    t = LoopThread()
    yield t
    t.close()


@pytest.fixture
def server(tiny, lt, tmp_path):
    index = Bm25Index.open(tiny / "corpus.jsonl", tmp_path / "cache")
    s = RetrieverServer(index, api_key=KEY, max_topk=10, max_queries=4, max_query_chars=64, max_body_bytes=4096)
    lt.call(s.start())
    yield s
    lt.call(s.stop())


def post(lt, url: str, body, key: str | None = KEY, raw: bytes | None = None, method: str = "POST"):
    async def go():
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with aiohttp.ClientSession() as cs:
            kw = {"data": raw} if raw is not None else {"json": body} if body is not None else {}
            async with cs.request(method, url, headers=headers, **kw) as r:
                return r.status, json.loads(await r.text())
    return lt.call(go())


# ------------------------------------------------------------------------------------------------ the protocol
def test_return_scores_true_wraps_each_document_with_its_score(server, lt):
    status, out = post(lt, server.url + "/retrieve", {"queries": ["zorvik age", "quelby home"], "topk": 2,
                                                      "return_scores": True})
    assert status == 200 and list(out) == ["result"] and len(out["result"]) == 2
    for per_query in out["result"]:
        assert len(per_query) == 2
        for hit in per_query:
            assert set(hit) == {"document", "score"} and isinstance(hit["score"], float)
            doc = hit["document"]
            assert doc["contents"] == f'"{doc["title"]}"\n{doc["text"]}' and doc["id"]
        assert per_query[0]["score"] >= per_query[1]["score"]
    assert out["result"][0][0]["document"]["id"] == "zorvik-age"


def test_return_scores_false_lists_the_documents_themselves(server, lt):
    status, out = post(lt, server.url + "/retrieve", {"queries": ["zorvik age"], "topk": 3, "return_scores": False})
    assert status == 200
    docs = out["result"][0]
    assert len(docs) == 3 and all(set(d) == {"id", "contents", "title", "text"} for d in docs)
    assert docs[0]["id"] == "zorvik-age"
    # defaults: topk the server's (3), return_scores false; no query, no lists; a query matching nothing, an empty one
    status, out = post(lt, server.url + "/retrieve", {"queries": ["zorvik age", "unknownword"]})
    assert status == 200 and len(out["result"][0]) == 3 and "score" not in out["result"][0][0]
    assert out["result"][1] == []
    assert post(lt, server.url + "/retrieve", {"queries": []}) == (200, {"result": []})


def test_a_slime_search_r1_client_and_a_verl_client_run_unchanged(server, lt):
    """Requests written from the protocol as slime's search-r1 example (local_search: return_scores false, reads
    `contents` of each item of result[0], then `Doc i(Title: ...) text`) and verl's search tool (return_scores
    true, reads `document.contents`) make them -- the first through a rollout worker's loopback proxy, which
    carries the job's key for a function that sends none."""
    from slime_actors.search.client import RetrieveProxy, RetrieverPool

    async def slime_style(search_url: str, query: str, top_k: int) -> str:
        payload = {"queries": [query], "topk": top_k, "return_scores": False}
        async with aiohttp.ClientSession() as session:
            async with session.post(search_url, json=payload) as resp:
                resp.raise_for_status()
                result = await resp.json()
        contexts = [{"document": {"contents": item.get("contents", "")}} for item in result.get("result", [[]])[0]]
        out = ""
        for idx, doc_item in enumerate(contexts):
            content = doc_item["document"]["contents"]
            title, text = content.split("\n")[0], "\n".join(content.split("\n")[1:])
            out += f"Doc {idx + 1}(Title: {title}) {text}\n"
        return out

    async def go():
        pool = RetrieverPool([lambda: server.url], key=KEY)
        proxy = RetrieveProxy(pool.post)
        url = await proxy.start()
        try:
            return await slime_style(url + "/retrieve", "quelby home", 1)
        finally:
            await proxy.stop()
            await pool.close()
    value = server.index.search(["quelby home"], 1)[0][0][0].text.split()[-1]
    assert lt.call(go()) == f'Doc 1(Title: "quelby") quelby home is {value}\n'
    # without the proxy the same function is refused: the job's retriever takes its key only
    with pytest.raises(aiohttp.ClientResponseError, match="401"):
        lt.call(slime_style(server.url + "/retrieve", "quelby home", 1))

    async def deep_to_proxy():   # (was a 500: Python's RecursionError)
        pool = RetrieverPool([lambda: server.url], key=KEY)
        proxy = RetrieveProxy(pool.post)
        url = await proxy.start()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(url + "/retrieve", data=b"[" * 100_000 + b"]" * 100_000) as resp:
                    return resp.status, (await resp.json())["detail"][0]["type"]
        finally:
            await proxy.stop()
            await pool.close()
    assert lt.call(deep_to_proxy()) == (422, "json_invalid")
    status, out = post(lt, server.url + "/retrieve", {"queries": ["quelby home"], "topk": 1, "return_scores": True})
    verl = [doc_item["document"]["contents"] for doc_item in out["result"][0]]
    assert verl == ['"quelby"\n' + f"quelby home is {value}"]


BAD_BODIES = [
    ({}, [("missing", ["body", "queries"])]),
    ({"queries": "zorvik"}, [("list_type", ["body", "queries"])]),
    ({"queries": ["a", 3]}, [("string_type", ["body", "queries", 1])]),
    ({"queries": ["a"], "topk": "many"}, [("int_type", ["body", "topk"])]),
    ({"queries": ["a"], "topk": 0}, [("greater_than_equal", ["body", "topk"])]),
    ({"queries": ["a"], "topk": 11}, [("less_than_equal", ["body", "topk"])]),
    ({"queries": ["a"], "return_scores": "yes"}, [("bool_type", ["body", "return_scores"])]),
    ({"queries": ["a"] * 5}, [("too_long", ["body", "queries"])]),
    ({"queries": ["a" * 65]}, [("string_too_long", ["body", "queries", 0])]),
    ([1, 2], [("model_attributes_type", ["body"])]),
    ({"queries": [1], "topk": -1}, [("string_type", ["body", "queries", 0]), ("greater_than_equal", ["body", "topk"])]),
]


@pytest.mark.parametrize("body,want", BAD_BODIES, ids=[str(i) for i in range(len(BAD_BODIES))])
def test_bad_bodies_get_fastapi_style_422s_naming_every_problem(server, lt, body, want):
    status, out = post(lt, server.url + "/retrieve", body)
    assert status == 422, out
    assert [(e["type"], e["loc"]) for e in out["detail"]] == want
    assert all(e["msg"] for e in out["detail"])


def test_not_json_too_large_wrong_method_and_path(server, lt):
    status, out = post(lt, server.url + "/retrieve", None, raw=b'{"queries": [')
    assert status == 422 and out["detail"][0]["type"] == "json_invalid"
    status, out = post(lt, server.url + "/retrieve", None, raw=b"[" * 2000 + b"]" * 2000)   # (was a 500)
    assert status == 422 and out["detail"][0]["ctx"]["error"] == "nested too deep to be read", out
    status, out = post(lt, server.url + "/retrieve", None, raw=b"x" * 5000)
    assert status == 413 and "larger than 4096 bytes" in out["detail"]
    assert post(lt, server.url + "/retrieve", None, method="GET") == (405, {"detail": "Method Not Allowed"})
    assert post(lt, server.url + "/nothing", {"queries": []}) == (404, {"detail": "Not Found"})
    assert server.counters["bad_requests"] >= 1


def test_the_key_is_required_and_health_is_open(server, lt):
    body = {"queries": ["zorvik age"]}
    for key in (None, "wrong", KEY + "x"):
        status, out = post(lt, server.url + "/retrieve", body, key=key)
        assert status == 401 and "Unauthorized" in out["detail"], key
    assert post(lt, server.url + "/retrieve", body)[0] == 200
    assert post(lt, server.url + "/health", None, key=None, method="GET") == (200, {"status": "ok", "docs": 128})
    assert server.counters["unauthorized"] == 3


# ------------------------------------------------------------------------------------------------ the index cache
def test_the_index_is_cached_by_corpus_hash_and_a_hostile_cache_is_rebuilt_not_unpickled(tiny, tmp_path):
    cache = tmp_path / "cache"
    first = Bm25Index.open(tiny / "corpus.jsonl", cache)
    second = Bm25Index.open(tiny / "corpus.jsonl", cache)
    assert not first.cached and second.cached
    [entry] = [p for p in cache.iterdir() if p.is_dir()]
    assert entry.name.startswith(first.corpus_sha)
    q = ["zorvik age", "kwimbo size"]
    assert [[(d.id, s) for d, s in r] for r in first.search(q, 3)] == [[(d.id, s) for d, s in r]
                                                                       for r in second.search(q, 3)]
    # another corpus: another entry, built
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "1", "contents": '"a"\nzorvik'}) + "\n")
    assert not Bm25Index.open(other, cache).cached
    # a cache file replaced by a pickle that would write a file when unpickled: refused, the index rebuilt
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))
    np.save(entry / "data.csc.index.npy", np.array([Evil()], dtype=object), allow_pickle=True)
    again = Bm25Index.open(tiny / "corpus.jsonl", cache)
    assert not again.cached and not marker.exists()
    # a cache that loads but does not fit the corpus (another corpus's arrays under this hash): rebuilt too
    for name in ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy"):
        np.save(entry / name, np.zeros(3, dtype=np.int32 if "ind" in name else np.float32))
    assert not Bm25Index.open(tiny / "corpus.jsonl", cache).cached


def test_a_bad_corpus_names_every_bad_line(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join([json.dumps({"id": "a", "contents": '"t"\nx'}), "{not json", json.dumps([1]),
                            json.dumps({"id": "a", "title": "t", "text": "y"}), json.dumps({"id": "b"}),
                            json.dumps({"id": True, "contents": "x"})]) + "\n")
    with pytest.raises(CorpusError) as e:
        read_corpus(p)
    msg = str(e.value)
    assert "5 bad line(s)" in msg
    for n in (2, 3, 4, 5, 6):
        assert f"line {n}:" in msg
    assert "already on line 1" in msg
    with pytest.raises(CorpusError, match="no such file"):
        read_corpus(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(CorpusError, match="no documents"):
        read_corpus(tmp_path / "empty.jsonl")


# ------------------------------------------------------------------------------------------------ the client
def test_the_client_fails_over_to_another_replica_and_back_to_a_restarted_one(tiny, lt, tmp_path):
    """Two replicas; one dies (its port closed) with requests going on: every request is answered, by the other;
    it comes back on a new port and its resolver gives that: it answers again. A request to a replica that hangs
    is timed out and answered by the other one."""
    from slime_actors.search.client import RetrieverError, RetrieverPool
    index = Bm25Index.open(tiny / "corpus.jsonl", tmp_path / "cache")
    servers = [RetrieverServer(index, api_key=KEY) for _ in range(2)]
    for s in servers:
        lt.call(s.start())
    urls = [s.url for s in servers]
    pool = RetrieverPool([lambda i=i: urls[i] for i in range(2)], key=KEY, timeout=2, deadline=20)

    async def many(n):
        return await asyncio.gather(*(pool.retrieve(["zorvik age"], 1) for _ in range(n)))
    assert len(lt.call(many(8))) == 8
    lt.call(servers[0].stop())
    out = lt.call(many(8))
    assert all(r["result"][0][0]["document"]["id"] == "zorvik-age" for r in out)
    assert pool.counters["retries"] >= 1
    restarted = RetrieverServer(index, api_key=KEY)
    lt.call(restarted.start())
    urls[0] = restarted.url
    lt.call(asyncio.sleep(1.1))       # past the set-aside moment
    lt.call(many(8))
    assert restarted.counters["requests"] >= 1
    # a hung replica: its request times out and goes to the other one; with no other one, the call fails in time

    release = asyncio.Event()

    class Hung(RetrieverServer):
        async def _retrieve(self, request):
            await release.wait()
            return self._json({"detail": "released"}, 503)
    hung = Hung(index, api_key=KEY)
    lt.call(hung.start())
    pool2 = RetrieverPool([lambda: hung.url, lambda: servers[1].url], key=KEY, timeout=0.5, deadline=10)
    assert lt.call(pool2.retrieve(["zorvik age"], 1))["result"][0][0]["document"]["id"] == "zorvik-age"
    assert pool2.counters["retries"] == 1
    lt.call(pool2.close())
    pool3 = RetrieverPool([lambda: hung.url], key=KEY, timeout=0.3, deadline=1)
    with pytest.raises(RetrieverError, match="no retriever replica answered"):
        lt.call(pool3.retrieve(["zorvik age"], 1))
    lt.call(pool3.close())
    lt.loop.call_soon_threadsafe(release.set)
    lt.call(hung.stop())
    # a refusal is not retried: it is the request's fault
    with pytest.raises(RetrieverError, match="HTTP 422"):
        lt.call(RetrieverPool([lambda: servers[1].url], key=KEY).retrieve(["x"], 0))
    for s in (servers[1], restarted):
        lt.call(s.stop())
    lt.call(pool.close())


# ------------------------------------------------------------------------------------------------ the worlds
def test_the_worlds_are_made_by_their_seed(tmp_path):
    for make in (tiny_world, natural_world):
        a, b, c = make(7), make(7), make(8)
        assert a == b and a != c
        a.write(tmp_path / "a")
        b.write(tmp_path / "b")
        for name in ("corpus.jsonl", "train.jsonl", "heldout.jsonl"):
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    # the shipped files are the generator's (python -m slime_actors.search.corpus ... --seed 7)
    for variant, make in (("tiny", tiny_world), ("natural", natural_world)):
        make(7).write(tmp_path / variant)
        for name in ("corpus.jsonl", "train.jsonl", "heldout.jsonl"):
            assert (tmp_path / variant / name).read_bytes() == \
                (ROOT / "examples" / "search" / variant / name).read_bytes(), (variant, name)


@pytest.mark.parametrize("make,k", [(tiny_world, 1), (natural_world, 3)], ids=["tiny", "natural"])
def test_held_out_answers_are_found_by_retrieval_and_by_nothing_else(make, k, tmp_path):
    """Every held-out answer is in the top-k documents BM25 finds for the question, and in the document its row
    names; no held-out fact is asked in training; the answer is not in the question; and guessing from the
    training answers (the commonest one per attribute) is right no more than chance allows."""
    world = make(7)
    path = world.write(tmp_path) / "corpus.jsonl"
    index = Bm25Index.open(path)
    by_id = {d.id: d for d in world.docs}
    trained = {(r["metadata"]["entity"], r["metadata"]["attribute"]) for r in world.train}
    for row in world.heldout:
        m, answer = row["metadata"], row["label"]
        assert (m["entity"], m["attribute"]) not in trained
        assert answer.lower() not in tokenize(m["question"])
        assert answer in by_id[m["doc_id"]].text
        hits = index.search([m["question"]], k)[0]
        assert any(answer in d.text and d.id == m["doc_id"] for d, _ in hits), (m, hits)
        assert row["reward_model"]["ground_truth"]["target"] == [answer]
    from collections import Counter
    common = {a: Counter(r["label"] for r in world.train if r["metadata"]["attribute"] == a).most_common(1)[0][0]
              for a in {r["metadata"]["attribute"] for r in world.train}}
    guessed = sum(common[r["metadata"]["attribute"]] == r["label"] for r in world.heldout) / len(world.heldout)
    assert guessed < 0.3, guessed


def test_the_tiny_world_is_in_the_tiny_search_models_vocabulary():
    from slime_actors.models.tiny import make_tokenizer, words_of
    tok = make_tokenizer(words_of("search"))
    unk = tok.convert_tokens_to_ids("<unk>")
    world = tiny_world(7)
    texts = [d.text for d in world.docs] + [r["input"] for r in world.train + world.heldout]
    texts += ["<search> zorvik age </search> <information> zorvik age is 5 </information> <answer> 5 </answer>"]
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert unk not in ids and len(ids) == len(t.split()), t
        assert tok.decode(ids) == t
    # the other tiny models keep their vocabulary
    assert make_tokenizer().get_vocab() == make_tokenizer(words_of("digits")).get_vocab()
    assert len(make_tokenizer(words_of("search"))) > len(make_tokenizer())


def test_natural_names_are_not_words():
    """No name of the natural world is a word of SmolLM2's vocabulary (where the words of its training text are
    single tokens), with or without a leading space, in any case."""
    from slime_actors.models.smollm2 import gguf_path
    from transformers import AutoTokenizer
    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    vocab = set(tok.get_vocab())
    world = natural_world(7)
    names = {part for d in world.docs for part in d.title.split()}
    names |= {r["label"] for r in world.train + world.heldout if r["metadata"]["attribute"] == "birthplace"}
    words = {w for n in names for w in (n, n.lower(), "Ġ" + n, "Ġ" + n.lower())}
    assert not words & vocab, sorted(words & vocab)[:10]
    assert "Ġtown" in vocab and "Ġglass" in vocab   # (the check would see a real word)


def test_doc_contents_round_trip():
    d = Doc("1", "Title", "line one\nline two")
    from slime_actors.search.corpus import split_contents
    assert split_contents(d.contents) == ("Title", "line one\nline two")
    assert split_contents("no title") == ("", "no title")


# ------------------------------------------------------------------------------------------------ flags and placement
def test_retriever_flags_are_checked_and_place_the_role(tmp_path):
    from helpers import job_config
    from slime_actors.config import ConfigError
    from slime_actors.launch.topology import default_topology, from_dict
    corpus = str(ROOT / "examples" / "search" / "tiny" / "corpus.jsonl")
    for flags, msg in (({"retriever_corpus": corpus, "retriever_url": "http://h:1"}, "not both"),
                       ({"retriever_url": "h:1"}, "must be http://"),
                       ({"retriever_api_key_file": "k"}, "is the key of --retriever-url"),
                       ({"retriever_corpus": corpus, "retriever_topk": 0}, "--retriever-topk must be >= 1"),
                       ({"retriever_corpus": corpus, "retriever_timeout": 0}, "--retriever-timeout must be > 0")):
        with pytest.raises(ConfigError, match=msg):
            job_config(**flags)
    cfg = job_config(retriever_corpus=corpus, retriever_num_replicas=3)
    topo = default_topology(cfg)
    assert [p.name for p in topo.plan() if p.role == "retriever"] == [f"retriever/{i}" for i in range(3)]
    assert "retriever" not in default_topology(job_config()).roles
    roles = {"buffer": {}, "reward": {}, "rollout": {}, "trainer": {}}
    t = from_dict({"roles": {**roles, "retriever": {"count": 2}}}, "t.toml")
    assert t.apply_to_config(cfg) == ["--retriever-num-replicas 3 -> 2"]
    with pytest.raises(ValueError, match="serves --retriever-corpus, and the job has none"):
        from_dict({"roles": {**roles, "retriever": {"count": 1}}}, "t.toml").apply_to_config(job_config())
    with pytest.raises(ValueError, match=r"has no \[roles.retriever\]"):
        from_dict({"roles": roles}, "t.toml").apply_to_config(job_config(retriever_corpus=corpus))


def test_the_jobs_retriever_key_is_made_once_kept_private_and_shared(tmp_path, monkeypatch):
    from helpers import job_config
    from slime_actors.search.keys import RetrieverKeyError, job_retriever_key
    monkeypatch.delenv("SLIME_ACTORS_RETRIEVER_KEY", raising=False)
    corpus = str(ROOT / "examples" / "search" / "tiny" / "corpus.jsonl")
    r = job_config(retriever_corpus=corpus).retriever
    with pytest.raises(RetrieverKeyError, match="no retriever key"):
        job_retriever_key(r, tmp_path, create=False)
    key = job_retriever_key(r, tmp_path, create=True)
    path = tmp_path / "keys" / "retriever.key"
    assert path.read_text().strip() == key and (path.stat().st_mode & 0o777) == 0o600
    assert job_retriever_key(r, tmp_path, create=False) == key          # another node, or a restarted head
    assert job_retriever_key(job_config().retriever, tmp_path, create=True) is None
    ext = tmp_path / "ext.key"
    ext.write_text("external-key\n")
    os.chmod(ext, 0o644)
    with pytest.raises(RetrieverKeyError, match="can be read by other users"):
        job_retriever_key(job_config(retriever_url="http://h:1", retriever_api_key_file=str(ext)).retriever,
                          tmp_path, create=True)
    os.chmod(ext, 0o600)
    assert job_retriever_key(job_config(retriever_url="http://h:1", retriever_api_key_file=str(ext)).retriever,
                             tmp_path, create=True) == "external-key"
