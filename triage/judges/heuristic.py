"""The offline judge: facts from string evidence alone, no model, each with a confidence.

- **containment** (`retrieved_has_answer`, `index_has_answer`, `answer_collection`): a passage holds
  the answer when it covers the question's rare words (weighted by how few of the trace's passages
  hold each), helped by the answer's specifics when the retrieved passages hold them (most of them,
  with no clearly better passage elsewhere, settle it whatever the question's words); a much better
  re-searched passage the agent was not shown means its passages missed it; a re-searched passage
  without the subject the retrieved ones share is a lexical trap (`triage.judges.containment`);
- **grounding** (`answer_grounded`): every specific of the answer is in what the agent saw (the
  question's own, placeholders and arithmetic on shown numbers exempt), no `key: value` or negation
  contradicts a passage, no invisible character hides in a word, and most of the answer's words are
  the passages' words (`triage.judges.grounding`);
- **declining** (`answer_declined`): a decline phrase, in English or 21 other languages, or an
  English sentence that names the agent's sources and says they do not tell
  (`triage.judges.declines`).

Confidence is `high` only where the signal is clear-cut (measured on the evaluation set: see
bench/README.md), `medium` near a threshold, `low` where the heuristic is close to guessing; the
cascade judge escalates what is not `high`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from triage.domain.ports import JudgeRequest
from triage.domain.records import Evidence, Facts, Passage, Trace, Usage
from triage.domain.rule import Confidence
from triage.judges import containment as cont
from triage.judges import prompts
from triage.judges.declines import absence_cues, cue_phrases, declines, listed_phrases
from triage.judges.grounding import Grounding, answer_text, check, unsupported_specifics
from triage.judges.offline_text import looks_english, quotes_code, specifics

__all__ = ["HeuristicJudge", "Signals", "declines", "signals", "specifics", "unsupported"]

#: below this share of the answer's words found in what the agent saw, the answer is not grounded
PROSE_THRESHOLD = 0.65
#: from this share on (with two specifics checked, all seen), grounding is clear-cut
PROSE_CLEAR = 0.9


def unsupported(answer: str, seen: Sequence[str]) -> list[str]:
    """Specifics of `answer` that appear in none of the texts the agent saw."""
    return unsupported_specifics(answer, seen)[0]


def _seen(trace: Trace) -> list[str]:
    seen = [trace.question, *(c.output for c in trace.tool_calls), *(p.text for p in trace.passages)]
    seen += [p.title or "" for p in trace.passages]
    return seen + [p.source_url or "" for p in trace.passages]


@dataclass
class Signals:
    """What the cheap checks found; also used by the cascade judge."""

    containment: cont.Containment
    grounding: Grounding
    declined: bool
    decline_phrases: list[str]
    #: the phrases come from the phrase lists (not the cue check alone)
    decline_listed: bool = False

    @property
    def unsupported(self) -> list[str]:
        return [*self.grounding.unsupported, *self.grounding.contradictions]

    @property
    def grounded(self) -> bool:
        prose = self.grounding.prose_support
        weak_prose = not self.declined and prose is not None and prose < PROSE_THRESHOLD
        return self.grounding.grounded and not weak_prose


def signals(trace: Trace, research: list[Passage] | None) -> Signals:
    answer = answer_text(trace.answer)
    listed = listed_phrases(answer)
    phrases = listed or cue_phrases(answer)
    declined = bool(phrases)
    grounding = check(trace.answer, _seen(trace), [p.text for p in trace.passages], trace.question)
    counts = not declined and not grounding.empty
    found = cont.contain(trace.question, answer, trace.tool_calls, trace.passages, research, counts, declined)
    return Signals(found, grounding, declined, phrases, bool(listed))


_LEVELS: tuple[Confidence, ...] = ("low", "medium", "high")


def _band(distance: float, clear: float, near: float) -> Confidence:
    return "high" if distance >= clear else "medium" if distance >= near else "low"


def _more_of_a_retrieved_page(c: cont.Containment) -> bool:
    """Some re-searched passage the agent was not shown comes from a page it retrieved."""
    pages = {s.passage.source_url for s in c.retrieved if s.passage.source_url}
    return any(s.passage.source_url in pages and not c.shown(s.passage) for s in c.researched or [])


def _containment_facts(
    sig: Signals, question: str
) -> tuple[bool, bool | None, Passage | None, dict[str, Evidence]]:
    c = sig.containment
    retrieved = c.retrieved_holds
    index = c.index_holds
    holder: Passage | None = None
    if retrieved and c.retrieved_best:
        holder = c.retrieved_best.passage
    elif index and c.elsewhere_best:
        holder = c.elsewhere_best.passage
    r_best = c.retrieved_best
    r_note = f"best retrieved question coverage {r_best.coverage:.2f}" if r_best else "no retrieved passage"
    if c.answer_support is not None:
        r_note += f", answer specifics held {c.answer_support:.2f}"
    if c.elsewhere_best is not None:
        r_note += (
            f"; best re-searched elsewhere {c.elsewhere_best.coverage:.2f} ({c.elsewhere_best.passage.id})"
        )
    if c.outranked:
        r_note += ": a clearly better passage elsewhere"
    elif retrieved and c.retrieved_score < c.hold_threshold:
        r_note += ": the answer's specifics are theirs, and no passage elsewhere is clearly better"
    if not r_best:
        r_conf: Confidence = "high"
    elif c.outranked:
        r_conf = (
            _band(c.elsewhere_best.coverage - (r_best.coverage + cont.OUTRANK_MARGIN), 0.15, 0.05)
            if (c.elsewhere_best)
            else "low"
        )
        r_conf = "medium" if r_conf == "high" else r_conf
    elif retrieved:
        r_conf = _band(c.retrieved_score - c.hold_threshold, 0.3, 0.12)
        rival = c.elsewhere_best.coverage if c.elsewhere_best else 0.0
        if r_conf == "high" and rival >= r_best.coverage - cont.OUTRANK_MARGIN:
            r_conf = "medium"  # a passage elsewhere covers the question about as well
    else:
        # a miss is clear-cut only far below the threshold: paraphrase hides words, not the reverse
        r_conf = _band(cont.HOLD_THRESHOLD - c.retrieved_score, 0.45, 0.15)
        # ... and only where the question's words are what a page would say: a question quoting
        # its own code weighs the user's identifiers (`t1 = preprocess(shard=shard)`), and an answer
        # that is the passages' own words (grounded, no decline) may show they answer in other words
        faithful = sig.grounded and not sig.declined and sig.grounding.prose_support is not None
        if r_conf == "high" and (quotes_code(question) or faithful):
            r_conf = "medium"
    evidence = {
        "retrieved_has_answer": Evidence(
            passage_ids=[r_best.passage.id] if r_best else [], confidence=r_conf, note=r_note
        )
    }
    if index is not None:
        s_best = c.elsewhere_best
        score = c.index_score or 0.0
        if retrieved:
            i_conf = r_conf
            i_note = "the retrieved passages hold it"
        elif not c.researched:
            i_conf, i_note = "high", "the re-search found no passage"
        elif s_best is None:
            i_conf, i_note = "medium", "no re-searched passage beyond the retrieved ones holds their subject"
        else:
            i_conf = _band(abs(score - cont.INDEX_THRESHOLD), 0.3, 0.12)
            i_note = f"best re-searched question coverage elsewhere {score:.2f} ({s_best.passage.id})"
        trap = max((s.coverage for s in c.researched or [] if not s.on_topic), default=0.0)
        if not index and trap >= cont.INDEX_THRESHOLD:
            # the miss rests on the subject check: a passage without the subject covers the question
            i_conf = "medium" if i_conf == "high" else i_conf
            i_note += f"; {trap:.2f} by a passage without the subject the retrieved ones share"
        if not index and not retrieved:
            # the index holds the retrieved passages: "not in the index" is no surer than "not in them"
            i_conf = min(i_conf, r_conf, key=_LEVELS.index)
            if i_conf == "high" and _more_of_a_retrieved_page(c):
                # right page, wrong chunks: its other sections may answer in words the question lacks
                i_conf = "medium"
                i_note += "; the re-search found other sections of a page the agent retrieved"
        evidence["index_has_answer"] = Evidence(
            passage_ids=[holder.id] if holder else [], confidence=i_conf, note=i_note
        )
    return retrieved, (True if retrieved else index), holder, evidence


def _grounding_evidence(sig: Signals) -> Evidence:
    g = sig.grounding
    prose = g.prose_support
    prose_note = f"; {prose:.2f} of its words seen" if prose is not None else ""
    if g.empty:
        return Evidence(confidence="high", note="no answer")
    if g.unsupported:
        # high only where two signals agree: a harmless unseen token or two (a role name, a port
        # the agent knows) is common in a faithful answer, so unseen specifics alone say `high` only
        # when there are many, or when the prose is not the passages' either; an invisible
        # character inside a word is a defect by itself
        words = [s for s in g.unsupported if not s.isdigit()]
        corroborated = prose is not None and prose < PROSE_THRESHOLD
        # ... and never where most of its specifics were seen (a faithful answer with an example
        # value and a file named after the question is not invented)
        mostly_unseen = 2 * len(g.unsupported) >= g.checked
        sure = (
            bool(g.invisible)
            or len(words) >= 4
            or (len(words) >= 1 and len(g.unsupported) >= 2 and corroborated and mostly_unseen)
        )
        return Evidence(
            quotes=g.unsupported[:5],
            confidence="high" if sure else "medium",
            note=f"{len(g.unsupported)} of {g.checked} specifics seen nowhere by the agent{prose_note}",
        )
    if g.contradictions:
        return Evidence(
            quotes=g.contradictions[:5], confidence="medium", note=f"contradicts a passage{prose_note}"
        )
    if not sig.grounded:
        return Evidence(confidence="low", note=f"every specific seen, but few of its words{prose_note}")
    # an example the passages give, filled in with the question's values, may be the wrong example
    clear = g.checked >= 3 and prose is not None and prose >= PROSE_CLEAR and not g.filled
    filled_note = (
        f"; the passages' example filled in with the question's values ({g.filled[0]})" if g.filled else ""
    )
    return Evidence(
        confidence="high" if clear else "medium" if prose is None or prose >= 0.75 else "low",
        note=f"all {g.checked} specifics seen{prose_note}{filled_note}",
    )


def _decline_evidence(sig: Signals, trace: Trace) -> Evidence:
    if sig.grounding.empty:
        return Evidence(confidence="high", note="no answer")
    if sig.declined:
        english = looks_english(trace.answer)
        # a decline that goes on to offer specifics it never saw is a hedge, not a clean decline; one
        # found by cues alone (no listed phrase) may be a claim that happens to name the docs
        listed = sig.decline_listed
        return Evidence(
            quotes=sig.decline_phrases[:3],
            confidence="high" if english and listed and not sig.grounding.unsupported else "medium",
            note="a decline phrase" if listed else "a sentence naming its sources says they do not tell",
        )
    substantive = len(specifics(trace.answer)) >= 1 and len(trace.answer) >= 80
    # "it covers the variables, but nothing about TLS": an absence named without the sources is
    # no decline the checks see, and perhaps one they miss
    absent = absence_cues(answer_text(trace.answer))
    note = f"no decline phrase; says something is not told ({absent[0]})" if absent else "no decline phrase"
    # the phrase lists of other languages are thinner than English's: no phrase there is no sure sign
    sure = substantive and not absent and looks_english(trace.answer)
    return Evidence(confidence="high" if sure else "medium", note=note)


class HeuristicJudge:
    """Facts from question coverage, answer specifics and decline phrases. Needs no model."""

    name = "heuristic"
    prompt_version: str | None = "heuristic-3"
    needs_research = True
    #: grounding is free here (no model call), so a request's `grounding=False` changes nothing
    can_skip_grounding = False

    def __init__(self) -> None:
        self.usage = Usage()

    async def aclose(self) -> None:
        """Nothing to release."""

    async def judge(self, request: JudgeRequest) -> Facts:
        trace, research = request.trace, request.research
        sig = signals(trace, research)
        retrieved, in_index, holder, evidence = _containment_facts(sig, trace.question)
        if not looks_english(trace.question):
            # coverage of a question not in English rests on its Latin-script words and the agent's
            # queries: a proxy, never clear-cut
            for name in ("retrieved_has_answer", "index_has_answer"):
                if name in evidence and evidence[name].confidence == "high":
                    evidence[name] = evidence[name].model_copy(update={"confidence": "medium"})
        evidence["answer_grounded"] = _grounding_evidence(sig)
        evidence["answer_declined"] = _decline_evidence(sig, trace)
        facts = request.base.model_copy(
            update={
                "retrieved_has_answer": retrieved,
                "index_has_answer": in_index,
                "answer_collection": holder.collection if holder and in_index else None,
                "answer_grounded": sig.grounded,
                "answer_declined": sig.declined and not sig.grounding.empty,
                "unsupported_claims": sig.unsupported,
                "answer_sources": [holder.source_url] if holder and in_index and holder.source_url else [],
                "evidence": evidence,
            }
        )
        return prompts.flag(facts, prompts.trace_findings(trace, research, request.comment))
