"""Search: a corpus of made-up facts, a BM25 index over it, and the retriever that serves it over HTTP in the
protocol of Search-R1's retrieval server (docs/search.md).

    corpus.py   the seeded generator of the example worlds, and the corpus reader (jsonl, checked)
    index.py    BM25 (bm25s) over a corpus, built once and cached on disk by the corpus's hash
    server.py   the HTTP server: POST /retrieve, GET /health; keys, limits, FastAPI-style errors
    client.py   the client: one or several replicas, failover and retries
    keys.py     the job's retriever key
"""
