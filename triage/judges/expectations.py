"""The check judges (`triage check`): does the agent's new run meet its regression case's expectations?

Two `domain.checks.CheckJudge`s decide, expectation by expectation (`Expected.names()`), each with
its evidence (the quoted span, the matching URL, the tool call) and a confidence:

- **code decides the mechanical two, for both judges** (no model can do them better):
  `must_cite` holds when a URL the answer cites (its `sources`, or a URL written in the answer) or
  a retrieved passage's `source_url` is the same page as one of the case's URLs (`page_of`: the
  scheme, the host's case, `www.`, a trailing slash, a `#anchor` or `#L..` and a `?query` do not
  change the page); `tool_behavior` holds when the run called the tool, or searched the collection,
  that the expected behaviour names (`call a search tool` takes any search; a name after "not",
  "instead of" or "rather than" is not wanted). A run that does not say which tools it called
  (`AgentRun.tool_calls` None) leaves it undecided, and a behaviour that names no tool or collection
  is left to the model (the offline judge leaves it undecided).
- **the offline judge** (`OfflineCheckJudge`, no model) decides the other three with the offline
  triage judge's machinery (`offline_text`: decline phrases, specifics; `grounding`: specifics seen
  nowhere, `key: value` swaps), and says `passed=None` where that machinery cannot be sure:
  - `correction`: a value of the correction (its specifics and numbers, number words read as
    digits) missing from the answer, or a `key: value` of the answer that swaps one of the
    correction's, fails. Every value present is no pass: whether an added sentence contradicts the
    correction ("start_step is only advisory") is meaning, not strings (undecided).
  - `must_not_claim`: per claim, its *anchors* (its code spans, specifics and proper names beyond
    the question's words) and its content words are looked for in the answer's prose sentences
    (fenced code states no claim). A sentence holding every anchor and half of the words (three
    quarters for a claim without anchors), with the claim's polarity, makes it again (fail); one
    holding them with the other polarity ("not `bayesian`") names it to reject it; a claim none of
    whose anchors, or none of whose quoted values, appears anywhere is gone. Anything in between
    (a rewording, a part of the claim) is undecided.
  - `decline`: a decline phrase (`offline_text.decline_phrases`) and no specific that no retrieved
    passage holds (`grounding.unsupported_specifics`, against the question and the passages):
    invented specifics fail (a decline that goes on to a field, command or value of its own, or no
    decline at all); a single one is undecided (a harmless name the agent knows, or not); no
    decline phrase fails, unless the answer says something is not told ("nothing about TLS").
- **the LLM judge** (`LLMCheckJudge`) asks an OpenAI-compatible model, in one call per case, about
  the expectations code cannot decide (`correction`, `must_not_claim`, `decline`, and a tool
  behaviour code cannot read). The instructions are one byte-identical system message
  (`prompts/check_system.j2`, cache-friendly: no nonce, no case in it); the untrusted text (the
  question, the expectations, the answer, the sources, the passages, the tool calls) follows in the
  user message (`prompts/check_user.j2`), cleaned and JSON-encoded inside blocks fenced with a
  per-call nonce. The reply is structured (a fixed strict schema, a verdict per expectation asked:
  `pass | fail | unsure` with a quote and a confidence) and verified in code: every expectation
  asked answered once, every quote an exact substring of the answer shown, a claim made again and
  a decline that passes quoted. A reply that fails gets one retry told why; an unusable reply
  (not JSON, refused, failing twice) makes the expectations asked undecided with the reason, never
  a crash.

Both apply the injection guard of `judges.prompts` to the answer: an answer that tries to instruct
or fool the judge is never passed by the judge alone (a pass becomes undecided, for a person); a
fail stands. The LLM judge also lowers a pass the model itself flags.

`CHECK_JUDGES` (name -> factory from a `judges.JudgeSetup`) is their registry: the triage
registry `JUDGES` holds `domain.ports.Judge`s (a trace to facts), a shape these do not have.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import openai
from pydantic import BaseModel, ConfigDict

from triage.domain.checks import AgentRun, CheckCase, CheckJudge, ExpectationCheck, ExpectationName, ToolUse
from triage.domain.kernel import one_line
from triage.domain.records import Confidence, Usage
from triage.errors import ConfigError, JudgeRejected
from triage.judges import JudgeSetup, prompts
from triage.judges.grounding import pairs, unsupported_specifics
from triage.judges.llm_replies import quote_found, strict_schema
from triage.judges.llm_transport import ChatExchange, StructuredMode, model_retry
from triage.judges.offline_text import (
    FENCE,
    absence_cues,
    decline_phrases,
    fenced_code,
    fold,
    listed_phrases,
    looks_english,
    specifics,
    squash,
    word_set,
)
from triage.retry import Budget, Clock

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


def _collection(call: ToolUse, tools: Mapping[str, str]) -> str | None:
    return call.collection or tools.get(call.name)


def _call_text(call: ToolUse, tools: Mapping[str, str]) -> str:
    coll = _collection(call, tools)
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
        coll = _collection(call, tools)
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
_NEGATION = re.compile(
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


def _numbers(text: str) -> set[str]:
    """Standalone numbers of `text`, number words (`three`) read as digits."""
    found = set(_STANDALONE_NUMBER.findall(text))
    found |= {_NUMBER_WORDS[m.group(0).lower()] for m in _NUMBER_WORD.finditer(text)}
    return found


def _unticked(text: str) -> str:
    return text.replace("`", " ")


def _holds(haystack: str, item: str) -> bool:
    """`item` (a specific) in `haystack` (squashed): a number whole, a URL as its page, else as text."""
    needle = squash(item)
    if re.fullmatch(r"\d+(?:\.\d+)?", needle):
        return re.search(rf"(?<![\d.,]){re.escape(needle)}(?!\d|[.,]\d)", haystack) is not None
    if needle.startswith(("http://", "https://")):
        return page_of(needle) in {page_of(u) for u in re.findall(r"https?://\S+", haystack)}
    return needle in haystack


# -- the offline checks ------------------------------------------------------------------------------


def _seen_texts(case: CheckCase, run: AgentRun) -> list[str]:
    """What the agent saw on its new run: the question and its retrieved passages."""
    seen = [case.question]
    for passage in run.retrieved:
        seen += [passage.text, passage.title or "", passage.source_url or ""]
    return seen


def _quote(text: str) -> str:
    return one_line(text, EVIDENCE_CHARS - 40)


#: a value that stands for any value (`author=...`, `name: <your-name>`): no value to contradict
_PLACEHOLDER_VALUE = re.compile(r"\.{2,}|…|<[^<>]*>|\$\{?\w+\}?|(?:your|my)[-_]\w*|x+", re.IGNORECASE)


def offline_correction(correction: str, case: CheckCase, run: AgentRun) -> ExpectationCheck:
    answer = run.answer or ""
    if not answer.strip():
        return ExpectationCheck(
            name="correction", passed=False, confidence="high", evidence="the answer is empty"
        )
    asked = squash(_unticked(case.question))
    have = squash(_unticked(answer))
    required = [
        s for s in specifics(_unticked(correction)) if not _holds(asked, s) and not re.search(r"\.\.\.|…", s)
    ]
    numbers = sorted(_numbers(_unticked(correction)) - _numbers(case.question))
    answer_numbers = _numbers(_unticked(answer))
    missing = [s for s in required if not _holds(have, s)]
    numbers = [n for n in numbers if not any(n == squash(s) for s in required)]
    missing += [n for n in numbers if n not in answer_numbers]
    theirs = {
        key: values
        for key, values in pairs(_unticked(correction)).items()
        if not any(_PLACEHOLDER_VALUE.fullmatch(v) for v in values)
    }
    swapped = [
        f"{key}: {sorted(values)[0]} (the correction: {sorted(theirs[key])[0]})"
        for key, values in pairs(_unticked(answer)).items()
        if key in theirs and not values & theirs[key]
    ]
    if swapped:
        return ExpectationCheck(
            name="correction",
            passed=False,
            confidence="high",
            evidence=_quote("contradicts the correction: " + "; ".join(swapped)),
        )
    if missing:
        # a value written another way (a unit, a word) is a miss strings cannot rule out: a long
        # list of values missing is clear, one may be a rewording
        sure: Confidence = (
            "high" if len(missing) >= 2 or len(missing) == len(required) + len(numbers) else "medium"
        )
        return ExpectationCheck(
            name="correction",
            passed=False,
            confidence=sure,
            evidence=_quote(f"the answer does not state {', '.join(missing[:4])} of the correction"),
        )
    stated = len(required) + len(numbers)
    if stated == 0:
        return ExpectationCheck(
            name="correction", passed=None, evidence="the correction states no value strings can look for"
        )
    # every value is there; whether an added sentence contradicts the correction ("start_step is only
    # advisory") is meaning, not strings (measured: the share of a sentence's words the correction and
    # the passages hold does not tell an added caveat from a paraphrase)
    return ExpectationCheck(
        name="correction",
        passed=None,
        evidence=_quote(
            f"states the correction's {stated} values ({', '.join([*required, *numbers][:4])}); whether the"
            " rest contradicts it is for a person or a model"
        ),
    )


#: a sentence holding every anchor of a claim and this share of its content words (beyond the
#: question's), with the claim's polarity, makes it again; without anchors, `CLAIM_WORDS_ONLY`
CLAIM_STATED = 0.5
CLAIM_WORDS_ONLY = 0.75
#: a sentence with the claim's anchors and this share of its words, of the other polarity, rejects it
CLAIM_NAMED = 0.5


@dataclass(frozen=True)
class Anchor:
    """What a claim cannot be made without: a value it quotes (a code span) or a specific or proper
    name of it beyond the question's words."""

    text: str
    #: a code span of the claim: the value it asserts (`bayesian`)
    value: bool = False

    def in_text(self, text: str) -> bool:
        """In `text`: a value that is a plain word only as code (`bayesian` the value, not Bayesian
        the method; `password` the value, not the word); else as a whole token, or all its words."""
        if self.value and re.fullmatch(r"[A-Za-z]+", self.text):
            code = " ".join([*re.findall(r"`([^`\n]+)`", text), *fenced_code(text)])
            return re.search(rf"(?<![\w-]){re.escape(self.text)}(?![\w-])", code) is not None
        if re.search(rf"(?<![\w-]){re.escape(self.text)}(?![\w-])", text):
            return True
        wanted = word_set(self.text)
        return bool(wanted) and wanted <= word_set(text) and not re.fullmatch(r"[a-z]+", self.text)


def claim_anchors(claim: str, question: str) -> list[Anchor]:
    """A claim's anchors: its code spans (unless the question quotes the same), its specifics and
    its proper names (a capitalised word inside a sentence) beyond the question's words."""
    asked_words = word_set(question)
    asked = squash(question)
    spans = re.findall(r"`([^`\n]+)`", claim)
    out = [Anchor(s, value=True) for s in spans if s not in question]
    for item in specifics(_unticked(claim)):
        if any(item in s for s in spans) or _holds(asked, item) or word_set(item) <= asked_words:
            continue
        out.append(Anchor(item))
    for m in re.finditer(r"(?<=[a-z,;:] )([A-Z][a-z]+(?:[A-Z][a-z]+)*)\b", claim):
        if not word_set(m.group(1)) <= asked_words:
            out.append(Anchor(m.group(1)))
    return list(dict.fromkeys(out))


@dataclass
class ClaimFinding:
    claim: str
    passed: bool | None
    confidence: Confidence
    evidence: str


def _negative(text: str) -> bool:
    return bool(_NEGATION.search(text))


def offline_claim(claim: str, case: CheckCase, answer: str) -> ClaimFinding:
    """One forbidden claim against the answer (see the module docstring)."""
    anchors = claim_anchors(claim, case.question)
    words = set(word_set(_unticked(claim)) - word_set(case.question))
    negative = _negative(claim)
    stated: tuple[float, str] | None = None
    rejected: str | None = None
    for sentence in prose_sentences(answer):
        if not all(a.in_text(sentence) for a in anchors):
            continue
        share = len(words & word_set(_unticked(sentence))) / len(words) if words else 1.0
        if _negative(sentence) == negative:
            enough = share >= CLAIM_STATED if anchors else share >= CLAIM_WORDS_ONLY and len(words) >= 3
            if enough and (stated is None or share > stated[0]):
                stated = (share, sentence)
        elif anchors and share >= CLAIM_NAMED:
            rejected = rejected or sentence
    if stated is not None:
        return ClaimFinding(claim, False, "medium", f'makes it again: "{_quote(stated[1])}"')
    if rejected is not None:
        return ClaimFinding(claim, True, "medium", f'names it only to reject it: "{_quote(rejected)}"')
    text = fold(answer)
    values = [a for a in anchors if a.value]
    if anchors and not any(a.in_text(text) for a in anchors):
        return ClaimFinding(
            claim, True, "medium", f"none of {', '.join(a.text for a in anchors[:4])} in the answer"
        )
    if values and not any(a.in_text(text) for a in values):
        return ClaimFinding(
            claim,
            True,
            "medium",
            f"the value it asserts ({', '.join(a.text for a in values[:3])}) is not in the answer",
        )
    return ClaimFinding(claim, None, "low", "the answer touches the claim; strings cannot tell a rewording")


def offline_must_not_claim(claims: Sequence[str], case: CheckCase, run: AgentRun) -> ExpectationCheck:
    answer = run.answer or ""
    found = [offline_claim(c, case, answer) for c in claims]
    failed = [f for f in found if f.passed is False]
    open_ = [f for f in found if f.passed is None]
    if failed:
        f = failed[0]
        return ExpectationCheck(
            name="must_not_claim",
            passed=False,
            confidence=f.confidence,
            evidence=_quote(f"{f.claim!r}: {f.evidence}"),
        )
    if open_:
        f = open_[0]
        return ExpectationCheck(
            name="must_not_claim", passed=None, evidence=_quote(f"{f.claim!r}: {f.evidence}")
        )
    return ExpectationCheck(
        name="must_not_claim",
        passed=True,
        confidence="medium",
        evidence=_quote("; ".join(f"{f.claim[:60]!r}: {f.evidence}" for f in found)),
    )


def offline_decline(case: CheckCase, run: AgentRun) -> ExpectationCheck:
    """A decline phrase and no invented specific. Invented specifics fail the case whether or not a
    decline comes before them (a decline that then invents, or no decline at all)."""
    answer = run.answer or ""
    if not answer.strip():
        return ExpectationCheck(
            name="decline", passed=False, confidence="high", evidence="the answer is empty"
        )
    phrases = decline_phrases(answer)
    said = f'declines ("{phrases[0]}"), then gives' if phrases else "gives"
    if run.retrieved or run.tool_calls is not None:
        invented, _ = unsupported_specifics(answer, _seen_texts(case, run), case.question)
        # a URL the answer points to is where to look, not an answer
        invented = [s for s in invented if not s.startswith(("http://", "https://"))]
        if len(invented) == 1:
            # one unseen specific may be a harmless name the agent knows (as the offline triage
            # judge's grounding holds): not enough to fail a decline, nor to pass it
            return ExpectationCheck(
                name="decline",
                passed=None,
                evidence=_quote(f"{said} one specific no retrieved passage holds: `{invented[0]}`"),
            )
        if invented:
            return ExpectationCheck(
                name="decline",
                passed=False,
                confidence="high",
                evidence=_quote(
                    f"{said} what no retrieved passage holds: " + ", ".join(f"`{s}`" for s in invented[:4])
                ),
            )
    elif phrases:
        return ExpectationCheck(
            name="decline",
            passed=None,
            evidence=f'declines ("{phrases[0]}"), but the run does not say what it retrieved',
        )
    if not phrases:
        # "it covers X, but nothing about Y": an absence named without the sources may be a decline
        # the phrase lists miss
        absent = absence_cues(answer)
        if absent:
            return ExpectationCheck(
                name="decline",
                passed=None,
                evidence=_quote(f'no decline phrase, but it says something is not told ("{absent[0]}")'),
            )
        return ExpectationCheck(
            name="decline",
            passed=False,
            confidence="high" if looks_english(answer) else "medium",
            evidence="no sentence says the documentation does not cover it",
        )
    listed = bool(listed_phrases(answer))
    return ExpectationCheck(
        name="decline",
        passed=True,
        confidence="high" if listed else "medium",
        evidence=_quote(f'declines ("{phrases[0]}"); every specific it gives is in what it retrieved'),
    )


def answer_findings(run: AgentRun) -> list[str]:
    """The injection guard's findings in the answer (the text judged)."""
    return prompts.injection_findings([("answer", run.answer)])


def guarded(checks: list[ExpectationCheck], findings: Sequence[str]) -> list[ExpectationCheck]:
    """An answer that tries to instruct or fool the judge is never passed by the judge alone: each
    pass the answer decides becomes undecided (a fail stands). `must_cite` and `tool_behavior`
    read the run, not the answer's words, and stay."""
    if not findings:
        return checks
    note = "; ".join(findings)[:120]
    out = []
    for c in checks:
        if c.passed is True and c.name not in ("must_cite", "tool_behavior"):
            c = c.model_copy(
                update={
                    "passed": None,
                    "confidence": "low",
                    "evidence": _quote(
                        f"the answer tries to steer the judge ({note}); a person decides. {c.evidence}"
                    ),
                }
            )
        out.append(c)
    return out


def _no_answer(case: CheckCase, run: AgentRun) -> list[ExpectationCheck] | None:
    if run.error is None and run.answer is not None:
        return None
    why = f"the agent failed: {run.error}" if run.error else "the agent gave no answer"
    return [ExpectationCheck(name=n, passed=None, evidence=_quote(why)) for n in case.expected.names()]


class OfflineCheckJudge:
    """Decides a case's expectations with string evidence alone, no model (see the module docstring)."""

    name = "offline"
    prompt_version = "offline-check-1"

    def __init__(self, tools: Mapping[str, str] | None = None) -> None:
        #: tool name -> the collection it searches (the configuration's `[tools]`)
        self.tools: Mapping[str, str] = dict(tools or {})
        self._usage = Usage()

    @property
    def usage(self) -> Usage:
        return self._usage

    async def aclose(self) -> None:
        """Nothing to release."""

    async def check(self, case: CheckCase, run: AgentRun) -> list[ExpectationCheck]:
        failed = _no_answer(case, run)
        if failed is not None:
            return failed
        exp = case.expected
        out: list[ExpectationCheck] = []
        for name in exp.names():
            if name == "correction":
                out.append(offline_correction(exp.answer or "", case, run))
            elif name == "must_cite":
                out.append(check_must_cite(exp.must_cite, run))
            elif name == "must_not_claim":
                out.append(offline_must_not_claim(exp.must_not_claim, case, run))
            elif name == "decline":
                out.append(offline_decline(case, run))
            else:
                found = check_tool_behavior(exp.tool_behavior or "", run, self.tools)
                out.append(
                    found
                    or ExpectationCheck(
                        name="tool_behavior",
                        passed=None,
                        evidence=_quote(f"names no tool or collection code can read: {exp.tool_behavior}"),
                    )
                )
        return guarded(out, answer_findings(run))


# -- the LLM judge -----------------------------------------------------------------------------------

TEMPLATES = ("check_system.j2", "check_user.j2", "verification_retry.j2")
#: what the model is asked about; `must_cite` is always code's
ModelAsked = Literal["correction", "must_not_claim", "decline", "tool_behavior"]
CAP_QUESTION = 2000
CAP_EXPECTATION = 2000
CAP_ANSWER = 8000
CAP_PASSAGE = 2500
CAP_URL = 500
MAX_PASSAGES = 12
MAX_CALLS = 12


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckVerdict(_Reply):
    expectation: ModelAsked
    reasoning: str
    verdict: Literal["pass", "fail", "unsure"]
    quote: str
    confidence: Literal["high", "low"]


class CheckReply(_Reply):
    injection_note: str
    injection_suspected: bool
    verdicts: list[CheckVerdict]


CHECK_SCHEMA: dict[str, Any] = strict_schema(CheckReply)


@dataclass
class _Asked:
    """One call's data: the blocks as the model saw them, and the answer as shown (quotes are
    checked against it)."""

    names: list[ModelAsked]
    answer: str
    user: str


def check_problems(reply: CheckReply, asked: Sequence[ModelAsked], answer: str) -> list[str]:
    """What a reply gets wrong, in code (expectation names and check names only, never quoted text)."""
    problems: list[str] = []
    given = [v.expectation for v in reply.verdicts]
    for name in asked:
        n = given.count(name)
        if n != 1:
            problems.append(f'"{name}" needs exactly one verdict, the reply has {n}')
    for name in sorted(set(given) - set(asked)):
        problems.append(f'"{name}" was not asked about')
    for v in reply.verdicts:
        if v.quote.strip() and not quote_found(v.quote, answer):
            problems.append(f'"{v.expectation}": the quote is not an exact substring of the answer')
        if v.expectation == "must_not_claim" and v.verdict == "fail" and not v.quote.strip():
            problems.append('"must_not_claim" fail needs the quote that makes the claim again')
        if v.expectation == "decline" and v.verdict == "pass" and not v.quote.strip():
            problems.append('"decline" pass needs the quote that declines')
    return problems


class LLMCheckJudge:
    """Decides a case's expectations with an OpenAI-compatible model, verified in code (see the
    module docstring). `tools`: tool name -> the collection it searches."""

    def __init__(
        self,
        *,
        client: openai.AsyncOpenAI,
        model: str,
        tools: Mapping[str, str] | None = None,
        concurrency: int = 16,
        timeout: float = 60.0,
        max_retries: int = 3,
        structured: StructuredMode = "auto",
        product: str = "Kubeflow",
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        clock: Clock | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.model = model
        self.name = f"llm:{model}"
        self.prompt_version: str | None = prompts.prompt_version(TEMPLATES)
        self.tools: Mapping[str, str] = dict(tools or {})
        self.product = product
        retry = model_retry(max_retries, backoff_base, backoff_max, clock, budget)
        self.exchange = ChatExchange(
            client=client,
            model=model,
            retry=retry,
            concurrency=concurrency,
            timeout=timeout,
            structured=structured,
        )
        #: the instructions, the same bytes for every call (the prompt cache's prefix)
        self.system = prompts.render("check_system.j2", product=product)

    @property
    def usage(self) -> Usage:
        return self.exchange.usage

    async def aclose(self) -> None:
        await self.exchange.aclose()

    async def check(self, case: CheckCase, run: AgentRun) -> list[ExpectationCheck]:
        failed = _no_answer(case, run)
        if failed is not None:
            return failed
        exp = case.expected
        decided: dict[ExpectationName, ExpectationCheck] = {}
        asked: list[ModelAsked] = []
        for name in exp.names():
            if name == "must_cite":
                decided[name] = check_must_cite(exp.must_cite, run)
            elif name == "tool_behavior":
                found = check_tool_behavior(exp.tool_behavior or "", run, self.tools)
                if found is not None:
                    decided[name] = found
                else:
                    asked.append("tool_behavior")
            else:
                asked.append(name)
        findings = answer_findings(run)
        if asked:
            decided.update(await self._ask_model(case, run, asked, findings))
        return guarded([decided[n] for n in exp.names()], findings)

    async def _ask_model(
        self, case: CheckCase, run: AgentRun, asked: list[ModelAsked], findings: list[str]
    ) -> dict[ExpectationName, ExpectationCheck]:
        shown = self._render(case, run, asked)
        messages = [{"role": "system", "content": self.system}, {"role": "user", "content": shown.user}]
        usage = Usage()
        try:
            reply = await self._verified(messages, shown, usage)
        except JudgeRejected as ex:
            reason = one_line(str(ex), 200)
            return {n: ExpectationCheck(name=n, passed=None, evidence=f"undecided: {reason}") for n in asked}
        out: dict[ExpectationName, ExpectationCheck] = {}
        flagged = reply.injection_suspected
        for v in reply.verdicts:
            passed = {"pass": True, "fail": False, "unsure": None}[v.verdict]
            said = f'"{one_line(v.quote, 120)}" ' if v.quote.strip() else ""
            evidence = f"{said}({one_line(v.reasoning, 160)})"
            confidence: Confidence = v.confidence
            if flagged and passed is True:
                # the model saw text that tries to instruct it: its pass is not enough
                passed, confidence = None, "low"
                evidence = (
                    f"the model suspects an injection ({one_line(reply.injection_note, 80)}); {evidence}"
                )
            out[v.expectation] = ExpectationCheck(
                name=v.expectation,
                passed=passed,
                confidence=confidence,
                evidence=evidence[: EVIDENCE_CHARS * 2],
            )
        return out

    async def _verified(self, messages: list[dict[str, str]], shown: _Asked, usage: Usage) -> CheckReply:
        return await self.exchange.verified(
            "check",
            messages,
            CHECK_SCHEMA,
            CheckReply,
            lambda reply: check_problems(reply, shown.names, shown.answer),
            usage,
            what="the check reply",
        )

    def _render(self, case: CheckCase, run: AgentRun, asked: list[ModelAsked]) -> _Asked:
        nonce = prompts.new_nonce()

        def data(value: Any, limit: int) -> str:
            return prompts.encode(prompts.clean_value(value, limit, nonce))

        exp = case.expected
        expectations: list[dict[str, str]] = []
        for name in asked:
            value: Any
            if name == "correction":
                value = {"corrected_answer": exp.answer}
            elif name == "must_not_claim":
                value = {"claims": exp.must_not_claim}
            elif name == "decline":
                value = {"decline": True}
            else:
                value = {"tool_behavior": exp.tool_behavior}
            expectations.append({"name": name, "data": data(value, CAP_EXPECTATION)})
        answer = prompts.clean(run.answer or "", CAP_ANSWER, nonce)
        passages = []
        if "decline" in asked:
            for p in run.retrieved[:MAX_PASSAGES]:
                value = {"source": p.source_url or "", "collection": p.collection or "", "text": p.text}
                passages.append({"id": p.id, "data": data(value, CAP_PASSAGE)})
        calls = []
        if "tool_behavior" in asked and run.tool_calls is not None:
            for n, c in enumerate(run.tool_calls[:MAX_CALLS], start=1):
                value = {"tool": c.name, "collection": _collection(c, self.tools), "arguments": c.args}
                calls.append({"id": f"T{n}", "data": data(value, 500)})
        user = prompts.render(
            "check_user.j2",
            nonce=nonce,
            question=data(case.question, CAP_QUESTION),
            expectations=expectations,
            answer=prompts.encode(answer),
            sources=data(run.sources[:20], CAP_URL),
            passages=passages,
            show_calls="tool_behavior" in asked,
            calls=calls,
        )
        return _Asked(asked, answer, user)


# -- the registry ------------------------------------------------------------------------------------


def _offline(setup: JudgeSetup) -> OfflineCheckJudge:
    return OfflineCheckJudge(tools=setup.config.tools)


def _llm(setup: JudgeSetup) -> LLMCheckJudge:
    if not setup.model:
        raise ConfigError("the llm check judge needs a model: set TRIAGE_JUDGE_MODEL (and OPENAI_API_KEY)")
    client = openai.AsyncOpenAI(base_url=setup.base_url, api_key=setup.api_key or "unused", max_retries=0)
    return LLMCheckJudge(
        client=client,
        model=setup.model,
        tools=setup.config.tools,
        concurrency=setup.config.judge.concurrency,
        budget=setup.budget,
    )


#: the check judges by name (`triage check --judge`): a factory from the judges' setup
CHECK_JUDGES: dict[str, Callable[[JudgeSetup], CheckJudge]] = {
    "offline": _offline,
    "llm": _llm,
}
