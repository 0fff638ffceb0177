"""BM25 over a corpus (the bm25s library: sparse-matrix BM25, Lucene's scoring by default), built once and cached.

    index = Bm25Index.open("examples/search/tiny/corpus.jsonl", cache_dir="runs/.retriever")
    hits = index.search(["zorvik age", "quelby home"], k=3)     # per query [(Doc, score)], best first
    index.cached                                                  # True: loaded from the cache, not built

The cache is a directory per corpus and setting, `CACHE_DIR/<sha256 of the corpus file>-<settings>/`: bm25s's own
files -- numpy arrays (`.npy`) and JSON --, written to a temporary directory and renamed into place (two processes
building at once both finish; one directory wins). Loading reads the arrays with `allow_pickle=False`, so a cache
file someone replaced cannot run code (an object array is refused), and the loaded index is checked against the
corpus (its number of documents, its vocabulary); a cache that fails to load or to match is built again, with a
warning. The corpus itself is always read from its file (the cache holds no documents).

Tokens: lower-cased runs of letters and digits (`\\w+`), single characters kept (the tiny world's answers are digits).
A query with no known token matches nothing; documents that match no query token (score 0) are not returned.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

from ..log import get_logger
from .corpus import Doc, corpus_hash, read_corpus
from ..json_files import read_json_object

_TOKEN = re.compile(r"\w+", re.UNICODE)
K1, B, METHOD = 1.2, 0.75, "lucene"
CACHE_VERSION = 1


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def default_cache_dir(run_dir: str | os.PathLike | None) -> Path:
    """Next to the run directory (shared by the runs beside it, like the model cache): RUN_DIR/../.retriever."""
    if run_dir is None:
        return Path.home() / ".cache" / "slime-actors" / "retriever"
    return Path(run_dir).resolve().parent / ".retriever"


class Bm25Index:
    def __init__(self, docs: list[Doc], bm25, corpus_sha: str, cached: bool):
        self.docs, self._bm25, self.corpus_sha, self.cached = docs, bm25, corpus_sha, cached
        self._lock = threading.Lock()   # bm25s's retrieve is not documented as thread-safe: one search at a time

    @classmethod
    def open(cls, corpus_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> "Bm25Index":
        """The corpus's index: from the cache when one matches, else built (and cached, when `cache_dir`)."""
        log = get_logger(component="retriever")
        sha = corpus_hash(corpus_path)
        docs = read_corpus(corpus_path)
        where = Path(cache_dir) / f"{sha}-bm25-{METHOD}-k{K1}-b{B}-v{CACHE_VERSION}" if cache_dir else None
        if where is not None and where.is_dir():
            try:
                bm25 = _load(where, len(docs))
                log.info("BM25 index loaded from the cache", path=str(where), docs=len(docs), console=False)
                return cls(docs, bm25, sha, cached=True)
            except Exception as exc:  # anything wrong with it: build again
                log.warning("BM25 index cache unusable; building it again", path=str(where), error=str(exc)[:300])
        t0 = time.monotonic()
        bm25 = _build(docs)
        log.info("BM25 index built", docs=len(docs), seconds=round(time.monotonic() - t0, 2))
        if where is not None:
            _save(bm25, where)
        return cls(docs, bm25, sha, cached=False)

    def search(self, queries: list[str], k: int) -> list[list[tuple[Doc, float]]]:
        """For each query, up to `k` documents with a score > 0, best first."""
        k = max(1, min(k, len(self.docs)))
        tokens = [tokenize(q) or [""] for q in queries]
        with self._lock:
            ids, scores = self._bm25.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        out = []
        for row_ids, row_scores in zip(ids.tolist(), scores.tolist()):
            out.append([(self.docs[i], float(s)) for i, s in zip(row_ids, row_scores) if s > 0])
        return out


def _bm25s():
    import logging

    import bm25s
    logging.getLogger("bm25s").setLevel(logging.WARNING)   # its debug lines would reach the console
    return bm25s


def _build(docs: list[Doc]):
    bm25s = _bm25s()
    bm25 = bm25s.BM25(k1=K1, b=B, method=METHOD)
    bm25.index([tokenize(d.title + " " + d.text) for d in docs], show_progress=False)
    return bm25


def _save(bm25, where: Path) -> None:
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=where.name + ".", dir=where.parent))
    try:
        bm25.save(str(tmp), allow_pickle=False)
        (tmp / "slime_actors.json").write_text(json.dumps({"version": CACHE_VERSION}))
        try:
            os.rename(tmp, where)
        except OSError:  # another process put its copy there first: keep that one
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load(where: Path, n_docs: int):
    """bm25s's files, with no pickle, checked against the corpus."""
    bm25s = _bm25s()
    stamp = read_json_object(where / "slime_actors.json")
    if stamp.get("version") != CACHE_VERSION:
        raise ValueError(f"cache version {stamp.get('version')!r}, expected {CACHE_VERSION}")
    bm25 = bm25s.BM25.load(str(where), load_corpus=False, mmap=False, allow_pickle=False)
    indptr, indices, data = bm25.scores["indptr"], bm25.scores["indices"], bm25.scores["data"]
    n_vocab = len(bm25.vocab_dict)
    if bm25.scores.get("num_docs") != n_docs:
        raise ValueError(f"the cached index has {bm25.scores.get('num_docs')} documents, the corpus {n_docs}")
    if not all(isinstance(v, int) and 0 <= v < n_vocab for v in bm25.vocab_dict.values()):
        raise ValueError("the cached vocabulary's token ids are out of range")
    if not (1 <= len(indptr) <= n_vocab + 1) or int(indptr[0]) != 0 or int(indptr[-1]) != len(indices) \
            or len(indices) != len(data) or (len(indptr) > 1 and bool((indptr[1:] < indptr[:-1]).any())):
        raise ValueError("the cached index's arrays do not fit together")
    indices = bm25.scores["indices"]
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= n_docs):
        raise ValueError("the cached index names documents the corpus does not have")
    return bm25
