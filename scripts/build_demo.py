"""Rebuilds the demo data (triage/demo/traces.jsonl, expected.jsonl) from scripts/demo_specs.toml.

    python scripts/build_demo.py              # from the repository root: writes into triage/demo/
    python scripts/build_demo.py --out DIR    # writes the two files into DIR instead

Every trace is written so the offline heuristic judge lands it on `layer`/`component`. Agent passages are
rendered from the demo index's own chunks (triage/demo/index), so what the agent "retrieved" is exactly what
the index holds. Timestamps are fixed (one day); `triage demo` shifts them to the time of the run.

The specs are data (demo_specs.toml, whose header documents every field) and this script is only the
building code. Both live outside the package, so the wheel ships the demo data but not its builder; the
sdist keeps them. tests/cli/test_demo_builder.py rebuilds into a temporary directory and compares the result
with the shipped files byte for byte, so the data cannot drift from its specs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict, cast

from triage.domain.config import IndexFolder
from triage.search.index import Chunk, chunks_of_folder

# paths follow this file, not the working directory
REPO = Path(__file__).resolve().parents[1]
DEMO_DIR = REPO / "triage" / "demo"
SPECS_FILE = Path(__file__).resolve().with_name("demo_specs.toml")
COLLECTIONS = ("docs", "issues", "code")

# the demo's clock: one trace every 25 minutes, its thumbs-down 2 minutes after it starts
TRACE_SPACING = timedelta(minutes=25)
VOTE_DELAY = timedelta(minutes=2)
# an unrated answer never starts at the same minute as a rated trace
UNRATED_OFFSET = timedelta(minutes=3)

TEXT_KEYS = ("content", "input", "output", "question", "query", "answer", "text")
CHAT_SHAPES = ("chat", "parts", "messages-obj")


# ---------------------------------------------------------------- the specs file


class _CallRequired(TypedDict):
    tool: str
    query: str


class CallSpec(_CallRequired, total=False):
    """One search call of the agent (the `[[trace.calls]]` tables)."""

    ids: list[str]
    kind: str
    error: str
    type: str
    bare: bool


class _TraceRequired(TypedDict):
    id: str
    user: str
    question: str
    answer: str


class TraceSpec(_TraceRequired, total=False):
    """One trace (a `[[trace]]` table); demo_specs.toml's header says what each field does."""

    layer: str
    component: str
    shape: str
    comment: str
    root_type: str
    input_shape: str
    output_shape: str
    history: list[list[str]]
    openai: bool
    calls: list[CallSpec]
    session: str
    session_turn: int
    vote_line: str
    offset_min: int
    release: str


class ReleaseSpec(TypedDict):
    """One release of the agent (a `[[release]]` table)."""

    name: str
    version: str
    unrated: int


class AnswerSpec(TypedDict):
    """A fine answer nobody voted on (an `[[answer]]` table), cycled through by the unrated traces."""

    question: str
    answer: str


class Specs(TypedDict):
    start: datetime
    system_prompt: str
    release: list[ReleaseSpec]
    answer: list[AnswerSpec]
    trace: list[TraceSpec]


TRACE_KEYS = TraceSpec.__required_keys__ | TraceSpec.__optional_keys__
CALL_KEYS = CallSpec.__required_keys__ | CallSpec.__optional_keys__
RELEASE_KEYS = ReleaseSpec.__required_keys__
RATED_KEYS = {"layer", "component", "shape"}


def load_specs(path: Path) -> Specs:
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    for key in ("start", "system_prompt", "release", "answer", "trace"):
        if key not in raw:
            raise ValueError(f"{path}: missing top-level key {key!r}")
    releases = [r["name"] for r in raw["release"]]
    for release in raw["release"]:
        _check_keys(release.get("name", "<release without name>"), release, RELEASE_KEYS, RELEASE_KEYS)
    for trace in raw["trace"]:
        check_trace(trace)
        if trace.get("release", releases[0]) not in releases:
            raise ValueError(f"{trace['id']}: release {trace['release']!r} is not a [[release]]")
    return cast(Specs, raw)


def check_trace(trace: Mapping[str, Any]) -> None:
    """Rejects unknown or missing keys: a misspelt optional key would silently fall back to its default."""
    where = trace.get("id", "<trace without id>")
    _check_keys(where, trace, TraceSpec.__required_keys__, TRACE_KEYS)
    if "comment" in trace:
        _check_keys(where, trace, RATED_KEYS, TRACE_KEYS)
    if "session_turn" in trace:
        _check_keys(where, trace, {"session", "vote_line"}, TRACE_KEYS)
    for call in trace.get("calls", []):
        _check_keys(f"{where} call", call, CallSpec.__required_keys__, CALL_KEYS)


def _check_keys(where: str, table: Mapping[str, Any], required: Iterable[str], known: Iterable[str]) -> None:
    missing = sorted(set(required) - set(table))
    unknown = sorted(set(table) - set(known))
    if missing or unknown:
        raise ValueError(f"{where}: missing keys {missing}, unknown keys {unknown}")


# ---------------------------------------------------------------- rendering values


def ts(t: datetime) -> str:
    """Langfuse's timestamp format: milliseconds and a Z."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def enc(value: Any) -> str:
    """Observation inputs and outputs are stored JSON-encoded, as Langfuse returns them."""
    return json.dumps(value, ensure_ascii=False)


def load_chunks(index_dir: Path) -> dict[str, Chunk]:
    """The demo index's chunks by id, cut at every heading: the agent's search server returns the
    sections the specs name (triage's own index joins short sections, which is its business)."""
    return {
        c.id: c
        for coll in COLLECTIONS
        for c in chunks_of_folder(IndexFolder(collection=coll, path=index_dir / coll), min_chunk_chars=0)
    }


class Passages:
    """Renders search results from index chunks in the shapes the agent's tools return."""

    def __init__(self, chunks: Mapping[str, Chunk]) -> None:
        self.chunks = chunks

    @staticmethod
    def score(rank: int) -> float:
        # made-up but plausible: falling with the rank
        return round(0.86 - 0.07 * rank, 2)

    def markdown(self, ids: Sequence[str]) -> str:
        """The docs agent's Markdown result list."""
        blocks = []
        for n, cid in enumerate(ids, 1):
            c = self.chunks[cid]
            blocks.append(f"### Result {n} (score: {self.score(n)})\n**Source:** {c.source_url}\n\n{c.text}")
        return "\n---\n".join(blocks)

    def mcp(self, ids: Sequence[str]) -> dict[str, Any]:
        """An MCP CallToolResult: the Markdown as text content plus structured citations."""
        cites = []
        for n, cid in enumerate(ids, 1):
            c = self.chunks[cid]
            cites.append({"url": c.source_url, "title": c.title, "text": c.text, "score": self.score(n)})
        return {
            "content": [{"type": "text", "text": self.markdown(ids)}],
            "structuredContent": {"citations": cites},
            "isError": False,
        }

    def tool_output(self, call: CallSpec) -> Any:
        """A tool output value in one of the shapes the reader accepts."""
        if "error" in call:
            return call["error"]
        ids = call.get("ids", [])
        kind = call.get("kind", "md")
        if kind == "md":
            return self.markdown(ids)
        if kind == "md-result":
            return {"result": self.markdown(ids)}
        if kind == "md-content":
            return {"content": self.markdown(ids)}
        if kind == "mcp":
            return self.mcp(ids)
        raise ValueError(f"unknown call kind {kind!r}")


def wrap_text(shape: str, text: str, role: str, system: str, history: Sequence[Sequence[str]] = ()) -> Any:
    """Root input (role user) or output (role assistant) in a reader shape."""
    if shape == "plain":
        return text
    if shape in TEXT_KEYS:
        return {shape: text}
    if shape not in CHAT_SHAPES:
        raise ValueError(f"unknown text shape {shape!r}")

    def content(t: str) -> Any:
        return [{"type": "text", "text": t}] if shape == "parts" else t

    msgs: list[dict[str, Any]] = []
    if role == "user":
        # only the input carries the conversation so far
        msgs.append({"role": "system", "content": system})
        msgs.extend({"role": r, "content": content(t)} for r, t in history)
    msgs.append({"role": role, "content": content(text)})
    if shape == "messages-obj":
        return {"messages": msgs}
    return msgs  # "chat" or "parts": a bare list of chat messages


# ---------------------------------------------------------------- one trace


class Builder:
    """The observations of one trace, with a running clock."""

    def __init__(self, trace_id: str, start: datetime, session: str | None, user: str, release: ReleaseSpec) -> None:
        self.id, self.t, self.session, self.user = trace_id, start, session, user
        self.release = release
        self.obs: list[dict[str, Any]] = []

    def add(
        self,
        typ: str,
        name: str,
        parent: str | None,
        inp: Any,
        out: Any,
        secs: float,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Appends an observation that starts now and lasts `secs`; returns its id."""
        oid = f"{self.id}-o{len(self.obs) + 1}"
        start = self.t
        self.t = self.t + timedelta(seconds=secs)
        ob: dict[str, Any] = {
            "id": oid,
            "traceId": self.id,
            "type": typ,
            "name": name,
            "parentObservationId": parent,
            "startTime": ts(start),
            "endTime": ts(self.t),
            "input": None if inp is None else enc(inp),
            "output": None if out is None else enc(out),
            "metadata": metadata or {},
            "sessionId": self.session,
            "userId": self.user,
            "environment": "default",
            # trace fields, on every row of the trace as Langfuse's v2 observations carry them
            "release": self.release["name"],
            "version": self.release["version"],
        }
        if typ == "GENERATION":
            ob["model"] = "gpt-4o-mini"
        self.obs.append(ob)
        return oid


def conversation(spec: TraceSpec, system: str) -> list[dict[str, Any]]:
    """What the answering GENERATION sees: system prompt, earlier turns, the question."""
    convo: list[dict[str, Any]] = [{"role": "system", "content": system}]
    convo.extend({"role": r, "content": t} for r, t in spec.get("history", []))
    convo.append({"role": "user", "content": spec["question"]})
    return convo


def add_openai_calls(
    b: Builder, spec: TraceSpec, root: str, convo: list[dict[str, Any]], p: Passages
) -> None:
    """Tool calls only as OpenAI-style messages inside GENERATION inputs (no TOOL observations)."""
    calls, tool_msgs = [], []
    for k, call in enumerate(spec.get("calls", [])):
        cid = f"call_{spec['id'][-6:]}_{k}"
        arguments = json.dumps({"query": call["query"]})
        calls.append(
            {"id": cid, "type": "function", "function": {"name": call["tool"], "arguments": arguments}}
        )
        tool_msgs.append({"role": "tool", "tool_call_id": cid, "content": p.markdown(call.get("ids", []))})
    plan = {"role": "assistant", "content": None, "tool_calls": calls}
    b.add("GENERATION", "plan", root, convo, plan, 1.4)
    final = {"role": "assistant", "content": spec["answer"]}
    b.add("GENERATION", "answer", root, [*convo, plan, *tool_msgs], final, 3.8)


def add_tool_calls(b: Builder, spec: TraceSpec, root: str, convo: list[dict[str, Any]], p: Passages) -> None:
    """One TOOL (or SPAN) observation per search call, then the answering GENERATION."""
    for call in spec.get("calls", []):
        args = call["query"] if call.get("bare") else {"query": call["query"], "top_k": 5}
        metadata = {"mcp_server": "kubeflow-docs"} if call.get("kind") == "mcp" else None
        b.add(call.get("type", "TOOL"), call["tool"], root, args, p.tool_output(call), 0.6, metadata)
    b.add("GENERATION", "answer", root, convo, {"role": "assistant", "content": spec["answer"]}, 3.1)


def build_trace(
    spec: TraceSpec, start: datetime, system: str, p: Passages, release: ReleaseSpec
) -> dict[str, Any]:
    """One line of traces.jsonl (without its votes)."""
    b = Builder(spec["id"], start, spec.get("session"), spec["user"], release)
    root_in = wrap_text(
        spec.get("input_shape", "plain"), spec["question"], "user", system, spec.get("history", [])
    )
    root = b.add(spec.get("root_type", "SPAN"), "docs-agent", None, root_in, None, 0.05)
    b.t += timedelta(milliseconds=200)
    convo = conversation(spec, system)
    if spec.get("openai"):
        add_openai_calls(b, spec, root, convo, p)
    else:
        add_tool_calls(b, spec, root, convo, p)
    # the root's output is written when the agent finishes
    out_shape = spec.get("output_shape", "plain")
    root_out = None if out_shape == "none" else wrap_text(out_shape, spec["answer"], "assistant", system)
    root_ob = b.obs[0]
    root_ob["output"] = None if root_out is None else enc(root_out)
    root_ob["endTime"] = ts(b.t + timedelta(milliseconds=50))
    return {"traceId": spec["id"], "observations": b.obs, "scores": []}


def vote(spec: TraceSpec, when: datetime) -> dict[str, Any]:
    """The thumbs-down: on the trace, or (with session_turn) on the session's turn."""
    s: dict[str, Any] = {
        "id": f"fb-{spec['id']}",
        "name": "user_feedback",
        "dataType": "BOOLEAN",
        "value": 0,
        "comment": spec["comment"],
        "timestamp": ts(when),
        "userId": spec["user"],
        "source": "API",
        "environment": "default",
    }
    if "session_turn" in spec:
        s["sessionId"] = spec["session"]
        s["metadata"] = {"turn": spec["session_turn"]}
    else:
        s["traceId"] = spec["id"]
    return s


def expectation(spec: TraceSpec) -> dict[str, Any]:
    """One line of expected.jsonl."""
    return {
        "trace_id": spec["id"],
        "layer": spec["layer"],
        "component": spec["component"],
        "shape": spec["shape"],
    }


# ---------------------------------------------------------------- the whole demo


def build(specs: Specs, passages: Passages) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The lines of traces.jsonl and of expected.jsonl, in file order."""
    lines: list[dict[str, Any]] = []
    expected: list[dict[str, Any]] = []
    # session votes wait until every line exists: they may sit on the line of a later trace
    session_votes: dict[str, list[tuple[TraceSpec, dict[str, Any]]]] = {}
    releases = {r["name"]: r for r in specs["release"]}
    first = specs["release"][0]["name"]
    starts: dict[str, list[datetime]] = {name: [] for name in releases}
    for i, spec in enumerate(specs["trace"]):
        start = specs["start"] + i * TRACE_SPACING + timedelta(minutes=spec.get("offset_min", 0))
        release = releases[spec.get("release", first)]
        starts[release["name"]].append(start)
        line = build_trace(spec, start, specs["system_prompt"], passages, release)
        if "comment" in spec:
            v = vote(spec, start + VOTE_DELAY)
            if "session_turn" in spec:
                session_votes.setdefault(spec["session"], []).append((spec, v))
            else:
                line["scores"].append(v)
            expected.append(expectation(spec))
        lines.append(line)
    # grouped by session, sessions in order of first appearance (an "own-line" vote's place in the file)
    for votes in session_votes.values():
        for spec, v in votes:
            place_session_vote(lines, spec["vote_line"], v)
    lines.extend(unrated_traces(specs, starts))
    return lines, expected


def unrated_traces(specs: Specs, starts: Mapping[str, Sequence[datetime]]) -> list[dict[str, Any]]:
    """Each release's answers nobody voted on, spread evenly over the span of its rated traces,
    cycling through the `[[answer]]` pairs: they count as answers, never as votes."""
    lines: list[dict[str, Any]] = []
    n = 0
    for release in specs["release"]:
        first, last = min(starts[release["name"]]), max(starts[release["name"]])
        count = release["unrated"]
        for k in range(count):
            pair = specs["answer"][n % len(specs["answer"])]
            at = first + (last - first) * (2 * k + 1) / (2 * count) + UNRATED_OFFSET
            at = at.replace(microsecond=0)
            b = Builder(f"demo-answer-{n + 1:02d}", at, None, f"u-reader-{n % 7 + 1}", release)
            root = b.add("SPAN", "docs-agent", None, pair["question"], None, 0.05)
            b.t += timedelta(milliseconds=200)
            convo = [
                {"role": "system", "content": specs["system_prompt"]},
                {"role": "user", "content": pair["question"]},
            ]
            b.add("GENERATION", "answer", root, convo, {"role": "assistant", "content": pair["answer"]}, 2.4)
            b.obs[0]["output"] = enc(pair["answer"])
            b.obs[0]["endTime"] = ts(b.t + timedelta(milliseconds=50))
            lines.append({"traceId": b.id, "observations": b.obs, "scores": []})
            n += 1
    return lines


def place_session_vote(lines: list[dict[str, Any]], where: str, v: dict[str, Any]) -> None:
    """A session vote sits on its own line (traceId null) or on the line of another trace of the session."""
    if where == "own-line":
        lines.append({"traceId": None, "observations": [], "scores": [v]})
        return
    line = next((ln for ln in lines if ln["traceId"] == where), None)
    if line is None:
        raise ValueError(f"vote_line {where!r} is not a trace id")
    line["scores"].append(v)


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    # newline="\n": the same bytes on every platform, so the byte-for-byte test holds everywhere
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--out", type=Path, default=DEMO_DIR, help="directory to write into (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    lines, expected = build(load_specs(SPECS_FILE), Passages(load_chunks(DEMO_DIR / "index")))
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "traces.jsonl", lines)
    write_jsonl(args.out / "expected.jsonl", expected)
    print(len(lines), "lines,", len(expected), "rated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
