"""Serve the embedded index as an MCP server with the Kubeflow docs agent's tools and result format.

Tools (names from the config's `[tools]` map, tool -> collection; the signature follows the
collection: `issues` gets the issue filters, `code` the resource-kind filter, any other the docs one):

    search_kubeflow_docs(query, top_k=5)
    search_github_issues(query, top_k=5, repo="", state="")
    search_kubeflow_code(query, top_k=5, resource_kind="")

Each returns the docs agent's Markdown: `### Result i (score: x)` blocks with a `**Source:** <url>`
line, joined by `\\n---\\n`; `No results found for your query.` when nothing matches; and
`Search rejected: ...` for an empty query or one over 512 characters (as the agent's server does).

Started by `triage index serve` (`triage.app.Triage.serve_index`), its one way in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from mcp.server.mcpserver import MCPServer

from triage.domain.records import Passage
from triage.search.index import Index

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


def build_server(index: Index, tools: Mapping[str, str]) -> MCPServer:
    """An MCP server with one search tool per `tools` entry (tool name -> collection)."""
    server = MCPServer(SERVER_NAME, instructions="Search tools over an embedded index of documentation.")
    for name, collection in tools.items():
        make = {"issues": _issues_tool, "code": _code_tool}.get(collection, _docs_tool)
        fn = make(index, collection)
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
        server.run("streamable-http", host=host, port=port, streamable_http_path="/mcp")
