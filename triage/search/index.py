"""The embedded index: folders of Markdown and YAML, one collection per folder, BM25 via SQLite FTS5.

Markdown is cut at headings (and long sections at paragraphs), YAML is kept whole per document;
every chunk keeps the source URL of its file. URLs come from an `INDEX.jsonl` in the folder
(`{"path", "url"}` per line), else from a `url:` front-matter key, else `base_url` + the path.

Serve the embedded index as an MCP server with the Kubeflow docs agent's tools and result format.

Tools (names from the config's `[tools]` map, tool -> collection; the signature follows the
collection: `issues` gets the issue filters, `code` the resource-kind filter, any other the docs one):

    search_kubeflow_docs(query, top_k=5)
    search_github_issues(query, top_k=5, repo="", state="")
    search_kubeflow_code(query, top_k=5, resource_kind="")

Each returns the docs agent's Markdown: `### Result i (score: x)` blocks with a `**Source:** <url>`
line, joined by `\n---\n`; `No results found for your query.` when nothing matches; and
`Search rejected: ...` for an empty query or one over 512 characters (as the agent's server does).

Started by `triage index serve` (`triage.app.Triage.serve_index`), its one way in.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from triage import jsonl
from triage.domain.config import IndexFolder
from triage.domain.records import Passage
from triage.errors import ConfigError

if TYPE_CHECKING:  # the server's libraries load only when `triage index serve` runs, never in the nightly job
    from mcp.server.mcpserver import MCPServer

MAX_CHUNK_CHARS = 1800
#: a section shorter than this is joined with the sections after it (up to MAX_CHUNK_CHARS): a
#: heading with a line under it ("ISSUE: notebook not starting") is no passage on its own, and the
#: steps that answer it are in the sections that follow
MIN_CHUNK_CHARS = 400
_FRONT_MATTER = re.compile(r"\A(?:\+\+\+\n(?P<toml>.*?)\n\+\+\+|---\n(?P<yaml>.*?)\n---)\s*\n", re.DOTALL)
_HEADING = re.compile(r"^(#{1,4})\s+(.+?)\s*#*\s*$", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z0-9_]+")
SUFFIXES = (".md", ".markdown", ".yaml", ".yml")


@dataclass(frozen=True)
class Chunk:
    id: str
    collection: str
    source_url: str
    title: str
    text: str
    #: filterable attributes: `repo`, `state` (issues), `kind` (YAML resources)
    attrs: Mapping[str, str] = field(default_factory=dict)


def _front_matter(text: str) -> tuple[dict[str, str], str]:
    """Title and url from TOML or YAML front matter (simple `key = value` / `key: value` lines)."""
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}, text
    block = match.group("toml") or match.group("yaml") or ""
    meta: dict[str, str] = {}
    for line in block.splitlines():
        found = re.match(r"^(\w+)\s*[:=]\s*[\"']?(.*?)[\"']?\s*$", line)
        if found:
            meta.setdefault(found.group(1).lower(), found.group(2))
    return meta, text[match.end() :]


def _split_long(text: str) -> Iterator[str]:
    if len(text) <= MAX_CHUNK_CHARS:
        yield text
        return
    part = ""
    for para in re.split(r"\n\s*\n", text):
        if part and len(part) + len(para) > MAX_CHUNK_CHARS:
            yield part
            part = ""
        part = f"{part}\n\n{para}" if part else para
    if part:
        yield part


def chunk_markdown(body: str, title: str, min_chars: int = MIN_CHUNK_CHARS) -> Iterator[tuple[str, str]]:
    """(heading path, text) pieces of a Markdown body, cut at headings; a section shorter than
    `min_chars` takes the sections after it in while they fit (labelled by its own heading)."""
    starts = [m.start() for m in _HEADING.finditer(body)]
    bounds = [0, *starts, len(body)]
    pending: tuple[str, str] | None = None
    for begin, end in zip(bounds, bounds[1:], strict=False):
        section = body[begin:end].strip()
        if not section:
            continue
        if pending and len(pending[1]) < min_chars and len(pending[1]) + 2 + len(section) <= MAX_CHUNK_CHARS:
            pending = (pending[0], f"{pending[1]}\n\n{section}")
            continue
        if pending:
            yield from _pieces(*pending)
        heading = _HEADING.match(section)
        pending = (f"{title} > {heading.group(2)}" if heading else title, section)
    if pending:
        yield from _pieces(*pending)


def _pieces(label: str, section: str) -> Iterator[tuple[str, str]]:
    for piece in _split_long(section):
        if len(_WORD.findall(piece)) >= 3:
            yield label, piece


def _urls_from_index_file(folder: Path) -> dict[str, str]:
    index_file = folder / "INDEX.jsonl"
    if not index_file.exists():
        return {}
    urls: dict[str, str] = {}
    for number, line in jsonl.lines(index_file.read_text(encoding="utf-8")):
        try:
            row = jsonl.parse(line)
        except ValueError as ex:
            raise ConfigError(f"{index_file}, line {number}: not JSON: {str(ex)[:200]}") from None
        if isinstance(row, dict) and row.get("path") and row.get("url"):
            urls[row["path"]] = row["url"]
    return urls


_GITHUB_REPO = re.compile(r"^https://github\.com/([^/]+/[^/]+)/")
_YAML_KIND = re.compile(r"^kind:\s*[\"']?([A-Za-z0-9]+)", re.MULTILINE)


def _attrs(url: str, meta: Mapping[str, str], text: str | None) -> dict[str, str]:
    """Filterable attributes: repo from front matter or a GitHub URL, issue state, YAML kind."""
    attrs: dict[str, str] = {}
    repo = meta.get("repo") or meta.get("repo_name")
    if not repo and (found := _GITHUB_REPO.match(url)):
        repo = found.group(1)
    if repo:
        attrs["repo"] = repo
    state = meta.get("state") or meta.get("issue_state")
    if state:
        attrs["state"] = state.lower()
    if text is not None and (kind := _YAML_KIND.search(text)):
        attrs["kind"] = kind.group(1)
    return attrs


def chunks_of_folder(folder: IndexFolder, min_chunk_chars: int = MIN_CHUNK_CHARS) -> Iterator[Chunk]:
    """The folder's chunks; `min_chunk_chars=0` cuts Markdown at every heading (see `chunk_markdown`)."""
    root = Path(folder.path)
    if not root.is_dir():
        raise ConfigError(f"index folder not found: {root} (check [[index]] in the configuration)")
    urls = _urls_from_index_file(root)
    for path in sorted(root.rglob("*")):
        if path.suffix.lower() not in SUFFIXES or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix.lower() in (".md", ".markdown"):
            meta, body = _front_matter(text)
            title = meta.get("title") or path.stem
            url = urls.get(rel) or meta.get("url") or _default_url(folder, rel)
            attrs = _attrs(url, meta, None)
            pieces = [(label, piece, attrs) for label, piece in chunk_markdown(body, title, min_chunk_chars)]
        else:
            title = path.name
            url = urls.get(rel) or _default_url(folder, rel)
            docs = [d.strip() for d in re.split(r"^---\s*$", text, flags=re.MULTILINE)]
            # each YAML document keeps its own `kind`, so a kind filter finds the right one
            pieces = [(title, piece, _attrs(url, {}, d)) for d in docs if d for piece in _split_long(d)]
        for n, (label, piece, attrs) in enumerate(pieces):
            yield Chunk(f"{folder.collection}:{rel}#{n}", folder.collection, url, label, piece, attrs)


def _default_url(folder: IndexFolder, rel: str) -> str:
    if folder.base_url:
        stem = re.sub(r"(/?_?index)?\.(md|markdown)$", "", rel)
        return folder.base_url.rstrip("/") + "/" + (stem + "/" if stem else "")
    return f"file://{(Path(folder.path) / rel).resolve()}"


# question words that carry no topic; dropped from queries (unless nothing else is left)
STOPWORDS = frozenset(
    """a an and are as at be but by can could do does did for from have has how i if in into is it its me my
    of on or our should so that the their then there these this to use using was we what when where which
    while who why will with would you your""".split()
)


def fts_query(text: str) -> str:
    """An FTS5 OR-query of the words of `text` (quoted, so user text is never FTS syntax)."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(text) if len(w) > 1))
    topical = [w for w in words if w not in STOPWORDS]
    return " OR ".join(f'"{w}"' for w in topical or words)


def path_words(chunk_id: str) -> str:
    """The words of a chunk's file path ("docs:components/katib/user-guides/early-stopping.md#2" ->
    "components katib user guides early stopping"): pages are often named for what they answer."""
    rel = chunk_id.split(":", 1)[-1].rsplit("#", 1)[0]
    words = re.findall(r"[A-Za-z0-9]+", re.sub(r"\.(md|markdown|ya?ml)$", "", rel))
    return " ".join(w for w in words if w.lower() not in {"index", "v1beta1", "examples"})


class Index:
    """An in-memory FTS5 index over chunks. Thread-safe for concurrent searches."""

    #: BM25 weights of the title (page title > heading), the file path's words, and the text;
    #: chosen on bench/questions.jsonl (see bench/README.md)
    WEIGHTS = (2.0, 2.0, 1.0)

    def __init__(self, chunks: Iterable[Chunk], *, weights: tuple[float, float, float] | None = None) -> None:
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._lock = threading.Lock()
        self._weights = weights or self.WEIGHTS
        self._db.execute(
            "CREATE VIRTUAL TABLE chunks USING fts5("
            "id UNINDEXED, collection UNINDEXED, source_url UNINDEXED, attrs UNINDEXED, title, path, text, "
            "tokenize='porter unicode61')"
        )
        self._db.executemany(
            "INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                (
                    c.id,
                    c.collection,
                    c.source_url,
                    json.dumps(dict(c.attrs)),
                    c.title,
                    path_words(c.id),
                    c.text,
                )
                for c in chunks
            ),
        )
        self.collections: list[str] = [
            row[0] for row in self._db.execute("SELECT DISTINCT collection FROM chunks ORDER BY 1")
        ]
        self.size: int = self._db.execute("SELECT count(*) FROM chunks").fetchone()[0]

    @classmethod
    def from_folders(cls, folders: Sequence[IndexFolder]) -> Index:
        return cls(chunk for folder in folders for chunk in chunks_of_folder(folder))

    def search(
        self, query: str, collection: str, top_k: int = 5, filters: Mapping[str, str] | None = None
    ) -> list[Passage]:
        """The `top_k` best chunks of `collection` for `query`; `filters` match chunk attributes
        (`repo`, `state`, `kind`) case-insensitively."""
        match = fts_query(query)
        if not match:
            return []
        weights = ", ".join(str(float(w)) for w in self._weights)  # title, path, text
        sql = (
            # title and path matches weigh more than body matches; bm25() is lower-is-better
            f"SELECT id, source_url, title, text, bm25(chunks, 0, 0, 0, 0, {weights}) AS rank "
            "FROM chunks WHERE chunks MATCH ? AND collection = ?"
        )
        args: list[object] = [match, collection]
        for key, value in (filters or {}).items():
            if value:
                sql += " AND lower(json_extract(attrs, ?)) = lower(?)"
                args += [f"$.{key}", value]
        sql += " ORDER BY rank LIMIT ?"
        args.append(top_k)
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [
            Passage(id=cid, source_url=url, collection=collection, title=title, text=text, score=-rank)
            for cid, url, title, text, rank in rows
        ]


MAX_QUERY_CHARS = 512
MAX_TOP_K = 10
NO_RESULTS = "No results found for your query."
SERVER_NAME = "triage embedded index"


def _check_args(query: str, top_k: int) -> tuple[str, int]:
    """Normalise arguments the way the docs agent does; ValueError says why a call is rejected."""
    query = " ".join(str(query).split())
    if not query:
        raise ValueError("query must be a non-empty string")
    if len(query) > MAX_QUERY_CHARS:
        raise ValueError(f"query exceeds the {MAX_QUERY_CHARS}-character limit")
    return query, min(MAX_TOP_K, max(1, int(top_k)))


def _file_of(passage: Passage) -> str:
    # chunk ids are "<collection>:<relative path>#<n>"
    return passage.id.split(":", 1)[-1].rsplit("#", 1)[0]


def format_results(passages: Sequence[Passage]) -> str:
    """The docs agent's Markdown result text."""
    if not passages:
        return NO_RESULTS
    blocks = []
    for i, passage in enumerate(passages, 1):
        blocks.append(
            f"### Result {i} (score: {passage.score or 0.0:.4f})\n"
            f"**Source:** {passage.source_url or ''}\n"
            f"**File:** {_file_of(passage)}\n"
            f"**Section:** {passage.title or ''}\n\n"
            f"{passage.text}\n"
        )
    return "\n---\n".join(blocks)


def _run(index: Index, collection: str, query: str, top_k: int, filters: Mapping[str, str]) -> str:
    try:
        query, top_k = _check_args(query, top_k)
    except (TypeError, ValueError) as ex:
        return f"Search rejected: {ex}"
    return format_results(index.search(query, collection, top_k, filters=filters))


def _docs_tool(index: Index, collection: str) -> Callable[..., str]:
    def search(query: str, top_k: int = 5) -> str:
        """Search the documentation. Returns Markdown results with their source URLs."""
        return _run(index, collection, query, top_k, {})

    return search


def _issues_tool(index: Index, collection: str) -> Callable[..., str]:
    def search(query: str, top_k: int = 5, repo: str = "", state: str = "") -> str:
        """Search GitHub issues (optionally of one repo "owner/name", in one state: open or closed)."""
        return _run(index, collection, query, top_k, {"repo": repo, "state": state})

    return search


def _code_tool(index: Index, collection: str) -> Callable[..., str]:
    def search(query: str, top_k: int = 5, resource_kind: str = "") -> str:
        """Search code and YAML manifests (optionally only resources of one kind, e.g. Experiment)."""
        return _run(index, collection, query, top_k, {"kind": resource_kind})

    return search


def search_tools(index: Index, tools: Mapping[str, str]) -> dict[str, Callable[..., str]]:
    """One search function per `tools` entry (tool name -> collection), with the docs agent's
    arguments and answers: what `build_server` serves (and the tests serve through other SDKs)."""
    made: dict[str, Callable[..., str]] = {}
    for name, collection in tools.items():
        make = {"issues": _issues_tool, "code": _code_tool}.get(collection, _docs_tool)
        made[name] = make(index, collection)
    return made


def build_server(index: Index, tools: Mapping[str, str]) -> MCPServer:
    """An MCP server with one search tool per `tools` entry (tool name -> collection)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(SERVER_NAME, instructions="Search tools over an embedded index of documentation.")
    for name, fn in search_tools(index, tools).items():
        # tools are sync: MCPServer runs them in a worker thread, and the index is thread-safe
        server.add_tool(fn, name=name, description=fn.__doc__)
    return server


def serve(
    index: Index,
    tools: Mapping[str, str],
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    stdio: bool = False,
) -> None:
    """Serve until interrupted: streamable HTTP at http://host:port/mcp, or stdio."""
    server = build_server(index, tools)
    if stdio:
        server.run("stdio")
    else:
        # a search is one request and one answer: a JSON body costs both ends about a third less
        # CPU than an SSE stream of one event (bench/nightly.py's profile)
        server.run("streamable-http", host=host, port=port, streamable_http_path="/mcp", json_response=True)
