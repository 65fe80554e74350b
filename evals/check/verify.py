"""Checks the `triage check` evaluation set (`pairs.jsonl`): shape, corpus references, balance.

    python evals/check/verify.py                 # verify, print counts, exit 1 on any broken line
    python evals/check/verify.py --corpus DIR    # the corpus elsewhere (default ../shared/corpus)
    python evals/check/verify.py --file F.jsonl  # another file of pairs

Every pair is a regression case (as `triage promote` writes it), a new run of the agent on that
case, and a human label: does the new run pass the case's expectations? README.md beside this file
documents the format and the labelling rules. This script checks only the set itself; it does not
judge anything and knows nothing about how a judge decides.

Without the corpus the shape checks still run; the corpus checks are skipped with a message and the
exit code is 0 when the shape is sound. Importable: `load_pairs`, `check_pair`, `check_corpus`,
`counts`, `main`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PAIRS_FILE = HERE / "pairs.jsonl"
# evals/check/verify.py -> parents[3] is the folder that holds both the repository and shared/
DEFAULT_CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"
ISSUES_DIR = HERE.parent / "kubeflow" / "issues"
# collection -> folder under the corpus ("examples" is accepted as another name of "code")
COLLECTION_DIRS = {"docs": "kubeflow-docs", "code": "katib-examples", "examples": "katib-examples"}
COLLECTIONS = frozenset({*COLLECTION_DIRS, "issues"})
# the search tools of triage/defaults.toml [tools]
SEARCH_TOOLS = {
    "search_kubeflow_docs": "docs",
    "search_github_issues": "issues",
    "search_kubeflow_code": "code",
}

KINDS_V1 = ("correction", "must_cite", "must_not_claim", "decline", "tool_behavior", "mixed")
# batch 2: the crux is that the new run still answers (no wrong decline), or that its answer rests on
# the must_cite page (no value the page contradicts)
KINDS_V2 = ("answers", "rests_on")
KINDS = KINDS_V1 + KINDS_V2
# batch 2 (chk-081 on): the classes a pair was written to cover (the optional "tags" field)
TAGS = (
    "wrong_decline",
    "contradicts_page",
    "verbose",
    "non_english",
    "injection",
    "long",
    "slash_and_number_words",
    "scheme_less_link",
    "backticks",
)
BATCH2_FIRST = 81
MIN_PER_TAG = 6
LONG_ANSWER_CHARS = 9_000
GAP_LAYERS = ("content_gap_hallucination", "content_gap_handled")
SPLITS = ("dev", "test")
LABELS = ("pass", "fail")
LAYERS = frozenset(
    """generation retrieval tool_routing agent_skipped_retrieval content_gap_hallucination
    content_gap_handled ok""".split()
)
MIN_PAIRS = 72
MIN_PER_KIND = 10  # the batch-1 kinds
MIN_PER_KIND_V2 = 6  # the batch-2 kinds

TOP_KEYS = {"id", "split", "kind", "case", "new_run", "label", "why"}
TOP_OPTIONAL = {"tags"}
CASE_KEYS = {"input", "expected_output", "metadata"}
INPUT_KEYS = {"question", "retrieved_sources", "tool_calls"}
INPUT_CALL_KEYS = {"tool", "collection", "args", "error"}
EXPECTED_REQUIRED = {"answer", "tool_behavior", "expectation"}
EXPECTED_OPTIONAL = {"must_cite", "must_not_claim", "decline"}
METADATA_REQUIRED = {"layer", "component", "signature"}
METADATA_OPTIONAL = {"original_answer"}
RUN_KEYS = {"answer", "sources", "retrieved", "tool_calls"}
RETRIEVED_KEYS = {"collection", "path", "lines", "source_url"}
RUN_CALL_KEYS = {"name", "collection", "args"}

# the expectation sentences `triage promote` writes (triage/worklist/promote.py and cases.py)
REVIEW_EXPECTATIONS = {"The reviewer's corrected answer.", "The reviewer's expected tool behaviour."}
# an approving review (promote: a reviewer found the agent's answer right, no one disagrees)
_APPROVING = re.compile(r"^A reviewer found this answer right \((positive|false_alarm)\): it stays right\.$")
_ID = re.compile(r"^chk-\d{3}$")
_URL = re.compile(r"^https?://\S+$")
# an answer line this long that appears verbatim in a referenced corpus file is copied text
COPY_LINE_CHARS = 120


def _layer_expectations() -> dict[str, str]:
    """The layer -> sentence map of triage.regression, when the project is importable."""
    try:
        from triage.regression import EXPECTATIONS
    except Exception:  # the project is not installed: the check is skipped
        return {}
    return {str(layer.value): sentence for layer, sentence in EXPECTATIONS.items()}


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)
    skipped: str | None = None

    def fail(self, where: str, message: str) -> None:
        self.failures.append(f"{where}: {message}")


def load_pairs(path: Path = PAIRS_FILE) -> tuple[list[dict[str, Any]], list[str]]:
    """The pairs, and a failure message per line that is not a JSON object."""
    pairs, broken = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            broken.append(f"line {number}: blank line")
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as ex:
            broken.append(f"line {number}: not JSON ({ex})")
            continue
        if not isinstance(value, dict):
            broken.append(f"line {number}: not a JSON object")
            continue
        value.setdefault("_line", number)
        pairs.append(value)
    return pairs, broken


def _str(value: Any, empty_ok: bool = False) -> bool:
    return isinstance(value, str) and (empty_ok or bool(value.strip()))


def _str_list(value: Any, nonempty: bool = False) -> bool:
    return isinstance(value, list) and all(_str(v) for v in value) and (bool(value) or not nonempty)


def _keys(obj: Any, required: set[str], optional: set[str], where: str, what: str, report: Report) -> bool:
    if not isinstance(obj, Mapping):
        report.fail(where, f"{what} is not an object")
        return False
    missing = required - set(obj)
    extra = set(obj) - required - optional
    if missing:
        report.fail(where, f"{what} lacks {', '.join(sorted(missing))}")
    if extra:
        report.fail(where, f"{what} has unknown keys {', '.join(sorted(extra))}")
    return not missing


def _expectations(expected: Mapping[str, Any], layer: Any = None) -> list[str]:
    """Which checkable expectations a case carries. Every case outside the content-gap layers also
    carries "answers" (the run must not decline), and a case with must_cite carries "rests_on"."""
    found = []
    if expected.get("answer") is not None:
        found.append("correction")
    if expected.get("tool_behavior") is not None:
        found.append("tool_behavior")
    for key in ("must_cite", "must_not_claim", "decline"):
        if key in expected:
            found.append(key)
    if "decline" not in expected and layer not in GAP_LAYERS:
        found.append("answers")
    if "must_cite" in expected:
        found.append("rests_on")
    return found


def check_pair(pair: Mapping[str, Any], report: Report, layer_sentences: Mapping[str, str]) -> None:
    """Every shape rule of one pair (no corpus needed)."""
    where = f"{pair.get('id', '?')} (line {pair.get('_line', '?')})"
    pair = {k: v for k, v in pair.items() if k != "_line"}
    if not _keys(pair, TOP_KEYS, TOP_OPTIONAL, where, "the pair", report):
        return
    if "tags" in pair:
        tags = pair["tags"]
        if not (_str_list(tags, True) and len(set(tags)) == len(tags)):
            report.fail(where, "tags must be a non-empty list of distinct names")
        else:
            unknown = sorted(set(tags) - set(TAGS))
            if unknown:
                report.fail(where, f"unknown tags {', '.join(unknown)}")
            run = pair.get("new_run")
            answer = run.get("answer") if isinstance(run, Mapping) else None
            if "long" in tags and len(str(answer or "")) <= LONG_ANSWER_CHARS:
                report.fail(where, f"tag long but the answer has {len(str(answer or ''))} characters")
    if _batch2(pair) and "tags" not in pair:
        report.fail(where, "a batch-2 pair (chk-081 on) carries tags")
    if not (isinstance(pair["id"], str) and _ID.match(pair["id"])):
        report.fail(where, f"id {pair['id']!r} is not chk-NNN")
    if pair["split"] not in SPLITS:
        report.fail(where, f"split {pair['split']!r} is not dev or test")
    if pair["kind"] not in KINDS:
        report.fail(where, f"kind {pair['kind']!r} is not one of {', '.join(KINDS)}")
    if pair["label"] not in LABELS:
        report.fail(where, f"label {pair['label']!r} is not pass or fail")
    if not _str(pair["why"]):
        report.fail(where, "why is empty")

    case = pair["case"]
    if _keys(case, CASE_KEYS, set(), where, "case", report):
        _check_input(case["input"], where, report)
        _check_expected(
            case["expected_output"], case.get("metadata"), pair["kind"], where, report, layer_sentences
        )
        _check_metadata(case["metadata"], where, report)
    _check_run(pair["new_run"], where, report)


def _check_input(inp: Any, where: str, report: Report) -> None:
    if not _keys(inp, INPUT_KEYS, set(), where, "case.input", report):
        return
    if not _str(inp["question"]):
        report.fail(where, "case.input.question is empty")
    if not (_str_list(inp["retrieved_sources"]) and all(_URL.match(u) for u in inp["retrieved_sources"])):
        report.fail(where, "case.input.retrieved_sources must be a list of URLs")
    calls = inp["tool_calls"]
    if not isinstance(calls, list):
        report.fail(where, "case.input.tool_calls is not a list")
        return
    for i, call in enumerate(calls, 1):
        if not _keys(call, INPUT_CALL_KEYS, set(), where, f"case.input.tool_calls[{i}]", report):
            continue
        if not _str(call["tool"]) or not isinstance(call["args"], Mapping):
            report.fail(where, f"case.input.tool_calls[{i}] needs a tool name and an args object")
        if call["tool"] in SEARCH_TOOLS and call["collection"] != SEARCH_TOOLS[call["tool"]]:
            report.fail(
                where, f"case.input.tool_calls[{i}]: {call['tool']} searches {SEARCH_TOOLS[call['tool']]}"
            )


def _check_expected(
    exp: Any, metadata: Any, kind: str, where: str, report: Report, layer_sentences: Mapping[str, str]
) -> None:
    if not _keys(exp, EXPECTED_REQUIRED, EXPECTED_OPTIONAL, where, "case.expected_output", report):
        return
    for key in ("answer", "tool_behavior"):
        if exp[key] is not None and not _str(exp[key]):
            report.fail(where, f"expected_output.{key} must be null or a non-empty string")
    if not _str(exp["expectation"]):
        report.fail(where, "expected_output.expectation is empty")
    if "must_cite" in exp and not (
        _str_list(exp["must_cite"], True) and all(_URL.match(u) for u in exp["must_cite"])
    ):
        report.fail(where, "expected_output.must_cite must be a non-empty list of URLs")
    if "must_not_claim" in exp and not _str_list(exp["must_not_claim"], True):
        report.fail(where, "expected_output.must_not_claim must be a non-empty list of claims")
    if "decline" in exp and exp["decline"] is not True:
        report.fail(where, "expected_output.decline, when present, must be true")

    layer = metadata.get("layer") if isinstance(metadata, Mapping) else None
    carried = _expectations(exp, layer)
    if not carried:
        report.fail(where, "the case carries no checkable expectation")
    if kind == "mixed":
        if len([c for c in carried if c in KINDS_V1]) < 2:
            report.fail(where, f"kind mixed needs two or more expectations, the case carries {carried}")
    elif kind in KINDS and kind not in carried:
        report.fail(where, f"kind {kind} but the case carries only {carried}")

    # consistency with how `triage promote` builds an expected output
    sentence = exp.get("expectation")
    if isinstance(sentence, str) and _APPROVING.match(sentence):
        if set(exp) & EXPECTED_OPTIONAL:
            report.fail(where, "an approving review never carries must_cite, must_not_claim or decline")
        if exp["answer"] is None:
            report.fail(where, "an approving review keeps the agent's answer as the expected answer")
        return
    if sentence in REVIEW_EXPECTATIONS:
        if set(exp) & EXPECTED_OPTIONAL:
            report.fail(where, "a reviewer's expectation never carries must_cite, must_not_claim or decline")
        if sentence == "The reviewer's corrected answer." and exp["answer"] is None:
            report.fail(where, "a corrected-answer case needs the answer")
        if sentence == "The reviewer's expected tool behaviour." and (
            exp["answer"] is not None or exp["tool_behavior"] is None
        ):
            report.fail(where, "an expected-tool-behaviour case has no answer and needs the tool behaviour")
        return
    if layer_sentences:
        if layer not in layer_sentences:
            report.fail(where, f"metadata.layer {layer!r} is not a triage layer")
            return
        if sentence != layer_sentences[layer]:
            report.fail(where, f"expectation is not the sentence of layer {layer} (nor a reviewer's)")
    if "must_cite" in exp and layer not in ("retrieval", "generation", "tool_routing"):
        report.fail(where, f"must_cite comes only with retrieval, generation or tool_routing, not {layer}")
    if "must_not_claim" in exp and layer not in ("generation", "content_gap_hallucination"):
        report.fail(
            where, f"must_not_claim comes only with generation or content_gap_hallucination, not {layer}"
        )
    gap = layer in ("content_gap_hallucination", "content_gap_handled")
    if ("decline" in exp) != gap:
        report.fail(where, "decline is set exactly for the content-gap layers")
    if exp["tool_behavior"] is not None and layer not in (
        "retrieval",
        "tool_routing",
        "agent_skipped_retrieval",
    ):
        report.fail(
            where,
            f"only retrieval, tool_routing or skipped retrieval carry a tool behaviour, not {layer}",
        )
    if exp["answer"] is not None and layer != "ok":
        report.fail(where, "a layer expectation carries the answer only for the ok layer")


def _check_metadata(meta: Any, where: str, report: Report) -> None:
    if not _keys(meta, METADATA_REQUIRED, METADATA_OPTIONAL, where, "case.metadata", report):
        return
    if meta["layer"] not in LAYERS:
        report.fail(where, f"metadata.layer {meta['layer']!r} is not a triage layer")
    for key in ("component", "signature"):
        if not _str(meta[key]):
            report.fail(where, f"metadata.{key} is empty")
    if "original_answer" in meta and not _str(meta["original_answer"], empty_ok=True):
        report.fail(where, "metadata.original_answer must be a string")


def _check_run(run: Any, where: str, report: Report) -> None:
    if not _keys(run, RUN_KEYS, set(), where, "new_run", report):
        return
    if not _str(run["answer"], empty_ok=True):
        report.fail(where, "new_run.answer must be a string")
    if not (_str_list(run["sources"]) and all(_URL.match(u) for u in run["sources"])):
        report.fail(where, "new_run.sources must be a list of URLs")
    if not isinstance(run["retrieved"], list):
        report.fail(where, "new_run.retrieved is not a list")
    else:
        for i, item in enumerate(run["retrieved"], 1):
            if not _keys(item, RETRIEVED_KEYS, set(), where, f"new_run.retrieved[{i}]", report):
                continue
            if item["collection"] not in COLLECTIONS:
                report.fail(where, f"new_run.retrieved[{i}]: unknown collection {item['collection']!r}")
            lines = item["lines"]
            if not (isinstance(lines, list) and len(lines) == 2 and all(isinstance(n, int) for n in lines)
                    and 1 <= lines[0] <= lines[1]):  # fmt: skip
                report.fail(
                    where, f"new_run.retrieved[{i}]: lines must be [first, last] with 1 <= first <= last"
                )
            if not (_str(item["path"]) and _str(item["source_url"]) and _URL.match(item["source_url"])):
                report.fail(where, f"new_run.retrieved[{i}] needs a path and a source_url")
    if not isinstance(run["tool_calls"], list):
        report.fail(where, "new_run.tool_calls is not a list")
        return
    for i, call in enumerate(run["tool_calls"], 1):
        if not _keys(call, RUN_CALL_KEYS, set(), where, f"new_run.tool_calls[{i}]", report):
            continue
        if not _str(call["name"]) or not isinstance(call["args"], Mapping):
            report.fail(where, f"new_run.tool_calls[{i}] needs a name and an args object")
        if call["name"] in SEARCH_TOOLS and call["collection"] != SEARCH_TOOLS[call["name"]]:
            report.fail(
                where, f"new_run.tool_calls[{i}]: {call['name']} searches {SEARCH_TOOLS[call['name']]}"
            )
        if call["name"] not in SEARCH_TOOLS and call["collection"] is not None:
            report.fail(where, f"new_run.tool_calls[{i}]: a non-search tool has no collection")
    searched = {c.get("collection") for c in run["tool_calls"] if isinstance(c, Mapping)}
    for i, item in enumerate(run["retrieved"] if isinstance(run["retrieved"], list) else [], 1):
        coll = item.get("collection") if isinstance(item, Mapping) else None
        coll = "code" if coll == "examples" else coll
        if coll is not None and coll not in searched:
            report.fail(where, f"new_run.retrieved[{i}] is from {coll}, which the run never searched")


# ---------------------------------------------------------------- the corpus


@dataclass
class Corpus:
    root: Path
    urls: dict[tuple[str, str], str] = field(default_factory=dict)  # (folder, path) -> url
    lines: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> Corpus:
        corpus = cls(root)
        for folder in sorted(set(COLLECTION_DIRS.values())):
            for line in (root / folder / "INDEX.jsonl").read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    corpus.urls[(folder, row["path"])] = row["url"]
        return corpus

    def file_lines(self, folder: str, path: str) -> list[str] | None:
        key = (folder, path)
        if key not in self.lines:
            base = ISSUES_DIR if folder == "issues" else self.root / folder
            file = base / path
            if not file.is_file() or ".." in Path(path).parts:
                return None
            self.lines[key] = file.read_text(encoding="utf-8").splitlines()
        return self.lines[key]

    @property
    def known_urls(self) -> set[str]:
        return set(self.urls.values())


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def check_corpus(pair: Mapping[str, Any], corpus: Corpus, report: Report) -> None:
    """Every retrieved passage names a corpus file and a line range inside it, with the file's URL;
    every must_cite URL is a corpus page; no long answer line is copied from a referenced file."""
    where = f"{pair.get('id', '?')} (line {pair.get('_line', '?')})"
    run = pair.get("new_run") or {}
    referenced: list[list[str]] = []
    for i, item in enumerate(run.get("retrieved") or [], 1):
        if not isinstance(item, Mapping) or item.get("collection") not in COLLECTIONS:
            continue
        coll = item["collection"]
        folder = "issues" if coll == "issues" else COLLECTION_DIRS[coll]
        lines = corpus.file_lines(folder, str(item.get("path")))
        if lines is None:
            report.fail(where, f"new_run.retrieved[{i}]: {coll}:{item.get('path')} does not exist")
            continue
        referenced.append(lines)
        first, last = (item.get("lines") or [0, 0]) + [0, 0][: 2 - len(item.get("lines") or [])]
        if not (isinstance(first, int) and isinstance(last, int) and 1 <= first <= last <= len(lines)):
            report.fail(where, f"new_run.retrieved[{i}]: lines {first}-{last} of {item['path']} do not exist "
                               f"(the file has {len(lines)} lines)")  # fmt: skip
            continue
        if not "\n".join(lines[first - 1 : last]).strip():
            report.fail(where, f"new_run.retrieved[{i}]: lines {first}-{last} of {item['path']} are blank")
        page_url = str(item.get("source_url") or "").split("#", 1)[0]  # a section anchor is allowed
        if folder != "issues" and corpus.urls.get((folder, item["path"])) != page_url:
            report.fail(where, f"new_run.retrieved[{i}]: source_url is not the INDEX url of {item['path']} "
                               f"(optionally with #anchor): {corpus.urls.get((folder, item['path']))}")  # fmt: skip
    exp = (pair.get("case") or {}).get("expected_output") or {}
    known = corpus.known_urls
    for url in exp.get("must_cite") or []:
        if url not in known:
            report.fail(where, f"must_cite URL {url} is not a corpus page")
    texts = [_norm("\n".join(lines)) for lines in referenced]
    for line in str(run.get("answer") or "").splitlines():
        if len(line.strip()) >= COPY_LINE_CHARS and any(_norm(line) in text for text in texts):
            report.fail(where, f"the answer copies a corpus line verbatim: {line.strip()[:60]}...")


# ---------------------------------------------------------------- the set


def counts(pairs: Sequence[Mapping[str, Any]]) -> dict[str, Counter[Any]]:
    return {
        "split": Counter(p.get("split") for p in pairs),
        "kind": Counter(p.get("kind") for p in pairs),
        "label": Counter(p.get("label") for p in pairs),
        "kind x label": Counter((p.get("kind"), p.get("label")) for p in pairs),
        "kind x split": Counter((p.get("kind"), p.get("split")) for p in pairs),
        "split x label": Counter((p.get("split"), p.get("label")) for p in pairs),
    }


def _batch2(pair: Mapping[str, Any]) -> bool:
    pid = pair.get("id")
    return isinstance(pid, str) and bool(_ID.match(pid)) and int(pid[4:]) >= BATCH2_FIRST


def check_batch2(pairs: Sequence[Mapping[str, Any]], report: Report) -> None:
    """Batch 2 (chk-081 on): splits alternate by id (odd dev, even test), labels within 45-55%,
    and every class tag on MIN_PER_TAG or more pairs, with both labels."""
    batch = [p for p in pairs if _batch2(p)]
    if not batch:
        return
    for p in batch:
        want = "dev" if int(p["id"][4:]) % 2 else "test"
        if p.get("split") != want:
            report.fail(str(p.get("id")), f"batch 2 alternates splits by id: this one is {want}")
    n = len(batch)
    passes = sum(p.get("label") == "pass" for p in batch)
    if not 0.45 <= passes / n <= 0.55:
        report.fail("batch 2", f"{passes}/{n} pass, outside 45-55%")
    tagged = Counter((t, p.get("label")) for p in batch for t in p.get("tags") or [] if isinstance(t, str))
    for tag in TAGS:
        total = tagged[(tag, "pass")] + tagged[(tag, "fail")]
        if total < MIN_PER_TAG:
            report.fail("batch 2", f"tag {tag} is on {total} pairs, fewer than {MIN_PER_TAG}")
        for label in LABELS:
            if not tagged[(tag, label)]:
                report.fail("batch 2", f"tag {tag} has no {label} pair")


def check_set(pairs: Sequence[Mapping[str, Any]], report: Report) -> None:
    ids = Counter(p.get("id") for p in pairs)
    for pid, n in ids.items():
        if n > 1:
            report.fail(str(pid), f"the id is used {n} times")
    if len(pairs) < MIN_PAIRS:
        report.fail("set", f"{len(pairs)} pairs, fewer than {MIN_PAIRS}")
    c = counts(pairs)
    # the batch-2 kinds are checked with batch 2 (check_batch2): a set without batch 2 needs none
    for kind in KINDS_V1 + tuple(k for k in KINDS_V2 if any(_batch2(p) for p in pairs)):
        least = MIN_PER_KIND if kind in KINDS_V1 else MIN_PER_KIND_V2
        if c["kind"][kind] < least:
            report.fail("set", f"kind {kind} has {c['kind'][kind]} pairs, fewer than {least}")
        for split in SPLITS:
            if not c["kind x split"][(kind, split)]:
                report.fail("set", f"kind {kind} has no pair in {split}")
        for label in LABELS:
            if not c["kind x label"][(kind, label)]:
                report.fail("set", f"kind {kind} has no {label} pair")
    total = max(len(pairs), 1)
    for label in LABELS:
        if not 0.4 <= c["label"][label] / total <= 0.6:
            report.fail("set", f"label {label} is {c['label'][label]}/{total}, outside 40-60%")
    for split in SPLITS:
        if not 0.4 <= c["split"][split] / total <= 0.6:
            report.fail("set", f"split {split} is {c['split'][split]}/{total}, outside 40-60%")


def summary(pairs: Sequence[Mapping[str, Any]]) -> str:
    c = counts(pairs)
    out = [f"{len(pairs)} pairs"]
    out.append("split:  " + ", ".join(f"{s} {c['split'][s]}" for s in SPLITS))
    out.append("label:  " + ", ".join(f"{lb} {c['label'][lb]}" for lb in LABELS))
    out.append("")
    out.append(f"{'kind':<16}{'pass':>6}{'fail':>6}{'dev':>6}{'test':>6}{'total':>7}")
    for kind in KINDS:
        out.append(
            f"{kind:<16}{c['kind x label'][(kind, 'pass')]:>6}{c['kind x label'][(kind, 'fail')]:>6}"
            f"{c['kind x split'][(kind, 'dev')]:>6}{c['kind x split'][(kind, 'test')]:>6}{c['kind'][kind]:>7}"
        )
    batch = [p for p in pairs if _batch2(p)]
    if batch:
        tagged = Counter((t, p.get("label"), p.get("split")) for p in batch for t in p.get("tags") or [])
        out.append("")
        out.append(f"batch 2 (chk-{BATCH2_FIRST:03d} on): {len(batch)} pairs, "
                   f"{sum(p.get('label') == 'pass' for p in batch)} pass")  # fmt: skip
        out.append(f"{'tag':<24}{'pass':>6}{'fail':>6}{'dev':>6}{'test':>6}")
        for tag in TAGS:
            lp = sum(v for (t, lb, _), v in tagged.items() if t == tag and lb == "pass")
            lf = sum(v for (t, lb, _), v in tagged.items() if t == tag and lb == "fail")
            sd = sum(v for (t, _, sp), v in tagged.items() if t == tag and sp == "dev")
            st = sum(v for (t, _, sp), v in tagged.items() if t == tag and sp == "test")
            out.append(f"{tag:<24}{lp:>6}{lf:>6}{sd:>6}{st:>6}")
    out.append("")
    out.append(
        "split x label: "
        + ", ".join(f"{s}/{lb} {c['split x label'][(s, lb)]}" for s in SPLITS for lb in LABELS)
    )
    return "\n".join(out)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=PAIRS_FILE)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    args = parser.parse_args(list(argv) if argv is not None else None)

    pairs, broken = load_pairs(args.file)
    report = Report(failures=list(broken))
    sentences = _layer_expectations()
    for pair in pairs:
        check_pair(pair, report, sentences)
    check_set(pairs, report)
    check_batch2(pairs, report)
    if (args.corpus / "kubeflow-docs" / "INDEX.jsonl").is_file():
        corpus = Corpus.load(args.corpus)
        for pair in pairs:
            check_corpus(pair, corpus, report)
    else:
        report.skipped = f"skipped: the corpus is not at {args.corpus}; corpus references were not checked"
    if not sentences:
        print("note: triage is not importable; the layer expectation sentences were not compared")

    print(summary(pairs))
    if report.skipped:
        print(report.skipped)
    if report.failures:
        print(f"\n{len(report.failures)} failure(s):")
        for failure in report.failures:
            print("  " + failure)
        return 1
    print(
        "\nok: every pair is well formed" + ("" if report.skipped else " and every corpus reference resolves")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
