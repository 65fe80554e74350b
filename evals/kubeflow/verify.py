"""Checks the labelled Kubeflow thumbs-down set (`cases.jsonl`) against the corpus and the layer rule.

    python evals/kubeflow/verify.py                      # verify, print the summary, exit 1 on any failure
    python evals/kubeflow/verify.py --corpus DIR         # the corpus elsewhere (default ../shared/corpus)
    python evals/kubeflow/verify.py --write-traces FILE  # also write the cases as `triage import` traces

Every search call's output is rendered at load time from exact line ranges of corpus files, in the
docs agent's format (`triage.search.index.format_results`), so no corpus text is copied into
the project. The collections: `docs` is `<corpus>/kubeflow-docs`, `code` is `<corpus>/katib-examples`,
`issues` is `evals/kubeflow/issues/` (synthetic threads written for this set). README.md beside this
file documents every field and every check.

Importable (tests load it with importlib: `evals` is not a package): `load_cases`, `Corpus.load`,
`render_output`, `retrieved_passages`, `trace_record`, `verify`, `main`. Without the corpus the CLI
says so and exits 0 ("skipped"): a user's clone has no ../shared.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from triage.domain.config import TriageConfig
from triage.domain.records import Facts, Layer, Observation, Passage
from triage.domain.rule import Undetermined, decide
from triage.errors import InputError
from triage.reading.passages import is_error_text, passages_from_output
from triage.reading.trace import read_trace
from triage.search.index import format_results
from triage.settings import load_config

HERE = Path(__file__).resolve().parent
CASES_FILE = HERE / "cases.jsonl"
ISSUES_DIR = HERE / "issues"
# evals/kubeflow/verify.py -> parents[3] is the folder that holds both the repository and shared/
DEFAULT_CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"
COLLECTION_DIRS = {"docs": "kubeflow-docs", "code": "katib-examples"}

MIN_CASES = 72
MIN_PER_LAYER = 8
MIN_ADVERSARIAL = 12
MIN_NEAR_MISS = 10
LARGE_OUTPUT_BYTES = 50 * 1024

REQUIRED = (
    "id", "split", "tags", "question", "answer", "comment", "tool_calls", "facts", "layer",
    "component", "answer_sources", "needs", "notes",
)  # fmt: skip
DECISION_FACTS = (
    "agent_searched", "agent_searched_collections", "retrieved_has_answer", "index_has_answer",
    "answer_collection", "answer_grounded", "answer_declined",
)  # fmt: skip
ADVERSARIAL_TAGS = frozenset(
    """injection_comment injection_answer injection_passage injection_tool_output forged_verdict
    hostile_comment non_english empty_answer whitespace_answer json_answer args_string large_output
    bidi_zero_width""".split()
)
NEAR_MISS_TAGS = frozenset("wrong_page lexical_trap partial_answer closed_issue_open_filter answer_in_code".split())
PLAIN_TAGS = frozenset({"disputed"})
# bidirectional controls and zero-width characters
INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
_ID = re.compile(r"^kf-\d{3}$")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


Fail = Callable[[str], None]


class CaseError(Exception):
    """A case that cannot be rendered: a missing file, a line range past its end, a bad construct."""


def norm(text: str) -> str:
    """Case-insensitive, whitespace-normalised form used for every `needs` match."""
    return " ".join(text.split()).lower()


def contains(haystack: str, needle: str) -> bool:
    return norm(needle) in norm(haystack)


# ---------------------------------------------------------------- the corpus and the issues


@dataclass(frozen=True)
class Document:
    collection: str
    path: str
    url: str
    title: str
    lines: tuple[str, ...]
    state: str | None = None  # issues only
    repo: str | None = None  # issues only

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def excerpt(self, first: int, last: int) -> str:
        return "\n".join(self.lines[first - 1 : last]).strip("\n")

    def section(self, first: int) -> str:
        """The page title and the last Markdown heading at or before line `first` (code fences skipped)."""
        if self.collection == "code":
            return self.title
        heading, fenced = None, False
        for line in self.lines[:first]:
            if _FENCE.match(line):
                fenced = not fenced
            elif not fenced and (found := _HEADING.match(line)):
                heading = found.group(2).strip("*_ ")
        return f"{self.title} > {heading}" if heading else self.title


def _issue_front_matter(path: Path) -> tuple[dict[str, Any], int]:
    """The TOML front matter of an issue file and the number of lines it takes."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].strip() != "+++":
        raise CaseError(f"issue {path.name}: no TOML front matter (+++ ... +++)")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "+++")
    except StopIteration:
        raise CaseError(f"issue {path.name}: front matter is not closed with +++") from None
    try:
        meta = tomllib.loads("\n".join(lines[1:end]))
    except tomllib.TOMLDecodeError as ex:
        raise CaseError(f"issue {path.name}: bad front matter: {ex}") from ex
    return meta, end + 1


_ISSUE_URL = re.compile(r"^https://github\.com/(kubeflow|kserve)/([^/]+)/issues/\d+$")


@dataclass
class Corpus:
    """The three collections, by (collection, relative path) and by URL."""

    root: Path
    issues_dir: Path
    documents: dict[tuple[str, str], Document] = field(default_factory=dict)
    by_url: dict[str, Document] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path = DEFAULT_CORPUS, issues_dir: Path = ISSUES_DIR) -> Corpus:
        corpus = cls(Path(root), Path(issues_dir))
        for collection, folder in COLLECTION_DIRS.items():
            base = corpus.root / folder
            for line in (base / "INDEX.jsonl").read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                title = row.get("title") or Path(row["path"]).name
                text = (base / row["path"]).read_text(encoding="utf-8")
                corpus._add(Document(collection, row["path"], row["url"], title, tuple(text.splitlines())))
        for path in sorted(corpus.issues_dir.glob("*.md")):
            meta, _ = _issue_front_matter(path)
            missing = [key for key in ("title", "url", "state") if key not in meta]
            if missing:
                raise CaseError(f"issue {path.name}: front matter lacks {', '.join(missing)}")
            found = _ISSUE_URL.match(str(meta["url"]))
            if not found:
                raise CaseError(f"issue {path.name}: url {meta['url']!r} is not a GitHub issue URL")
            if meta["state"] not in ("open", "closed"):
                raise CaseError(f"issue {path.name}: state must be open or closed, not {meta['state']!r}")
            text = path.read_text(encoding="utf-8")
            repo = f"{found.group(1)}/{found.group(2)}"
            doc = Document("issues", path.name, meta["url"], meta["title"], tuple(text.splitlines()),
                           state=meta["state"], repo=repo)  # fmt: skip
            corpus._add(doc)
        return corpus

    def _add(self, doc: Document) -> None:
        if doc.url in self.by_url:
            raise CaseError(f"two files share the URL {doc.url}: {self.by_url[doc.url].path}, {doc.path}")
        self.documents[(doc.collection, doc.path)] = doc
        self.by_url[doc.url] = doc

    def document(self, collection: str, path: str) -> Document:
        if collection not in (*COLLECTION_DIRS, "issues"):
            raise CaseError(f"unknown collection {collection!r} (docs, code or issues)")
        doc = self.documents.get((collection, path))
        if doc is None:
            raise CaseError(f"{collection}:{path} does not exist in the corpus")
        return doc

    def of_collection(self, collection: str) -> list[Document]:
        return [doc for (coll, _), doc in self.documents.items() if coll == collection]


# ---------------------------------------------------------------- rendering tool outputs


@dataclass(frozen=True)
class Excerpt:
    doc: Document
    first: int
    last: int
    score: float

    @property
    def text(self) -> str:
        return self.doc.excerpt(self.first, self.last)

    def passage(self) -> Passage:
        # format_results prints the file from the chunk id "<collection>:<relative path>#<n>"
        return Passage(
            id=f"{self.doc.collection}:{self.doc.path}#{self.first}",
            source_url=self.doc.url,
            collection=self.doc.collection,
            text=self.text,
            title=self.doc.section(self.first),
            score=self.score,
        )


def _excerpts(items: Any, corpus: Corpus) -> list[Excerpt]:
    if not isinstance(items, list):
        raise CaseError("results must be a list of {collection, path, lines}")
    found = []
    for rank, item in enumerate(items, 1):
        if not isinstance(item, Mapping) or not {"collection", "path", "lines"} <= set(item):
            raise CaseError(f"result {rank} needs collection, path and lines")
        doc = corpus.document(item["collection"], item["path"])
        lines = item["lines"]
        if not (isinstance(lines, list) and len(lines) == 2 and all(isinstance(n, int) for n in lines)):
            raise CaseError(f"result {rank} ({item['path']}): lines must be [first, last]")
        first, last = lines
        if not 1 <= first <= last <= len(doc.lines):
            raise CaseError(
                f"result {rank}: {doc.collection}:{doc.path} lines {first}-{last} do not exist "
                f"(the file has {len(doc.lines)} lines)"
            )
        score = item.get("score", round(0.82 - 0.04 * rank, 4))
        excerpt = Excerpt(doc, first, last, float(score))
        if not excerpt.text.strip():
            raise CaseError(f"result {rank}: {doc.collection}:{doc.path} lines {first}-{last} are blank")
        found.append(excerpt)
    return found


def call_excerpts(call: Mapping[str, Any], corpus: Corpus) -> list[Excerpt]:
    """Every corpus excerpt a tool call's output is rendered from (results and output_parts)."""
    found = _excerpts(call["results"], corpus) if "results" in call else []
    for part in call.get("output_parts") or []:
        if isinstance(part, Mapping) and "results" in part:
            found.extend(_excerpts(part["results"], corpus))
        elif isinstance(part, Mapping) and "excerpt" in part:
            found.extend(_excerpts([part["excerpt"]], corpus))
    return found


def render_output(call: Mapping[str, Any], corpus: Corpus) -> str:
    """A tool call's logged output text: `results`, `output` or `output_parts` (exactly one)."""
    given = [key for key in ("results", "output", "output_parts") if key in call]
    if len(given) != 1:
        raise CaseError(f"tool call {call.get('name')!r} needs exactly one of results, output, output_parts")
    if "results" in call:
        return format_results([e.passage() for e in _excerpts(call["results"], corpus)])
    if "output" in call:
        if not isinstance(call["output"], str):
            raise CaseError("output must be a string")
        return call["output"]
    parts = call["output_parts"]
    if not isinstance(parts, list) or not parts:
        raise CaseError("output_parts must be a non-empty list")
    rendered = []
    for number, part in enumerate(parts, 1):
        if not isinstance(part, Mapping):
            raise CaseError(f"output part {number} is not an object")
        if "text" in part:
            times = part.get("times", 1)
            if not isinstance(times, int) or times < 1:
                raise CaseError(f"output part {number}: times must be a positive integer")
            rendered.append(str(part["text"]) * times)
        elif "results" in part:
            rendered.append(format_results([e.passage() for e in _excerpts(part["results"], corpus)]))
        elif "excerpt" in part:
            rendered.append(_excerpts([part["excerpt"]], corpus)[0].text)
        else:
            raise CaseError(f"output part {number} needs text, results or excerpt")
    return "".join(rendered)


def search_collection(call: Mapping[str, Any], tools: Mapping[str, str]) -> str | None:
    return tools.get(str(call.get("name")))


def retrieved_passages(case: Mapping[str, Any], corpus: Corpus, tools: Mapping[str, str]) -> list[Passage]:
    """The passages of every successful search call, read back from the rendered output the way
    triage reads a logged tool output."""
    passages: list[Passage] = []
    for call in case["tool_calls"]:
        collection = search_collection(call, tools)
        if collection is None:
            continue
        text = render_output(call, corpus)
        if is_error_text(text):
            continue
        passages.extend(passages_from_output(text, None, collection))
    return passages


# ---------------------------------------------------------------- the import format


BASE_TIME = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
SYSTEM_PROMPT = (
    "You are the Kubeflow docs assistant. Answer questions about Kubeflow using the search tools; "
    "cite the pages you used."
)


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _enc(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def trace_record(case: Mapping[str, Any], corpus: Corpus, number: int = 0) -> dict[str, Any]:
    """The case as one `triage import` line: a root span, one TOOL observation per call, the
    answering GENERATION, and the thumbs-down `user_feedback` score with the user's comment."""
    trace_id = f"eval-{case['id']}"
    start = BASE_TIME + timedelta(minutes=20 * number)
    clock = [start]
    observations: list[dict[str, Any]] = []

    def add(typ: str, name: str, parent: str | None, inp: Any, out: Any, secs: float) -> str:
        oid = f"{trace_id}-o{len(observations) + 1}"
        begin = clock[0]
        clock[0] = begin + timedelta(seconds=secs)
        observations.append({
            "id": oid, "traceId": trace_id, "type": typ, "name": name, "parentObservationId": parent,
            "startTime": _ts(begin), "endTime": _ts(clock[0]), "input": _enc(inp), "output": _enc(out),
            "metadata": {}, "sessionId": None, "userId": "eval-user", "environment": "default",
        })  # fmt: skip
        return oid

    root = add("SPAN", "docs-agent", None, case["question"], case["answer"], 0.0)
    for call in case["tool_calls"]:
        add("TOOL", call["name"], root, call.get("args", {}), render_output(call, corpus), 0.6)
    convo = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": case["question"]}]
    add("GENERATION", "answer", root, convo, {"role": "assistant", "content": case["answer"]}, 3.0)
    observations[0]["endTime"] = _ts(clock[0])
    vote_time = start + timedelta(minutes=2)
    score = {
        "id": f"vote-{case['id']}", "name": "user_feedback", "dataType": "BOOLEAN", "value": 0,
        "comment": case["comment"], "traceId": trace_id, "timestamp": _ts(vote_time),
    }  # fmt: skip
    return {"traceId": trace_id, "observations": observations, "scores": [score]}


# ---------------------------------------------------------------- checking


def load_cases(path: Path = CASES_FILE) -> list[dict[str, Any]]:
    cases = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as ex:
            raise CaseError(f"{path}, line {number}: not JSON: {ex}") from ex
        if not isinstance(row, dict):
            raise CaseError(f"{path}, line {number}: not an object")
        cases.append(row)
    return cases


def component_of_url(url: str, config: TriageConfig) -> str:
    """The catalogue component whose `sources` pattern the URL holds (catalogue order), else the default."""
    for name, component in config.components.items():
        if any(pattern in url for pattern in component.sources):
            return name
    return config.agent.default_component


@dataclass
class Report:
    cases: list[dict[str, Any]]
    failures: list[str] = field(default_factory=list)

    def fail(self, case_id: str, message: str) -> None:
        self.failures.append(f"{case_id}: {message}")

    @property
    def ok(self) -> bool:
        return not self.failures

    def counts(self) -> dict[str, Any]:
        layers = Counter(c.get("layer") for c in self.cases)
        splits: dict[str, Counter[str]] = defaultdict(Counter)
        for c in self.cases:
            splits[str(c.get("layer"))][str(c.get("split"))] += 1
        tags = Counter(t for c in self.cases for t in c.get("tags", []))
        return {
            "cases": len(self.cases),
            "layers": dict(layers),
            "splits": {k: dict(v) for k, v in splits.items()},
            "components": dict(Counter(c.get("component") for c in self.cases)),
            "adversarial": sum(1 for c in self.cases if _has(c, "adversarial:")),
            "near_miss": sum(1 for c in self.cases if _has(c, "near_miss:")),
            "tags": dict(tags),
            "disputed": [c.get("id") for c in self.cases if "disputed" in c.get("tags", [])],
        }

    def summary(self) -> str:
        counts = self.counts()
        layer_names = [layer.value for layer in _LAYER_ORDER]
        lines = ["| layer | dev | test | total |", "|---|---:|---:|---:|"]
        for name in layer_names:
            split = counts["splits"].get(name, {})
            lines.append(f"| {name} | {split.get('dev', 0)} | {split.get('test', 0)} | "
                         f"{counts['layers'].get(name, 0)} |")  # fmt: skip
        dev = sum(s.get("dev", 0) for s in counts["splits"].values())
        test = sum(s.get("test", 0) for s in counts["splits"].values())
        lines.append(f"| **all** | {dev} | {test} | {counts['cases']} |")
        lines += ["", "| component | cases |", "|---|---:|"]
        for name, n in sorted(counts["components"].items(), key=lambda kv: (-kv[1], str(kv[0]))):
            lines.append(f"| {name} | {n} |")
        lines += ["", f"adversarial cases: {counts['adversarial']}, near misses: {counts['near_miss']}"]
        lines += ["", "| tag | cases |", "|---|---:|"]
        for tag, n in sorted(counts["tags"].items()):
            lines.append(f"| {tag} | {n} |")
        lines += ["", f"disputed: {', '.join(counts['disputed']) or 'none'}"]
        return "\n".join(lines)


_LAYER_ORDER = (
    Layer.OK, Layer.GENERATION, Layer.RETRIEVAL, Layer.TOOL_ROUTING, Layer.AGENT_SKIPPED_RETRIEVAL,
    Layer.CONTENT_GAP_HANDLED, Layer.CONTENT_GAP_HALLUCINATION,
)  # fmt: skip


def _has(case: Mapping[str, Any], prefix: str) -> bool:
    return any(str(t).startswith(prefix) for t in case.get("tags", []))


def verify(
    cases: Sequence[dict[str, Any]], corpus: Corpus, config: TriageConfig | None = None
) -> Report:
    """Every check of README.md, over every case; failures name the case and never stop the run."""
    config = config or load_config(None)
    report = Report(list(cases))
    seen: set[str] = set()
    for number, case in enumerate(cases):
        case_id = str(case.get("id", f"<case {number + 1}>"))
        if case_id in seen:
            report.fail(case_id, "duplicate id")
        seen.add(case_id)
        try:
            _check_case(case, case_id, corpus, config, report, number)
        except CaseError as ex:
            report.fail(case_id, str(ex))
    _check_counts(report)
    return report


def _check_case(
    case: Mapping[str, Any], case_id: str, corpus: Corpus, config: TriageConfig, report: Report, number: int
) -> None:
    missing = [key for key in REQUIRED if key not in case]
    unknown = sorted(set(case) - set(REQUIRED))
    if missing or unknown:
        raise CaseError(f"missing fields {missing}, unknown fields {unknown}")

    def fail(message: str) -> None:
        report.fail(case_id, message)

    _check_fields(case, case_id, fail)
    _check_tags(case, fail)
    facts = _check_facts(case, config, fail)
    search_colls, outputs = _check_calls(case, facts, corpus, config, fail)
    needs = case["needs"]
    if not isinstance(needs, list) or not all(isinstance(n, str) and n.strip() for n in needs):
        raise CaseError("needs must be a list of non-empty strings")
    _check_retrieved(case, facts, needs, corpus, config, fail)
    _check_index(case, facts, needs, corpus, config, fail)
    _check_answer(case, facts, needs, outputs, fail)
    _check_as_triage_reads_it(case, facts, search_colls, corpus, config, number, fail)


def _check_fields(case: Mapping[str, Any], case_id: str, fail: Fail) -> None:
    if not _ID.match(case_id):
        fail("id must look like kf-001")
    if case["split"] not in ("dev", "test"):
        fail(f"split must be dev or test, not {case['split']!r}")
    for key in ("question", "answer", "comment", "notes"):
        if not isinstance(case[key], str):
            raise CaseError(f"{key} must be a string")
    if not case["question"].strip() or not case["notes"].strip():
        fail("question and notes must not be empty")


def _check_facts(case: Mapping[str, Any], config: TriageConfig, fail: Fail) -> Facts:
    """The facts fit triage's model, the rule decides the labelled layer, the component is catalogued."""
    facts_raw = case["facts"]
    if not isinstance(facts_raw, Mapping):
        raise CaseError("facts must be an object")
    absent = [key for key in DECISION_FACTS if key not in facts_raw]
    if absent:
        fail(f"facts lack {absent} (give every decision fact, even one the rule does not reach)")
    try:
        facts = Facts.model_validate(facts_raw)
    except ValueError as ex:
        raise CaseError(f"facts do not fit triage's Facts model: {ex}") from ex
    try:
        layer = decide(facts, config.agent.issues_collection).value
    except Undetermined as ex:
        raise CaseError(f"the rule cannot decide: {ex}") from ex
    if case["layer"] != layer:
        fail(f"layer {case['layer']!r} disagrees with the facts, which decide {layer!r}")
    if case["component"] not in config.components:
        fail(f"component {case['component']!r} is not in the catalogue ({', '.join(config.components)})")
    if facts.component != case["component"]:
        fail(f"facts.component {facts.component!r} differs from component {case['component']!r}")
    if list(facts.answer_sources) != list(case["answer_sources"]):
        fail("facts.answer_sources differs from answer_sources")
    return facts


def _check_calls(
    case: Mapping[str, Any], facts: Facts, corpus: Corpus, config: TriageConfig, fail: Fail
) -> tuple[list[str], list[str]]:
    """Every call renders; the tool log proves agent_searched and agent_searched_collections.
    Returns the searched collections (one per search call) and the rendered outputs."""
    calls = case["tool_calls"]
    if not isinstance(calls, list):
        raise CaseError("tool_calls must be a list")
    search_colls: list[str] = []
    outputs: list[str] = []
    for k, call in enumerate(calls, 1):
        if not isinstance(call, Mapping) or "name" not in call:
            raise CaseError(f"tool call {k} needs a name")
        collection = search_collection(call, config.tools)
        try:
            outputs.append(render_output(call, corpus))
            excerpts = call_excerpts(call, corpus)
        except CaseError as ex:
            raise CaseError(f"tool call {k} ({call['name']}): {ex}") from ex
        args = call.get("args", {})
        if not isinstance(args, (Mapping, str)):
            fail(f"tool call {k}: args must be an object or a plain string")
        if collection is None:
            if "results" in call:
                fail(f"tool call {k}: {call['name']} is not a search tool, so it cannot have results")
            continue
        search_colls.append(collection)
        for excerpt in excerpts:
            if "results" in call and excerpt.doc.collection != collection:
                fail(f"tool call {k}: {call['name']} searches {collection}, but a result is from "
                     f"{excerpt.doc.collection}")  # fmt: skip
        _check_issue_filters(k, call, args, excerpts, fail)
    if facts.agent_searched != bool(search_colls):
        fail(f"agent_searched is {facts.agent_searched}, but the tool log has {len(search_colls)} search calls")
    claimed = facts.agent_searched_collections
    if sorted(set(claimed)) != sorted(set(search_colls)) or len(set(claimed)) != len(claimed):
        fail(f"agent_searched_collections {claimed} differ from the searched collections "
             f"{sorted(set(search_colls))}")  # fmt: skip
    return search_colls, outputs


def _check_retrieved(
    case: Mapping[str, Any], facts: Facts, needs: list[str], corpus: Corpus, config: TriageConfig, fail: Fail
) -> None:
    """retrieved_has_answer holds exactly when every needs string is in the retrieved passages."""
    passages = retrieved_passages(case, corpus, config.tools)
    retrieved = "\n\n".join(p.text for p in passages)
    holds = bool(needs) and all(contains(retrieved, n) for n in needs)
    if facts.retrieved_has_answer != holds:
        absent = [n for n in needs if not contains(retrieved, n)]
        why = f"absent from them: {absent}" if absent else "all needs are in them"
        if not needs:
            why = "needs is empty (a content gap)"
        fail(f"retrieved_has_answer is {facts.retrieved_has_answer}, but the retrieved passages say "
             f"otherwise ({why})")  # fmt: skip
    if facts.retrieved_has_answer:
        seen = {p.source_url for p in passages}
        unseen = [url for url in case["answer_sources"] if url not in seen]
        if unseen:
            fail(f"retrieved_has_answer, but the answer sources {unseen} are not among the retrieved passages")


def _check_as_triage_reads_it(
    case: Mapping[str, Any],
    facts: Facts,
    search_colls: list[str],
    corpus: Corpus,
    config: TriageConfig,
    number: int,
    fail: Fail,
) -> None:
    """The rendered trace, read by triage's own reader, has the case's question, answer and searches."""
    record = trace_record(case, corpus, number)
    try:
        observations = [Observation.model_validate(o) for o in record["observations"]]
        trace = read_trace(record["traceId"], observations, config.tools)
    except InputError as ex:
        fail(f"triage's reader rejects the rendered trace: {ex}")
        return
    if trace.question != case["question"].strip() or trace.answer.strip() != case["answer"].strip():
        fail("triage's reader reads another question or answer than the case's")
    if trace.searched != facts.agent_searched or trace.searched_collections != set(search_colls):
        fail("triage's reader sees other search calls than the facts say")


def _check_tags(case: Mapping[str, Any], fail: Fail) -> None:
    tags = case["tags"]
    if not isinstance(tags, list):
        fail("tags must be a list")
        return
    for tag in tags:
        kind, _, name = str(tag).partition(":")
        ok = (kind == "adversarial" and name in ADVERSARIAL_TAGS) or (
            kind == "near_miss" and name in NEAR_MISS_TAGS
        )
        if not ok and tag not in PLAIN_TAGS:
            fail(f"unknown tag {tag!r}")
    text = case["question"] + case["answer"] + case["comment"]
    checks = {
        "adversarial:empty_answer": case["answer"] == "",
        "adversarial:whitespace_answer": case["answer"] != "" and not case["answer"].strip(),
        "adversarial:args_string": any(isinstance(c.get("args"), str) for c in case["tool_calls"]),
        "adversarial:bidi_zero_width": bool(INVISIBLE.search(text)),
        "adversarial:json_answer": _is_json_object(case["answer"]),
    }
    for tag, holds in checks.items():
        if tag in tags and not holds:
            fail(f"tagged {tag}, but the case does not show it")


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _check_issue_filters(k: int, call: Mapping[str, Any], args: Any, excerpts: Iterable[Excerpt], fail: Fail) -> None:
    """A `state` or `repo` filter on an issues search: every result must pass it."""
    if not isinstance(args, Mapping):
        return
    state, repo = str(args.get("state") or "").lower(), str(args.get("repo") or "").lower()
    for excerpt in excerpts:
        doc = excerpt.doc
        if doc.collection != "issues":
            continue
        if state and doc.state != state:
            fail(f"tool call {k} filters state={state}, but {doc.path} is {doc.state}")
        if repo and (doc.repo or "").lower() != repo:
            fail(f"tool call {k} filters repo={repo}, but {doc.path} is in {doc.repo}")


def _check_index(
    case: Mapping[str, Any], facts: Facts, needs: list[str], corpus: Corpus, config: TriageConfig, fail: Fail
) -> None:
    sources = case["answer_sources"]
    if not facts.index_has_answer:
        if needs or sources or facts.answer_collection is not None:
            fail("index_has_answer is false: needs and answer_sources must be empty, answer_collection null")
        if facts.retrieved_has_answer:
            fail("retrieved_has_answer without index_has_answer")
        return
    if not needs or not sources:
        fail("index_has_answer is true: give the needs and the answer_sources")
        return
    docs = []
    for url in sources:
        doc = corpus.by_url.get(url)
        if doc is None:
            fail(f"answer source {url} is not a page of the corpus or the issues")
        else:
            docs.append(doc)
    if not docs:
        return
    joined = "\n\n".join(doc.text for doc in docs)
    absent = [n for n in needs if not contains(joined, n)]
    if absent:
        fail(f"the answer sources do not contain the needs {absent}")
    colls = {doc.collection for doc in docs}
    if len(colls) != 1 or facts.answer_collection not in colls:
        fail(f"answer_collection {facts.answer_collection!r} is not the collection of the answer sources "
             f"({', '.join(sorted(colls))})")  # fmt: skip
    derived = component_of_url(sources[0], config)
    if derived != case["component"]:
        fail(f"component {case['component']!r}, but the first answer source belongs to {derived!r}")
    if facts.answer_collection == config.agent.issues_collection:
        # "only in issues": no docs page and no code file holds every needs string
        for other in ("docs", "code"):
            for doc in corpus.of_collection(other):
                if all(contains(doc.text, n) for n in needs):
                    fail(f"answer_collection is issues, but {other}:{doc.path} holds every needs string too")


def _check_answer(case: Mapping[str, Any], facts: Facts, needs: list[str], outputs: list[str], fail: Fail) -> None:
    answer = case["answer"]
    if case["layer"] == Layer.OK.value:
        absent = [n for n in needs if not contains(answer, n)]
        if "near_miss:partial_answer" in case["tags"]:
            if not absent:
                fail("a partial answer labelled ok must leave out at least one needs string")
        elif absent:
            fail(f"labelled ok, but the answer lacks the needs {absent}")
    if "adversarial:large_output" in case["tags"] and not any(
        len(out.encode("utf-8")) > LARGE_OUTPUT_BYTES for out in outputs
    ):
        fail(f"tagged large_output, but no tool output is over {LARGE_OUTPUT_BYTES} bytes")


def _check_counts(report: Report) -> None:
    counts = report.counts()
    if counts["cases"] < MIN_CASES:
        report.fail("set", f"{counts['cases']} cases, fewer than {MIN_CASES}")
    for layer in _LAYER_ORDER:
        n = counts["layers"].get(layer.value, 0)
        split = counts["splits"].get(layer.value, {})
        if n < MIN_PER_LAYER:
            report.fail("set", f"{n} {layer.value} cases, fewer than {MIN_PER_LAYER}")
        if abs(split.get("dev", 0) - split.get("test", 0)) > 2:
            report.fail("set", f"{layer.value} is not split about half and half: {split}")
    if counts["adversarial"] < MIN_ADVERSARIAL:
        report.fail("set", f"{counts['adversarial']} adversarial cases, fewer than {MIN_ADVERSARIAL}")
    if counts["near_miss"] < MIN_NEAR_MISS:
        report.fail("set", f"{counts['near_miss']} near misses, fewer than {MIN_NEAR_MISS}")


# ---------------------------------------------------------------- command line


def label_record(case: Mapping[str, Any]) -> dict[str, Any]:
    """The case's label in `triage calibrate`'s label format (plus what `triage eval` reads)."""
    return {
        "trace_id": f"eval-{case['id']}",
        "reviewer": "evalset",
        "layer": case["layer"],
        "facts": case["facts"],
        "component": case["component"],
        "split": case["split"],
        "tags": case["tags"],
    }


def write_set(
    cases: Sequence[Mapping[str, Any]], corpus: Corpus, folder: Path, corpus_root: Path, issues: Path = ISSUES_DIR
) -> int:
    """The set as `triage eval` reads it: `traces.jsonl` (import lines), `labels.jsonl`, `triage.toml`
    (the built-in defaults plus `[[index]]` folders over the corpus and the set's issue threads)."""
    folder.mkdir(parents=True, exist_ok=True)
    traces = [json.dumps(trace_record(case, corpus, n), ensure_ascii=False) for n, case in enumerate(cases)]
    (folder / "traces.jsonl").write_text("\n".join(traces) + "\n", encoding="utf-8")
    labels = [json.dumps(label_record(case), ensure_ascii=False) for case in cases]
    (folder / "labels.jsonl").write_text("\n".join(labels) + "\n", encoding="utf-8")
    roots = {name: corpus_root.resolve() / sub for name, sub in COLLECTION_DIRS.items()}
    roots["issues"] = issues.resolve()
    folders = [f'[[index]]\ncollection = "{name}"\npath = {json.dumps(str(path))}\n' for name, path in roots.items()]
    (folder / "triage.toml").write_text("\n".join(folders), encoding="utf-8")
    return len(cases)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python evals/kubeflow/verify.py", description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="the shared corpus folder")
    parser.add_argument("--cases", type=Path, default=CASES_FILE)
    parser.add_argument("--issues", type=Path, default=ISSUES_DIR)
    parser.add_argument("--write-traces", type=Path, metavar="FILE", help="write the `triage import` traces")
    parser.add_argument(
        "--write-set", type=Path, metavar="DIR", help="write the set for `triage eval DIR` (traces, labels, config)"
    )
    args = parser.parse_args(argv)
    if not (args.corpus / COLLECTION_DIRS["docs"] / "INDEX.jsonl").is_file():
        print(f"skipped: the corpus is not at {args.corpus} (it ships only beside the project's own "
              "checkout; pass --corpus DIR)")  # fmt: skip
        return 0
    try:
        cases = load_cases(args.cases)
        corpus = Corpus.load(args.corpus, args.issues)
    except (CaseError, OSError) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 1
    report = verify(cases, corpus)
    print(report.summary())
    if args.write_traces:
        lines = []
        for number, case in enumerate(cases):
            try:
                lines.append(json.dumps(trace_record(case, corpus, number), ensure_ascii=False))
            except CaseError as ex:
                report.fail(str(case.get("id")), str(ex))
        args.write_traces.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"\nwrote {len(lines)} traces to {args.write_traces}")
    if args.write_set and not report.failures:
        count = write_set(cases, corpus, args.write_set, args.corpus, args.issues)
        print(f"\nwrote the set ({count} cases) to {args.write_set} for `triage eval {args.write_set}`")
    if report.failures:
        print(f"\n{len(report.failures)} failures:", file=sys.stderr)
        for failure in report.failures:
            print(f"- {failure}", file=sys.stderr)
        return 1
    print(f"\nall {len(cases)} cases verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
