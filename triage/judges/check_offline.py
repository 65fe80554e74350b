"""The offline check judge (`OfflineCheckJudge`, no model): a regression case's expectations
decided on string evidence alone, `passed=None` where strings cannot be sure (see
`triage.judges.CHECK_JUDGES` for the overview).

- `correction` (the answer states the correction): a `key: value` given otherwise fails (high); a
  value missing fails (high for two or more, or all, else medium: one may be reworded); a small
  count the correction gives a name, said otherwise beside it, fails (medium). Every value there, in
  an English answer to a correction that negates nothing, and no sentence holding one negates,
  hedges ("only", "even", "Note", "may", "instead"...) or turns it (the opposite of a correction's
  word: "after" for its "before"): passes (medium); such a sentence is for a person.
- `answers` (the answer answers): a decline phrase (`check_evidence.decline_cues`: the shared lists
  and cues, and the other languages' cues read here) with nothing of its own beside it fails
  (high); one that opens and closes on the decline, with only the docs' neighbourhood between,
  fails (medium); an answer that also states values of its own is a partial answer (undecided).
  No decline and values of its own (specifics, numbers, code beyond the question's) passes (high
  in English, medium otherwise or beside an absence it names); prose alone passes on eight content
  words (medium); an apology or little of its own is undecided.
- `rests_on` (the answer rests on a passage of a `must_cite` page): no answer fails as `answers`
  does; a page neither retrieved nor cited fails, one cited but not shown is undecided; a `key:
  value` the page gives otherwise fails (medium); the answer's values (links aside) on the page,
  half or more of them, none seen nowhere, passes (medium); anything else is undecided (whether a
  sentence's prose contradicts the page, "0 means sequential", is meaning).
- values are read as values only: words joined by a slash in prose (`Katib/Trainer`) are none, a
  correction's number words are no required value (they count against an answer that gives the
  same name another small count: `counted_otherwise`), a link with or without its scheme to the
  project's hosts is a pointer, a UI path (`Export → CSV`) is a specific.
- a forbidden claim is made again only through its anchors (a claim without any is never made again
  by its words): code spans (an expression's names and values one by one), specifics, paths and
  numbers (needed to make it again, never enough to reject it or to find it gone), proper names;
  an anchor is found in code or prose alike (a plain word the claim also uses as a word, `password`,
  only as code), and a sentence's polarity is its anchors' clause's ("deprecated" disowns).
- a run whose text tries to steer the judge (the question, the answer, the sources, the passages,
  the tool arguments: `check_evidence.answer_findings`, as the LLM judge reads them) has no pass
  decided by its words: each becomes undecided (`check_evidence.guarded`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from triage.domain.checks import AgentRun, CheckCase, ExpectationCheck
from triage.domain.records import Confidence, Usage
from triage.judges.offline.check_evidence import (
    answer_findings,
    check_must_cite,
    check_tool_behavior,
    digits_in,
    guarded,
    holds,
    is_pointer,
    no_answer,
    numbers_in,
    page_of,
    prose_sentences,
    quote,
    run_hosts,
    seen_texts,
    unticked,
)
from triage.judges.offline.claims import (
    PLACEHOLDER_VALUE,
    SLASHED_WORDS,
    TURN,
    correction_values,
    counted_otherwise,
    is_negative,
    offline_claim,
    turned_values,
    unseen_menus,
)
from triage.judges.offline.contradictions import pairs, value_contradictions
from triage.judges.offline.declines import absence_cues, decline_cues, listed_phrases
from triage.judges.offline.grounding import unsupported_specifics
from triage.judges.offline.text import (
    fenced_code,
    looks_english,
    specifics,
    squash,
    word_set,
)


def offline_correction(correction: str, case: CheckCase, run: AgentRun) -> ExpectationCheck:
    answer = run.answer or ""
    if not answer.strip():
        return ExpectationCheck(
            name="correction", passed=False, confidence="high", evidence="the answer is empty"
        )
    asked = squash(unticked(case.question))
    have = squash(unticked(answer))
    required = [s for s in correction_values(correction) if not holds(asked, s)]
    # the correction's numbers are those it writes in digits; the answer's, in digits or words
    numbers = sorted(digits_in(unticked(correction)) - numbers_in(case.question))
    answer_numbers = numbers_in(unticked(answer))
    missing = [s for s in required if not holds(have, s)]
    numbers = [n for n in numbers if not any(n == squash(s) for s in required)]
    missing += [n for n in numbers if n not in answer_numbers]
    theirs = {
        key: values
        for key, values in pairs(unticked(correction)).items()
        if not any(PLACEHOLDER_VALUE.fullmatch(v) for v in values)
    }
    swapped = [
        f"{key}: {sorted(values)[0]} (the correction: {sorted(theirs[key])[0]})"
        for key, values in pairs(unticked(answer)).items()
        if key in theirs and not values & theirs[key]
    ]
    if swapped:
        return ExpectationCheck(
            name="correction",
            passed=False,
            confidence="high",
            evidence=quote("contradicts the correction: " + "; ".join(swapped)),
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
            evidence=quote(f"the answer does not state {', '.join(missing[:4])} of the correction"),
        )
    counted = counted_otherwise(correction, case.question, answer)
    if counted:
        return ExpectationCheck(
            name="correction",
            passed=False,
            confidence="medium",
            evidence=quote(counted),
        )
    stated = len(required) + len(numbers)
    if stated == 0:
        return ExpectationCheck(
            name="correction", passed=None, evidence="the correction states no value strings can look for"
        )
    values = [*required, *numbers]
    turned = turned_values(correction, values, answer)
    if turned is None and looks_english(answer) and not is_negative(correction):
        # every value is there and no sentence holding one turns it (a negation, a hedge, the
        # opposite of a word the correction uses): a restatement, in other words or another order
        return ExpectationCheck(
            name="correction",
            passed=True,
            confidence="medium",
            evidence=quote(
                f"states the correction's {stated} values ({', '.join(values[:4])}), and no sentence holding"
                " them negates, hedges or turns them"
            ),
        )
    # whether such a sentence contradicts the correction ("start_step is only advisory") or says
    # something beside it ("it never stops a Trial before four reports") is meaning, not strings
    return ExpectationCheck(
        name="correction",
        passed=None,
        evidence=quote(
            f"states the correction's {stated} values ({', '.join(values[:4])}); whether the"
            " rest contradicts it is for a person or a model"
            + (f" ({turned})" if turned else "")
        ),
    )


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
            evidence=quote(f"{f.claim!r}: {f.evidence}"),
        )
    if open_:
        f = open_[0]
        return ExpectationCheck(
            name="must_not_claim", passed=None, evidence=quote(f"{f.claim!r}: {f.evidence}")
        )
    return ExpectationCheck(
        name="must_not_claim",
        passed=True,
        confidence="medium",
        evidence=quote("; ".join(f"{f.claim[:60]!r}: {f.evidence}" for f in found)),
    )


def offline_decline(case: CheckCase, run: AgentRun) -> ExpectationCheck:
    """A decline phrase and no invented specific. Invented specifics fail the case whether or not a
    decline comes before them (a decline that then invents, or no decline at all)."""
    answer = run.answer or ""
    if not answer.strip():
        return ExpectationCheck(
            name="decline", passed=False, confidence="high", evidence="the answer is empty"
        )
    phrases = decline_cues(answer)
    said = f'declines ("{phrases[0]}"), then gives' if phrases else "gives"
    if run.retrieved or run.tool_calls is not None:
        invented, _ = unsupported_specifics(answer, seen_texts(case, run), case.question)
        # a link the answer points to, with its scheme or without (`github.com/kubeflow/trainer`), is
        # where to look, not an answer
        hosts = run_hosts(case, run)
        # words joined by a slash in prose ("request/response") are no value (as in a correction)
        spans = re.findall(r"`([^`\n]+)`", answer)
        invented = [
            s
            for s in invented
            if not is_pointer(s, hosts) and not (SLASHED_WORDS.fullmatch(s) and not any(s in c for c in spans))
        ]
        invented += unseen_menus(answer, seen_texts(case, run))
        if len(invented) == 1:
            # one unseen specific may be a harmless name the agent knows (as the offline triage
            # judge's grounding holds): not enough to fail a decline, nor to pass it
            return ExpectationCheck(
                name="decline",
                passed=None,
                evidence=quote(f"{said} one specific no retrieved passage holds: `{invented[0]}`"),
            )
        if invented:
            return ExpectationCheck(
                name="decline",
                passed=False,
                confidence="high",
                evidence=quote(
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
                evidence=quote(f'no decline phrase, but it says something is not told ("{absent[0]}")'),
            )
        return ExpectationCheck(
            name="decline",
            passed=False,
            confidence="high" if looks_english(answer) else "medium",
            evidence="no sentence says the documentation does not cover it",
        )
    turn = TURN.search(answer)
    if turn:
        # "the docs don't cover it, but you can ...": a recipe in words (a menu, steps) holds no
        # specific for strings to catch, so the decline is not sure to stop at the gap
        return ExpectationCheck(
            name="decline",
            passed=None,
            evidence=quote(f'declines ("{phrases[0]}"), then turns to a way of its own ("{turn.group(0)}")'),
        )
    listed = bool(listed_phrases(answer))
    return ExpectationCheck(
        name="decline",
        passed=True,
        confidence="high" if listed else "medium",
        evidence=quote(f'declines ("{phrases[0]}"); every specific it gives is in what it retrieved'),
    )


# -- answers: the answer answers, it does not decline ---------------------------------------------------

#: a sentence that only says where the answer comes from or where to look ("Source: ...", "See ...")
_SOURCE_LINE = re.compile(
    r"^(?:sources?|references?|see(?: also)?|quellen?|siehe|voir|ver|veja|vedi|fuentes?|fontes?|fonti|参考|参照|出典"
    r"|来源|來源)\b\s*[:：]?",
    re.IGNORECASE,
)
#: an apology or a refusal the decline lists do not hold ("Sorry, ...", "Unfortunately ..."): on an
#: answer with nothing else in it, a decline strings may miss
_SOFT_REFUSAL = re.compile(
    r"\b(?:sorry|unfortunately|apologi[sz]e|unable|cannot help|can't help|outside (?:the scope|what)"
    r"|leider|malheureusement|désolé|lamentablemente|lo siento|infelizmente|desculpe|purtroppo)\b"
    r"|抱歉|很遗憾|遗憾|申し訳|残念",
    re.IGNORECASE,
)
#: an answer with no decline cue and no value of its own passes on this many content words
ANSWER_WORDS = 8


@dataclass(frozen=True)
class AnswerReading:
    """An answer read for whether it answers: its decline phrases, its declining sentences and its
    other sentences (source lines and bare links aside), the values those state (specifics and
    numbers beyond the question's, links aside), its language, an apology, an absence it names."""

    declines: tuple[str, ...]
    declining: tuple[str, ...]
    answering: tuple[str, ...]
    values: tuple[str, ...]
    english: bool
    soft: bool
    absent: tuple[str, ...]
    first: str
    last_declines: bool

    @property
    def lead_declines(self) -> bool:
        """It opens on a decline (or says nothing else)."""
        return bool(self.declining) and (not self.answering or self.declining[0] == self.first)


def read_answer(case: CheckCase, run: AgentRun) -> AnswerReading:
    """`run`'s answer read sentence by sentence (see `AnswerReading`)."""
    answer = run.answer or ""
    hosts = run_hosts(case, run)
    sentences = [s for s in prose_sentences(answer) if not _SOURCE_LINE.match(s) and not is_pointer(s, hosts)]
    declining = [s for s in sentences if decline_cues(s)]
    answering = [s for s in sentences if s not in declining]
    asked = squash(unticked(case.question))
    values: list[str] = []
    for s in answering:
        values += [v for v in specifics(s) if not is_pointer(v, hosts) and not holds(asked, v)]
        values += sorted(digits_in(unticked(s)) - numbers_in(case.question))
    values += [v for block in fenced_code(answer) for v in specifics(block) if not holds(asked, v)]
    return AnswerReading(
        declines=tuple(decline_cues(answer)),
        declining=tuple(declining),
        answering=tuple(answering),
        values=tuple(dict.fromkeys(values)),
        english=looks_english(answer),
        soft=bool(_SOFT_REFUSAL.search(answer)),
        absent=tuple(absence_cues(answer)),
        first=sentences[0] if sentences else "",
        last_declines=bool(sentences) and sentences[-1] in declining,
    )


def _prose_of(sentence: str) -> str:
    return re.sub(r"\s+", " ", sentence)


def _content_words(sentences: Sequence[str], question: str) -> int:
    return len(word_set(unticked(" ".join(sentences))) - word_set(question))


def offline_answers(case: CheckCase, run: AgentRun) -> ExpectationCheck:
    """The answer answers: no decline, and something of its own (values, steps, or sentences of
    prose); a decline with nothing else fails; an answer that partly declines is for a person."""
    answer = run.answer or ""
    if not answer.strip():
        return ExpectationCheck(name="answers", passed=False, confidence="high", evidence="the answer is empty")
    r = read_answer(case, run)
    words = _content_words(r.answering, case.question)
    if r.declines:
        said = f'declines ("{r.declines[0]}")'
        if not r.answering or (not r.values and words < ANSWER_WORDS):
            return ExpectationCheck(
                name="answers",
                passed=False,
                confidence="high",
                evidence=quote(f"{said} and says nothing else of its own"),
            )
        if r.lead_declines and r.last_declines:
            # it opens and closes on the decline: what is between is the docs' neighbourhood,
            # not the answer ("I couldn't find this ... the guide covers X ... so I can't confirm")
            return ExpectationCheck(
                name="answers",
                passed=False,
                confidence="medium",
                evidence=quote(f"{said} first and last; the rest says what the docs cover around it"),
            )
        return ExpectationCheck(
            name="answers",
            passed=None,
            evidence=quote(f"{said}, and also states {', '.join(r.values[:3]) or 'more'}: a partial answer"),
        )
    if r.absent and (not r.values or any(a in _prose_of(r.first) for a in r.absent)):
        # "it covers X, but nothing about Y": an answer that opens on what is not told, or has
        # nothing else, may be a decline the phrase lists miss
        return ExpectationCheck(
            name="answers",
            passed=None,
            evidence=quote(f'no decline phrase, but it says something is not told ("{r.absent[0]}")'),
        )
    if r.values and not r.soft:
        # a "does not contain" inside an answer with values of its own is a fact it states
        return ExpectationCheck(
            name="answers",
            passed=True,
            confidence="high" if r.english and not r.absent else "medium",
            evidence=quote(f"no decline; it states {', '.join(r.values[:4])}"),
        )
    if words >= ANSWER_WORDS and r.english and not r.soft:
        return ExpectationCheck(
            name="answers",
            passed=True,
            confidence="medium",
            evidence=quote(f"no decline; it answers in prose: \"{r.answering[0]}\""),
        )
    return ExpectationCheck(
        name="answers",
        passed=None,
        evidence=quote("no decline phrase, but little of its own" + (" and an apology" if r.soft else "")),
    )


# -- rests_on: the answer rests on a passage of the page the case names -----------------------------------


def offline_rests_on(case: CheckCase, run: AgentRun) -> ExpectationCheck:
    """The answer's values are in the text of a `must_cite` page the run retrieved, and none of them
    is one the page gives otherwise; a decline, or a value the page states otherwise, fails; a page
    cited only (its text not shown), or an answer with no value strings can look for, is undecided."""
    answer = run.answer or ""
    if not answer.strip():
        return ExpectationCheck(name="rests_on", passed=False, confidence="high", evidence="the answer is empty")
    wanted = {page_of(u) for u in case.expected.must_cite}
    page = [p.text for p in run.retrieved if p.source_url and page_of(p.source_url) in wanted and p.text.strip()]
    said = offline_answers(case, run)
    if said.passed is False:
        return ExpectationCheck(
            name="rests_on",
            passed=False,
            confidence=said.confidence,
            evidence=quote(f"it does not answer from the page: {said.evidence}"),
        )
    if not page:
        retrieved = [p for p in run.retrieved if p.source_url and page_of(p.source_url) in wanted]
        cited = [u for u in [*run.sources, *specifics(answer)] if is_pointer(u) and page_of(u) in wanted]
        if not retrieved and not cited and (run.retrieved or run.tool_calls is not None or run.sources):
            return ExpectationCheck(
                name="rests_on",
                passed=False,
                confidence="high",
                evidence=quote(f"the run neither retrieved nor cites {case.expected.must_cite[0]}"),
            )
        return ExpectationCheck(
            name="rests_on", passed=None, evidence="the page's text is not in the run (cited, not shown)"
        )
    seen = seen_texts(case, run)
    swapped = value_contradictions(answer, page, seen, case.question)
    if swapped:
        return ExpectationCheck(
            name="rests_on",
            passed=False,
            confidence="medium",
            evidence=quote("states a value the page gives otherwise: " + "; ".join(swapped[:2])),
        )
    if said.passed is None:
        return ExpectationCheck(name="rests_on", passed=None, evidence=quote(f"{said.evidence}"))
    hosts = run_hosts(case, run)
    off_page, checked = unsupported_specifics(answer, [case.question, *page], case.question)
    # a link is where to look, no value: it is checked, found or not, and counts for neither
    asked = squash(case.question)
    links = [s for s in specifics(answer) if is_pointer(s, hosts) and squash(s) not in asked]
    checked -= len(links)
    off_page = [s for s in off_page if not is_pointer(s, hosts)]
    nowhere = [s for s in unsupported_specifics(answer, seen, case.question)[0] if not is_pointer(s, hosts)]
    on_page = checked - len(off_page)
    if checked == 0 or on_page <= 0:
        return ExpectationCheck(
            name="rests_on",
            passed=None,
            evidence=quote("none of the answer's values is on the page: strings cannot say what it rests on"),
        )
    if nowhere:
        return ExpectationCheck(
            name="rests_on",
            passed=None,
            evidence=quote(f"{on_page} of its values are on the page, but {', '.join(nowhere[:3])} nowhere it saw"),
        )
    if on_page * 2 < checked:
        return ExpectationCheck(
            name="rests_on",
            passed=None,
            evidence=quote(f"only {on_page} of its {checked} values are on the page (the rest on other pages)"),
        )
    return ExpectationCheck(
        name="rests_on",
        passed=True,
        confidence="medium",
        evidence=quote(f"{on_page} of its {checked} values are on the page, none given otherwise there"),
    )


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
        failed = no_answer(case, run)
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
            elif name == "answers":
                out.append(offline_answers(case, run))
            elif name == "rests_on":
                out.append(offline_rests_on(case, run))
            else:
                found = check_tool_behavior(exp.tool_behavior or "", run, self.tools)
                out.append(
                    found
                    or ExpectationCheck(
                        name="tool_behavior",
                        passed=None,
                        evidence=quote(f"names no tool or collection code can read: {exp.tool_behavior}"),
                    )
                )
        # the question too, as the LLM judge reads it: a flagged question leaves every pass to a person
        return guarded(out, answer_findings(run, case.question))

