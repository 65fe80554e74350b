"""The offline judge: facts from string evidence alone, no model, each with a confidence.

- **containment** (`retrieved_has_answer`, `index_has_answer`, `answer_collection`): a passage holds
  the answer when it covers the question's rare words (weighted by how few of the trace's passages
  hold each), helped by the answer's specifics when the retrieved passages hold them (most of them,
  with no clearly better passage elsewhere, settle it whatever the question's words); a much better
  re-searched passage the agent was not shown means its passages missed it; a re-searched passage
  without the subject the retrieved ones share is a lexical trap (`contain`, below);
- **grounding** (`answer_grounded`): every specific of the answer is in what the agent saw (the
  question's own, placeholders and arithmetic on shown numbers exempt), no `key: value` or negation
  contradicts a passage, no invisible character hides in a word, and most of the answer's words are
  the passages' words (`triage.judges.offline.grounding`);
- **declining** (`answer_declined`): a decline phrase, in English or 21 other languages, or an
  English sentence that names the agent's sources and says they do not tell
  (`triage.judges.offline.text`).

Confidence is `high` only where the signal is clear-cut (measured on the evaluation set: see
bench/README.md), `medium` near a threshold, `low` where the heuristic is close to guessing; the
cascade judge escalates what is not `high`, and a verdict is *sure* only when every fact its layer
rests on is `high` (`RulePath.sure`). Clear-cut means two signals agree, and never where the
heuristic's failure classes live:

- support counts only from **the passages that answer** (the retrieved ones that cover the question
  best, `Containment.answering`) or a run of words the answer quotes from a passage: a value the
  agent saw only in another passage leaves grounding `medium`, and a contradiction those passages
  make (another value for a key, a negated statement, a restriction the answer goes beyond) makes
  the answer surely ungrounded;
- a miss by a clearly better passage elsewhere (one the index holds, `CLEAR_OUTRANK` better than the
  agent's best, whether or not it reaches the score that outranks a retrieved passage) is sure where
  the answer did not take its specifics from the agent's passages, or where the better passage is on
  a page the agent never retrieved; so is "the index holds it", on that passage;
  a hold is sure where the answer is surely grounded in the best passage, which covers the question;
- never sure: support by paraphrase alone, a question not in English, a trace whose agent read an
  instruction planted for it (its passages, tool outputs, question or answer).

Containment: which passage holds the answer, retrieved (R) or re-searched (S)?

Topical overlap is not containment, so a passage is scored on what the question needs, weighted
by how rare each need is among the trace's own passages:

- **question coverage**: the inverse-document-frequency weighted share of the question's content
  words a passage holds. A word every passage shares weighs little; a word no passage holds
  weighs most, which is what makes a content gap visible (nothing holds "TPU"). A question not in
  English is read through its Latin-script words and the agent's own search queries, since the
  docs are English.
- **answer support**: the share of the answer's specifics (question's own left out) that the
  retrieved passages hold, for an answer that does not decline. An answer whose specifics are
  the passages' is evidence the passages answer; it adds to the best retrieved coverage, and where
  most of them are the passages' and no passage elsewhere is clearly better, it settles it
  (`SUPPORT_HOLD`): the user's words need not be the docs' words.
- **a better passage elsewhere**: the best re-searched passage the agent was not shown (another
  page, or another section of a page it retrieved), covering the question clearly better than the
  best retrieved passage, means the agent's passages missed the answer (a retrieval or routing miss).
- **the subject**: the question's words that the retrieved passages hold are what the agent's search
  did find. A re-searched passage that holds the question's rare words but not half of those is a
  lexical trap (an unrelated page that says "email" or "timeout"), and counts neither for the index
  nor as a better passage elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from triage.domain.ports import JudgeRequest
from triage.domain.records import Confidence, Evidence, Facts, Passage, Trace, Usage
from triage.judges import guard
from triage.judges.offline.containment import (
    CLEAR_OUTRANK,
    CLEAR_OUTRANK_LEANING,
    GROUNDED_HOLD,
    HOLD_CLEAR,
    HOLD_THRESHOLD,
    INDEX_CLEAR,
    INDEX_THRESHOLD,
    MISS_CLEAR,
    OUTRANK_MARGIN,
    Containment,
    contain,
)
from triage.judges.offline.declines import absence_cues, cue_phrases, declines, listed_phrases
from triage.judges.offline.grounding import Grounding, answer_text, check, unsupported_specifics
from triage.judges.offline.text import (
    looks_english,
    quotes_code,
    specifics,
)

__all__ = ["HeuristicJudge", "Signals", "declines", "signals", "specifics", "unsupported"]

#: below this share of the answer's words found in what the agent saw, the answer is not grounded
PROSE_THRESHOLD = 0.65
#: from this share on (with two specifics checked, all seen), grounding is clear-cut
PROSE_CLEAR = 0.9
#: a clean decline is surely grounded when at least this share of its other words were seen
DECLINE_PROSE = 0.5
#: words that guess beyond what was found
_GUESSING = re.compile(
    r"\b(?:typically|usually|normally|probably|likely|presumably|i think|i believe|i guess|i'd guess"
    r"|should work|might work|in most cases)\b",
    re.IGNORECASE,
)


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

    containment: Containment
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
    counts = not declined and bool(trace.answer.strip())
    found = contain(trace.question, answer, trace.tool_calls, trace.passages, research, counts, declined)
    answering = [f"{p.title or ''}\n{p.text}\n{p.source_url or ''}" for p in found.answering]
    passages = [p.text for p in trace.passages]
    grounding = check(trace.answer, _seen(trace), passages, trace.question, answering=answering)
    return Signals(found, grounding, declined, phrases, bool(listed))


_LEVELS: tuple[Confidence, ...] = ("low", "medium", "high")


def _unsure(evidence: dict[str, Evidence], why: str) -> dict[str, Evidence]:
    """`evidence` with every `high` made `medium`, the reason noted."""
    return {
        name: held.model_copy(update={"confidence": "medium", "note": f"{held.note or ''}; {why}".lstrip("; ")})
        if held.confidence == "high"
        else held
        for name, held in evidence.items()
    }


def _band(distance: float, clear: float, near: float) -> Confidence:
    return "high" if distance >= clear else "medium" if distance >= near else "low"


def _more_of_a_retrieved_page(c: Containment) -> bool:
    """Some re-searched passage the agent was not shown comes from a page it retrieved."""
    pages = {s.passage.source_url for s in c.retrieved if s.passage.source_url}
    return any(s.passage.source_url in pages and not c.shown(s.passage) for s in c.researched or [])


def _better_on_a_retrieved_page(c: Containment) -> bool:
    """The best passage elsewhere is another section of a page the agent retrieved."""
    best = c.elsewhere_best
    pages = {s.passage.source_url for s in c.retrieved if s.passage.source_url}
    return best is not None and best.passage.source_url in pages


def _clear_miss(c: Containment) -> bool:
    """A passage elsewhere covers the question far better than the agent's best (`CLEAR_OUTRANK`), and
    the answer did not take its specifics from the agent's passages (an answer that did may have found
    the answer there in other words); or, where it did, the better passage is on a page the agent
    never retrieved, by a wider margin (another section of its own page may say what its chunk said
    in other words). Two signals agree that the agent's passages missed it."""
    if c.outrank_margin >= CLEAR_OUTRANK and not c.leans_on_retrieved:
        return True
    return c.outrank_margin >= CLEAR_OUTRANK_LEANING and not _better_on_a_retrieved_page(c)


def _containment_facts(
    sig: Signals, question: str, grounded_there: bool = False
) -> tuple[bool, bool | None, Passage | None, dict[str, Evidence]]:
    """The containment facts and their evidence. `grounded_there`: the answer is surely grounded in
    the passages that answer (every specific and nearly every word theirs), a second signal that the
    best retrieved passage holds the answer."""
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
        # a miss is clear-cut where two signals agree (`_clear_miss`)
        r_conf = _band(c.outrank_margin - OUTRANK_MARGIN, 0.15, 0.05)
        r_conf = "high" if _clear_miss(c) else "medium" if r_conf == "high" else r_conf
    elif retrieved:
        r_conf = _band(c.retrieved_score - c.hold_threshold, HOLD_CLEAR, 0.12)
        rival = c.elsewhere_best.coverage if c.elsewhere_best else 0.0
        if r_conf == "high" and rival >= r_best.coverage - OUTRANK_MARGIN:
            r_conf = "medium"  # a passage elsewhere covers the question about as well
        if grounded_there and r_best.coverage >= GROUNDED_HOLD:
            # the passage that covers the question best is where the answer's specifics and words
            # come from: two signals agree (an answer grounded in a page that covers the question
            # poorly may have answered another question, a wrong page's)
            r_conf = "high"
            r_note += "; the answer is grounded in it"
    else:
        # a miss is clear-cut only far below the threshold: paraphrase hides words, not the reverse
        r_conf = _band(HOLD_THRESHOLD - c.retrieved_score, MISS_CLEAR, 0.15)
        # ... and only where the question's words are what a page would say: a question quoting
        # its own code weighs the user's identifiers (`t1 = preprocess(shard=shard)`), and an answer
        # that is the passages' own words (grounded, no decline) may show they answer in other words
        faithful = sig.grounded and not sig.declined and sig.grounding.prose_support is not None
        if r_conf == "high" and (quotes_code(question) or faithful):
            r_conf = "medium"
        if index and _clear_miss(c):
            # a passage elsewhere that the index holds (below the score that outranks a passage,
            # `HOLD_THRESHOLD`, above the index's) covers the question far better: the same two
            # signals as an outranking passage's
            r_conf = "high"
            r_note += ": a far better passage elsewhere"
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
            i_conf = _band(abs(score - INDEX_THRESHOLD), INDEX_CLEAR, 0.12)
            if index and c.outrank_margin >= CLEAR_OUTRANK:
                # it covers the question far better than anything the agent was shown (whether or
                # not it reaches the score that outranks a retrieved passage)
                i_conf = "high"
            i_note = f"best re-searched question coverage elsewhere {score:.2f} ({s_best.passage.id})"
        trap = max((s.coverage for s in c.researched or [] if not s.on_topic), default=0.0)
        if not index and trap >= INDEX_THRESHOLD:
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


def _grounding_evidence(sig: Signals, answer: str = "") -> Evidence:
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
        # the passages that answer say otherwise themselves (another value for the same key, the
        # statement negated, a restriction the answer goes beyond): a conflict, not a missing token
        return Evidence(
            quotes=g.contradictions[:5],
            confidence="high" if g.against_answering else "medium",
            note=f"contradicts {'a passage that answers' if g.against_answering else 'a passage'}{prose_note}",
        )
    if not sig.grounded:
        return Evidence(confidence="low", note=f"every specific seen, but few of its words{prose_note}")
    if g.outside:
        # seen, but only in passages that do not answer: a token seen somewhere is no support (a
        # value from another page may be the wrong one for this question)
        return Evidence(
            confidence="medium" if prose is None or prose >= 0.75 else "low",
            note=f"all {g.checked} specifics seen, {len(g.outside)} only outside the passages that answer "
            f"({g.outside[0]}){prose_note}",
        )
    # an example the passages give, filled in with the question's values, may be the wrong example;
    # a term the passages deny and the answer states may be a flipped polarity
    clear = g.checked >= 3 and prose is not None and prose >= PROSE_CLEAR and not g.filled and not g.affirmed
    # a clean decline (a listed phrase, in English) whose other words are the passages': it claims
    # nothing the passages do not say. One that guesses on ("typically around 100m") is the
    # "the docs don't say, but ..." answer, an invention after all
    clean_decline = (
        sig.declined
        and sig.decline_listed
        and looks_english(answer)
        and (prose is None or prose >= DECLINE_PROSE)
        and not _GUESSING.search(answer)
    )
    filled_note = (
        f"; the passages' example filled in with the question's values ({g.filled[0]})" if g.filled else ""
    )
    decline_note = "; a decline that claims nothing else" if clean_decline and not clear else ""
    affirmed_note = f"; states what a passage denies ({', '.join(g.affirmed[:3])})" if g.affirmed else ""
    return Evidence(
        confidence="high" if clear or clean_decline else "medium" if prose is None or prose >= 0.75 else "low",
        note=f"all {g.checked} specifics seen{prose_note}{filled_note}{decline_note}{affirmed_note}",
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
        grounded = _grounding_evidence(sig, trace.answer)
        grounded_there = sig.grounded and not sig.declined and grounded.confidence == "high"
        retrieved, in_index, holder, evidence = _containment_facts(sig, trace.question, grounded_there)
        if not looks_english(trace.question):
            # coverage of a question not in English rests on its Latin-script words and the agent's
            # queries: a proxy, never clear-cut
            for name in ("retrieved_has_answer", "index_has_answer"):
                if name in evidence and evidence[name].confidence == "high":
                    evidence[name] = evidence[name].model_copy(update={"confidence": "medium"})
        evidence["answer_grounded"] = grounded
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
        # the agent's own context (its passages, tool outputs, the question) and its answer apart
        # from the re-search and the comment: an instruction planted where the agent read it may
        # have steered the answer itself, so no fact of such a trace is sure
        steered = guard.trace_findings(trace, None, None)
        if steered:
            facts = facts.model_copy(update={"evidence": _unsure(facts.evidence, "injection in what the agent read")})
        others = guard.injection_findings([("comment", request.comment)]) + guard.passage_findings(research or [])
        return guard.flag(facts, steered + others)


