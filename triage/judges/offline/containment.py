"""Containment: which passages hold the answer to a question, the agent's retrieved ones or others the index has.

Each passage is scored by how much of the question it covers (rare words weigh more: a `text.Pool`
of the passages read), plus how much of the answer it supports; a retrieved passage above
`HOLD_THRESHOLD` holds the answer, a re-searched one the agent never saw above `INDEX_THRESHOLD`
says the index has it, and one clearly better than every retrieved one outranks them. The heuristic
judge reads its facts `contains_answer` and `index_has_answer` from a `Containment`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from triage.domain.records import Passage, ToolCall
from triage.judges.offline.text import (
    Pool,
    looks_english,
    specifics,
    squash,
    strip_invisible,
    word_set,
)

#: a passage holds the answer at this score (question coverage, plus the answer support bonus)
HOLD_THRESHOLD = 0.65


#: a re-searched passage elsewhere this much better than the best retrieved one outranks it
OUTRANK_MARGIN = 0.2


#: weight of the answer's support by the retrieved passages
ANSWER_WEIGHT = 0.4


#: the index holds the answer when some re-searched passage the agent was not shown covers the
#: question this well
INDEX_THRESHOLD = 0.55


#: a declining agent read its passages and says the answer is not there: overruled only from here
DECLINED_HOLD_THRESHOLD = 0.85


#: the answer's specifics the retrieved passages hold, from this share on, say the passages hold the
#: answer when no passage elsewhere covers the question clearly better (`OUTRANK_MARGIN`): the user's
#: words may not be the docs' words, the answer's specifics taken from the passages bridge them
SUPPORT_HOLD = 0.7


#: ... of at least this many specifics
SUPPORT_MIN = 2


#: a re-searched passage counts (for the index, or as a better passage elsewhere) only if it holds
#: this share of the question's words that the retrieved passages hold: the subject the agent's
#: search did find. One that holds the rare words without the subject is a lexical trap
TOPIC_SHARE = 0.5


#: ... when the retrieved passages hold at least this many of the question's words (one is no subject)
TOPIC_MIN = 2


#: how far from its threshold a score is clear-cut (`high`): a hold above `HOLD_THRESHOLD`, a miss
#: below it (paraphrase hides words, not the reverse), the index either side of `INDEX_THRESHOLD`
HOLD_CLEAR = 0.3


MISS_CLEAR = 0.45


INDEX_CLEAR = 0.3


#: a retrieved passage that covers the question this well, and in which the answer is surely
#: grounded, surely holds the answer
GROUNDED_HOLD = 0.4


#: a passage elsewhere this much better than the best retrieved one is a clear-cut miss (`high`),
#: unless the answer leans on the retrieved passages
CLEAR_OUTRANK = 0.4


#: ... and this much where it does, from another page
CLEAR_OUTRANK_LEANING = 0.5


#: retrieved passages that cover the question within this much of the best one answer it too: the
#: answer's support must come from them (`Containment.answering`)
ANSWERING_MARGIN = 0.1


#: words that tell the user's situation, not the subject ("it has been hanging for an hour, if that
#: matters"): no page answers them, so counted they make every passage look as if it missed
_SITUATION = word_set(
    """since though although already anymore actually suddenly instead currently recently basically
    hour hours day days minute minutes week weeks yesterday today tonight morning matter matters rid
    fine wonder wondering idea thanks thank hi hello anyone someone somebody everything okay ok lot
    bit kind sort tried happen happens happened hope hoping guess"""
)


def question_terms(question: str, tool_calls: Sequence[ToolCall]) -> set[str]:
    terms = set(word_set(question)) - _SITUATION
    if looks_english(question):
        return terms
    terms = {t for t in terms if t.isascii()}
    for call in tool_calls:
        query = call.args.get("query") if call.is_search else None
        if isinstance(query, str):
            terms |= word_set(query)
    return terms


#: a name with two hyphens or more (`hpo-bert-base`, `fraud-detection-study-v2`): what users call
#: their own notebooks, experiments and namespaces
_KEBAB = re.compile(r"(?<![\w.\-/])[a-z0-9]+(?:-[a-z0-9]+){2,}(?![\w\-/])")


def own_names(question: str, pool: Pool) -> set[str]:
    """The words of the user's own object names: a kebab-case name no passage of the trace holds is
    the user's (`fraud-detection-gradient-boosting-study-v2`), and no page of the docs holds it or
    its parts as the user means them. Counted, its many rare words would make every passage look as
    if it missed the question. A part the question also uses on its own still counts."""
    names = [m.group(0) for m in _KEBAB.finditer(question) if not pool.holds(m.group(0))]
    if not names:
        return set()
    rest = word_set(_KEBAB.sub(" ", question))
    return {w for name in names for w in word_set(name)} - rest


def passage_text(passage: Passage) -> str:
    return f"{passage.title or ''}\n{passage.text}"


def _same_passage(x: str, y: str) -> bool:
    """Two squashed passage texts are one passage (one is cut from the other)."""
    return x[:120] in y or y[:120] in x


@dataclass
class Scored:
    passage: Passage
    coverage: float  # idf-weighted question coverage
    topic: float = 1.0  # share of the question's words the retrieved passages hold that this one holds

    @property
    def on_topic(self) -> bool:
        return self.topic >= TOPIC_SHARE


def on_topic(scored: Sequence[Scored] | None) -> list[Scored]:
    """The re-searched passages that may count for the index (none of the lexical traps)."""
    return [s for s in scored or [] if s.on_topic]


@dataclass
class Containment:
    """What the containment scores found for one trace."""

    retrieved: list[Scored]
    researched: list[Scored] | None
    answer_support: float | None  # the answer's specifics held by the retrieved passages
    retrieved_best: Scored | None
    elsewhere_best: Scored | None  # the best on-topic re-searched passage the agent was not shown
    declined: bool = False  # the answer declines (its specifics say nothing about what is needed)
    answer_specifics: int = 0  # how many specifics `answer_support` is a share of

    @cached_property
    def _retrieved_texts(self) -> list[str]:
        return [squash(s.passage.text) for s in self.retrieved]

    def shown(self, passage: Passage) -> bool:
        """`passage` is one the agent retrieved (or cut from one, or one cut from it)."""
        text = squash(passage.text)
        return any(_same_passage(text, r) for r in self._retrieved_texts)

    @property
    def answering(self) -> list[Passage]:
        """The retrieved passages that answer the question, as far as the question's words tell:
        the best one, and those that cover the question about as well (`ANSWERING_MARGIN`). What
        the answer takes from other passages is seen, but not where the answer is."""
        best = self.retrieved_best
        if best is None:
            return []
        floor = best.coverage - ANSWERING_MARGIN
        return [s.passage for s in self.retrieved if s is best or (s.coverage > 0 and s.coverage >= floor)]

    @property
    def leans_on_retrieved(self) -> bool:
        """The answer's specifics are the retrieved passages' (`SUPPORT_HOLD` of `SUPPORT_MIN` or
        more): it answered from what it was shown, right page or not."""
        support = self.answer_support
        return support is not None and support >= SUPPORT_HOLD and self.answer_specifics >= SUPPORT_MIN

    @property
    def outrank_margin(self) -> float:
        """How much better the best passage elsewhere covers the question than the best retrieved one."""
        if self.elsewhere_best is None:
            return 0.0
        return self.elsewhere_best.coverage - (self.retrieved_best.coverage if self.retrieved_best else 0.0)

    @property
    def retrieved_score(self) -> float:
        base = self.retrieved_best.coverage if self.retrieved_best else 0.0
        return base + ANSWER_WEIGHT * (self.answer_support or 0.0) if self.retrieved_best else 0.0

    @property
    def outranked(self) -> bool:
        """A clearly better passage elsewhere, and the best retrieved one does not cover the question
        by itself (it leans on the answer's specifics: the answer may be grounded off target)."""
        if self.elsewhere_best is None:
            return False
        best = self.retrieved_best.coverage if self.retrieved_best else 0.0
        if best >= HOLD_THRESHOLD:
            return False
        return self.elsewhere_best.coverage >= max(best + OUTRANK_MARGIN, HOLD_THRESHOLD)

    @property
    def hold_threshold(self) -> float:
        return DECLINED_HOLD_THRESHOLD if self.declined else HOLD_THRESHOLD

    @property
    def supported(self) -> bool:
        """The answer's specifics are the retrieved passages' (`SUPPORT_HOLD`), and no passage
        elsewhere covers the question clearly better than they do."""
        if self.retrieved_best is None or self.answer_support is None or self.answer_support < SUPPORT_HOLD:
            return False
        if self.answer_specifics < SUPPORT_MIN:
            return False  # one common specific (`kubectl`) says nothing about which passage answers
        rival = self.elsewhere_best.coverage if self.elsewhere_best else 0.0
        return rival < self.retrieved_best.coverage + OUTRANK_MARGIN

    @property
    def retrieved_holds(self) -> bool:
        return (self.retrieved_score >= self.hold_threshold and not self.outranked) or self.supported

    @property
    def index_score(self) -> float | None:
        """The best coverage among the re-searched passages the agent was not shown: a passage it
        was shown, and that did not hold the answer there, holds it no better when re-found."""
        if self.researched is None:
            return None
        return self.elsewhere_best.coverage if self.elsewhere_best else 0.0

    @property
    def index_holds(self) -> bool | None:
        if self.retrieved_holds:
            return True
        score = self.index_score
        return None if score is None else score >= INDEX_THRESHOLD


def contain(
    question: str,
    answer: str,
    tool_calls: Sequence[ToolCall],
    retrieved: Sequence[Passage],
    researched: Sequence[Passage] | None,
    answer_counts: bool,
    declined: bool = False,
) -> Containment:
    """Score every passage of a trace. `answer_counts`: the answer neither declines nor is empty, so
    its specifics say what the passages should hold."""
    pool = Pool([passage_text(p) for p in [*retrieved, *(researched or [])]])
    terms = question_terms(question, tool_calls) - own_names(question, pool)
    topic = terms & frozenset().union(*(word_set(passage_text(p)) for p in retrieved))

    def score(p: Passage) -> Scored:
        have = word_set(passage_text(p))
        share = len(topic & have) / len(topic) if len(topic) >= TOPIC_MIN else 1.0
        return Scored(p, pool.weighted_coverage(terms, have), share)

    r_scored = [score(p) for p in retrieved]
    s_scored = [score(p) for p in researched] if researched is not None else None
    support: float | None = None
    wanted: list[str] = []
    if answer_counts and retrieved:
        asked = squash(question)
        wanted = [s for s in specifics(strip_invisible(answer)) if squash(s) not in asked]
        if wanted:
            held = squash(strip_invisible("\n".join(f"{p.text} {p.source_url or ''}" for p in retrieved)))
            support = sum(squash(s) in held for s in wanted) / len(wanted)
    found = Containment(
        retrieved=r_scored,
        researched=s_scored,
        answer_support=support,
        retrieved_best=max(r_scored, key=lambda s: s.coverage, default=None),
        elsewhere_best=None,
        declined=declined,
        answer_specifics=len(wanted),
    )
    elsewhere = [s for s in on_topic(s_scored) if not found.shown(s.passage)]
    found.elsewhere_best = max(elsewhere, key=lambda s: s.coverage, default=None)
    return found
