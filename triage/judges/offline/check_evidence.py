"""Evidence a check judge reads without a model (`triage check`): the page a URL names and
`must_cite`, the tools a behaviour asks for and `tool_behavior`, an answer read in prose sentences,
numbers and values, declines in the other languages users write (`decline_cues`), links as
pointers (`is_pointer`), and the injection guard applied to a judge's passes.

`must_cite` and `tool_behavior` are decided here for every check judge (no model can do them
better); the rest are the string tools `check_offline` builds on and `check_llm` verifies a
model's quotes with.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from triage.domain.checks import AgentRun, CheckCase, ExpectationCheck, ToolUse
from triage.domain.kernel import one_line
from triage.judges import guard
from triage.judges.offline.text import FENCE, fold, specifics, squash

#: how much of a quote, a claim or a URL list an evidence string carries
EVIDENCE_CHARS = 240

# -- must_cite: the same page ------------------------------------------------------------------------


def page_of(url: str) -> str:
    """The page a URL names: no scheme, the host in lower case without `www.`, no `?query`, no
    `#anchor` (a section or a `#L37-L51` line range), no trailing slash. Two URLs name the same
    page when their `page_of` are equal; a prefix (a section index) or a sibling is another page."""
    text = url.strip().rstrip(".,;:!?)*>\"'`")
    parts = urlsplit(text if "://" in text else f"https://{text}")
    host = (parts.hostname or "").lower().removeprefix("www.")
    port = f":{parts.port}" if parts.port and parts.port not in (80, 443) else ""
    path = re.sub(r"/+$", "", parts.path)
    return f"{host}{port}{path}"


def _answer_urls(answer: str) -> list[str]:
    return [s for s in specifics(answer) if s.startswith(("http://", "https://"))]


def check_must_cite(expected_urls: Sequence[str], run: AgentRun) -> ExpectationCheck:
    """`must_cite`: a cited or retrieved URL is the same page as one of `expected_urls`."""
    wanted = {page_of(u): u for u in expected_urls}
    cited = list(dict.fromkeys([*run.sources, *_answer_urls(run.answer or "")]))
    for url in cited:
        if page_of(url) in wanted:
            return ExpectationCheck(
                name="must_cite", passed=True, confidence="high", evidence=f"cites {url}"[:EVIDENCE_CHARS]
            )
    for passage in run.retrieved:
        if passage.source_url and page_of(passage.source_url) in wanted:
            return ExpectationCheck(
                name="must_cite",
                passed=True,
                confidence="high",
                evidence=f"retrieved {passage.id} from {passage.source_url}"[:EVIDENCE_CHARS],
            )
    retrieved = [p.source_url for p in run.retrieved if p.source_url]
    if not cited and not retrieved and run.tool_calls is None:
        return ExpectationCheck(
            name="must_cite",
            passed=None,
            evidence="the run reports no sources, no retrieved passages and no tool calls",
        )
    seen = "; ".join(dict.fromkeys([*cited, *retrieved])) or "nothing"
    return ExpectationCheck(
        name="must_cite",
        passed=False,
        confidence="high",
        evidence=f"none of {', '.join(expected_urls)} among the cited and retrieved pages: {seen}"[
            :EVIDENCE_CHARS
        ],
    )


# -- tool_behavior: the tool or the collection named -------------------------------------------------

#: a name after one of these is not wanted ("search the code collection, not the docs")
_NOT_WANTED = re.compile(
    r"\b(?:not|never|no|instead of|rather than|other than|without|except|avoid(?:ing)?|n't)\W+(?:\w+\W+){0,3}$",
    re.IGNORECASE,
)
_COLLECTION_NAMED = re.compile(r"\bthe\s+[`'\"]?([\w-]+)[`'\"]?\s+collection\b", re.IGNORECASE)
_ANY_SEARCH = re.compile(
    r"\b(?:a|any|some)\s+search(?:\s+tool)?\b|\bsearch(?:es)?\s+(?:first|before)\b", re.I
)


@dataclass(frozen=True)
class ToolWant:
    """What an expected tool behaviour asks for: tools by name, collections, or any search."""

    tools: frozenset[str] = frozenset()
    collections: frozenset[str] = frozenset()
    any_search: bool = False

    @property
    def readable(self) -> bool:
        return bool(self.tools or self.collections or self.any_search)


def read_tool_behavior(text: str, tools: Mapping[str, str]) -> ToolWant:
    """The tools and collections `text` asks for (`tools`: tool name -> the collection it searches)."""

    def wanted(at: int) -> bool:
        return not _NOT_WANTED.search(text[max(0, at - 60) : at])

    names = set(tools) | set(re.findall(r"\b(?:search|fetch|get|read|lookup)_[a-z0-9_]+\b", text))
    named_tools = {
        n for n in names for m in re.finditer(rf"(?<![\w]){re.escape(n)}(?![\w])", text) if wanted(m.start())
    }
    known_collections = set(tools.values())
    named_collections = {
        m.group(1).lower()
        for m in _COLLECTION_NAMED.finditer(text)
        if wanted(m.start()) and (not known_collections or m.group(1).lower() in known_collections)
    }
    named_collections |= {tools[t] for t in named_tools if t in tools}
    any_search = not named_tools and not named_collections and bool(_ANY_SEARCH.search(text))
    return ToolWant(frozenset(named_tools), frozenset(named_collections), any_search)


def collection_of(call: ToolUse, tools: Mapping[str, str]) -> str | None:
    return call.collection or tools.get(call.name)


def _call_text(call: ToolUse, tools: Mapping[str, str]) -> str:
    coll = collection_of(call, tools)
    query = call.args.get("query")
    return f"{call.name}" + (f" ({coll})" if coll else "") + (f" {query!r}" if isinstance(query, str) else "")


def check_tool_behavior(text: str, run: AgentRun, tools: Mapping[str, str]) -> ExpectationCheck | None:
    """`tool_behavior` from the run's tool calls; None when `text` names no tool, collection or
    search that code can read (the model reads it, or the case stays undecided)."""
    want = read_tool_behavior(text, tools)
    if run.tool_calls is None:
        return ExpectationCheck(
            name="tool_behavior", passed=None, evidence="the run does not say which tools it called"
        )
    if not want.readable:
        return None
    for call in run.tool_calls:
        coll = collection_of(call, tools)
        if (
            call.name in want.tools
            or (coll is not None and coll in want.collections)
            or (want.any_search and coll is not None)
        ):
            return ExpectationCheck(
                name="tool_behavior",
                passed=True,
                confidence="high",
                evidence=f"called {_call_text(call, tools)}"[:EVIDENCE_CHARS],
            )
    asked = sorted(want.tools | {f"the {c} collection" for c in want.collections}) or ["a search"]
    made = "; ".join(_call_text(c, tools) for c in run.tool_calls) or "no tool call"
    return ExpectationCheck(
        name="tool_behavior",
        passed=False,
        confidence="high",
        evidence=f"expected {' or '.join(asked)}; the run made {made}"[:EVIDENCE_CHARS],
    )


# -- the answer, read in sentences ---------------------------------------------------------------------

_SENTENCES = re.compile(r"(?<=[.!?])\s+(?=[^a-z])|\n+")
NEGATION = re.compile(
    r"\b(?:not|no|never|nor|neither|none|cannot|isn't|aren't|wasn't|weren't|doesn't|don't|didn't|won't|can't"
    r"|couldn't|shouldn't|wouldn't|hasn't|haven't|without|unsupported|instead of|rather than)\b",
    re.IGNORECASE,
)
_NUMBER_WORDS = {
    w: str(n)
    for n, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())
}
_NUMBER_WORD = re.compile(rf"\b(?:{'|'.join(_NUMBER_WORDS)})\b", re.IGNORECASE)
_STANDALONE_NUMBER = re.compile(r"(?<![\w.,-])\d+(?:\.\d+)?(?![\w-]|\.\d)")
#: Markdown emphasis around words (`**not**`, `_note_`); the underscores of `max_trial_count` are none
_MARKUP = re.compile(r"(?<![\w*])[*_]{1,3}(?=\S)|(?<=\S)[*_]{1,3}(?![\w*])")


def prose_sentences(text: str) -> list[str]:
    """The sentences of `text` outside fenced code (a code block states no claim by itself),
    emphasis marks dropped, list markers kept as sentence starts."""
    prose = FENCE.sub("\n", fold(text))
    prose = _MARKUP.sub("", prose)
    return [s.strip(" -*>\t") for s in _SENTENCES.split(prose) if s.strip(" -*>\t")]


def numbers_in(text: str) -> set[str]:
    """Standalone numbers of `text`, number words (`three`) read as digits."""
    found = set(_STANDALONE_NUMBER.findall(text))
    found |= {_NUMBER_WORDS[m.group(0).lower()] for m in _NUMBER_WORD.finditer(text)}
    return found


def unticked(text: str) -> str:
    return text.replace("`", " ")


def holds(haystack: str, item: str) -> bool:
    """`item` (a specific) in `haystack` (squashed): a number whole, a URL as its page, else as text."""
    needle = squash(item)
    if re.fullmatch(r"\d+(?:\.\d+)?", needle):
        return re.search(rf"(?<![\d.,]){re.escape(needle)}(?!\d|[.,]\d)", haystack) is not None
    if needle.startswith(("http://", "https://")):
        return page_of(needle) in {page_of(u) for u in re.findall(r"https?://\S+", haystack)}
    return needle in haystack


# -- the offline checks ------------------------------------------------------------------------------


def seen_texts(case: CheckCase, run: AgentRun) -> list[str]:
    """What the agent saw on its new run: the question and its retrieved passages."""
    seen = [case.question]
    for passage in run.retrieved:
        seen += [passage.text, passage.title or "", passage.source_url or ""]
    return seen


def quote(text: str) -> str:
    return one_line(text, EVIDENCE_CHARS - 40)


def answer_findings(run: AgentRun, question: str | None = None) -> list[str]:
    """The injection guard's findings in every untrusted text a check reads: the question (when
    given), the answer, the sources, the retrieved passages and the tool calls' arguments, with the
    triage judge's patterns and the check judge's own (`guard.check_injection_findings`)."""
    fields: list[tuple[str, str | None]] = [("question", question), ("answer", run.answer)]
    fields += [(f"source {n}", url) for n, url in enumerate(run.sources, start=1)]
    fields += [
        (f"passage {p.id}", "\n".join(t for t in (p.title, p.source_url, p.text) if t)) for p in run.retrieved
    ]
    for n, call in enumerate(run.tool_calls or [], start=1):
        said = {"tool": call.name, "collection": call.collection, "arguments": call.args}
        fields.append((f"tool call T{n}", json.dumps(said, ensure_ascii=False, default=str)))
    return guard.check_injection_findings(fields)


def guarded(
    checks: list[ExpectationCheck],
    findings: Sequence[str],
    by_code: Collection[str] = ("must_cite", "tool_behavior"),
) -> list[ExpectationCheck]:
    """A run whose text (its answer, question, sources, passages, tool arguments: `answer_findings`)
    tries to instruct or fool the judge is never passed by the judge alone: each pass its words
    decide becomes undecided (a fail stands). The expectations code decided (`by_code`: `must_cite`,
    and `tool_behavior` where code read it) read the run, not its words, and stay; a tool behaviour
    a model decided is its word like any other."""
    if not findings:
        return checks
    note = "; ".join(findings)[:120]
    out = []
    for c in checks:
        if c.passed is True and c.name not in by_code:
            c = c.model_copy(
                update={
                    "passed": None,
                    "confidence": "low",
                    "evidence": quote(
                        f"the run's text tries to steer the judge ({note}); a person decides. {c.evidence}"
                    ),
                }
            )
        out.append(c)
    return out


def no_answer(case: CheckCase, run: AgentRun) -> list[ExpectationCheck] | None:
    if run.error is None and run.answer is not None:
        return None
    why = f"the agent failed: {run.error}" if run.error else "the agent gave no answer"
    return [ExpectationCheck(name=n, passed=None, evidence=quote(why)) for n in case.expected.names()]


# -- declines in the languages users write, beyond the shared phrase lists ----------------------------
#
# `offline_text.decline_phrases` lists phrases, and reads English by cues as well; the other languages
# only by their lists, and a list never ends ("La doc n'en parle pas", "Dazu steht in der Doku
# nichts", "文档中没有相关说明"). The check judge reads them as the English cue check does: a
# sentence that names what the agent read and says, in the same breath, that it does not tell (a
# negation before a verb of telling), or that there is no information on it. A plain negation ("X
# wird nicht unterstützt", "不支持") is a claim, not a decline, and a clause the docs report ("la
# documentation indique que ... ne ... pas") is what they do say. Kept here, not in the shared lists,
# so the nightly judge's figures are untouched.


# -- pointers: where to look, not an answer ---------------------------------------------------------------

#: a link without its scheme (`github.com/kubeflow/trainer`, `trainer.kubeflow.org/en/latest`)
_SCHEMELESS = re.compile(r"(?:www\.)?((?:[a-z0-9-]+\.)+[a-z]{2,})(?::\d+)?(?:/\S*)?", re.IGNORECASE)
#: the project's own hosts: its docs sites and where its code lives
PROJECT_HOSTS = ("kubeflow.org", "github.com", "github.io", "readthedocs.io")


def is_pointer(item: str, hosts: Sequence[str] = ()) -> bool:
    """`item` (a specific) is a link, with a scheme or without one to the project's own hosts
    (`PROJECT_HOSTS`, and `hosts`: those the case and the run name): where to look, not an answer."""
    text = item.strip().rstrip(".,;:!?)")
    if text.startswith(("http://", "https://")):
        return True
    match = _SCHEMELESS.fullmatch(text)
    if not match:
        return False
    host = match.group(1).lower()
    return any(host == h or host.endswith("." + h) for h in [*PROJECT_HOSTS, *hosts])


def run_hosts(case: CheckCase, run: AgentRun) -> list[str]:
    """The hosts of the pages the case names and the run cites or retrieved."""
    urls = [*case.expected.must_cite, *run.sources, *(p.source_url or "" for p in run.retrieved)]
    return sorted({page_of(u).split("/", 1)[0].split(":", 1)[0] for u in urls if u.strip()} - {""})


def digits_in(text: str) -> set[str]:
    """The numbers `text` writes in digits (a number word, "one of them", is no value of its own)."""
    return set(_STANDALONE_NUMBER.findall(text))
