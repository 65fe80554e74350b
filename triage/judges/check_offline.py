"""The offline check judge (`OfflineCheckJudge`, no model): a regression case's expectations
decided on string evidence alone, `passed=None` where strings cannot be sure (see
`triage.judges.expectations` for the overview).

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
from triage.judges.check_evidence import (
    NEGATION,
    answer_findings,
    check_must_cite,
    check_tool_behavior,
    decline_cues,
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
from triage.judges.grounding import pairs, unsupported_specifics, value_contradictions
from triage.judges.offline_text import (
    STOPWORDS,
    absence_cues,
    fenced_code,
    fold,
    listed_phrases,
    looks_english,
    specifics,
    squash,
    word_set,
    word_union,
)

#: a value that stands for any value (`author=...`, `name: <your-name>`): no value to contradict
_PLACEHOLDER_VALUE = re.compile(r"\.{2,}|…|<[^<>]*>|\$\{?\w+\}?|(?:your|my)[-_]\w*|x+", re.IGNORECASE)


#: words joined by slashes in prose (`Katib/Trainer`, `CPU/GPU`, `and/or`): alternatives or a pair
#: of names the sentence runs together, no value of its own (in a code span it is one: a repository)
_SLASHED_WORDS = re.compile(r"[^\W\d_]+(?:/[^\W\d_]+)+")


def correction_values(correction: str) -> list[str]:
    """The values a correction states, which a passing answer must state too: its specifics, but not
    a placeholder (`author=...`) nor words joined by slashes in prose."""
    spans = re.findall(r"`([^`\n]+)`", correction)
    out = []
    for item in specifics(unticked(correction)):
        if re.search(r"\.\.\.|…", item):
            continue
        if _SLASHED_WORDS.fullmatch(item) and not any(item in span for span in spans):
            continue
        out.append(item)
    return out


#: a count small enough to be written in words ("three trials", "two runners", "after one report")
_SMALL = frozenset(str(n) for n in range(13))
#: where a correction's statements part: a count belongs to the names of its own clause
_CORRECTION_CLAUSES = re.compile(r";|\(|\)|,\s+(?:and|or|but)\s+|\.\s+")
#: a list item's number ("1. Forward a port"): no count
_LIST_MARK = re.compile(r"^\s*\d+[.)]\s+")


def counted_otherwise(correction: str, question: str, answer: str) -> str | None:
    """A small count the correction gives a name ("`start_step` defaults to 4", "runs three trials"
    when parallelTrialCount is unset) that a sentence of the answer holding that name gives another
    count, without the correction's ("a Trial can be stopped after one report"; "the default is
    1"): the answer counts otherwise. A count the answer states elsewhere only is no value to look
    for (the answer may list the things it counts)."""
    asked = numbers_in(question)
    rules: list[tuple[list[str], set[str]]] = []
    for clause in _CORRECTION_CLAUSES.split(unticked(correction)):
        counts = (numbers_in(clause) & _SMALL) - asked
        names = [s for s in specifics(clause) if not _SLASHED_WORDS.fullmatch(s) and not _SMALL & {s}]
        if counts and names:
            rules.append((names, counts))
    if not rules:
        return None
    for sentence in prose_sentences(answer):
        text = _LIST_MARK.sub("", unticked(sentence))
        said = numbers_in(text) & _SMALL
        for names, counts in rules:
            if said and not said & counts and any(holds(squash(text), n) for n in names):
                return f'the correction counts {sorted(counts)[0]}; the answer says {sorted(said)[0]}: "{sentence}"'
    return None


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
        if not any(_PLACEHOLDER_VALUE.fullmatch(v) for v in values)
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


#: words that weaken or bound what a sentence states ("only advisory", "even after", "any UID works",
#: "Note that ..."): beside a correction's value, a caveat that may contradict it
_HEDGE = re.compile(
    r"\b(?:only|advisory|ignored|ignores|optional(?:ly)?|any|anywhere|anything|even|still|however|but"
    r"|although|though|unless|except|actually|may|might|sometimes|usually|typically|generally|often"
    r"|caveats?|note|warning|beware|careful|instead|rather|approximately|roughly|retrie[sd]|retry)\b",
    re.IGNORECASE,
)
#: words and their opposites: an answer's sentence holding a correction's value and the opposite of a
#: word of the correction (its "before" as "after") may turn it
_OPPOSITES = [
    ("before", "after"),
    ("enable", "disable"),
    ("enabled", "disabled"),
    ("true", "false"),
    ("min", "max"),
    ("minimum", "maximum"),
    ("more", "fewer"),
    ("more", "less"),
    ("first", "last"),
    ("higher", "lower"),
    ("increase", "decrease"),
    ("inside", "outside"),
    ("internal", "external"),
    ("required", "optional"),
    ("always", "never"),
    ("all", "none"),
    ("sequential", "parallel"),
    ("sequentially", "in parallel"),
    ("allow", "deny"),
    ("include", "exclude"),
    ("add", "remove"),
    ("adds", "removes"),
    ("secure", "insecure"),
    ("recommended", "discouraged"),
]


def turned_values(correction: str, values: Sequence[str], answer: str) -> str | None:
    """A sentence of the answer holding one of the correction's `values` that negates, hedges or
    turns what it says: a negation or a disowning word, a hedge (`_HEDGE`) the correction does not
    use, or the opposite of a word the correction uses (its "before" as "after")."""
    said = {w.lower() for w in re.findall(r"[a-z]+", unticked(correction), re.IGNORECASE)}
    said_text = " " + " ".join(re.findall(r"[a-z]+", unticked(correction).lower())) + " "
    for sentence in prose_sentences(answer):
        text = unticked(sentence)
        # only the sentences holding a value: a long answer's other sentences say other things (a
        # sentence after one, "It is only advisory.", would be read too: measured on dev, it leaves
        # half the restatements undecided for no wrong pass it stops)
        if not any(holds(squash(text), v) or v in numbers_in(text) for v in values):
            continue
        if is_negative(text):
            return f'negates beside its values: "{sentence}"'
        hedges = [m.group(0) for m in _HEDGE.finditer(text) if m.group(0).lower() not in said]
        if hedges:
            return f'"{hedges[0]}" beside its values: "{sentence}"'
        words = " " + " ".join(re.findall(r"[a-z]+", text.lower())) + " "
        for a, b in _OPPOSITES:
            for one, other in ((a, b), (b, a)):
                if f" {one} " in said_text and f" {other} " not in said_text and f" {other} " in words:
                    return f'"{other}" where the correction says "{one}": "{sentence}"'
    return None


#: a sentence holding every anchor of a claim and this share of its content words (beyond the
#: question's), with the claim's polarity, makes it again (a claim without anchors, never)
CLAIM_STATED = 0.5
#: a sentence with the claim's anchors and this share of its words, of the other polarity, rejects it
CLAIM_NAMED = 0.5


@dataclass(frozen=True)
class Anchor:
    """What a claim cannot be made without: a value it quotes (a code span), a specific, a number or
    a proper name of it beyond the question's words."""

    text: str
    #: a code span of the claim: the value it asserts (`bayesian`)
    value: bool = False
    #: a value that is also a plain word of the claim's or the question's prose (`password` in "the
    #: default password is `password`", `bayesian` for "Bayesian optimization"): found only as code
    code_only: bool = False
    #: a number of the claim (`1` in "defaults to 1"): found in digits or in words
    number: bool = False

    def in_text(self, text: str) -> bool:
        """In `text`, in code or in prose alike (an identifier is one whether or not it is put in
        backticks): as a whole token, case and all, or all its words; a number in digits or words;
        a `code_only` value only as code."""
        if self.number:
            return self.text in numbers_in(unticked(text))
        if self.code_only:
            code = " ".join([*re.findall(r"`([^`\n]+)`", text), *fenced_code(text)])
            return re.search(rf"(?<![\w-]){re.escape(self.text)}(?![\w-])", code) is not None
        if re.search(rf"(?<![\w-]){re.escape(self.text)}(?![\w-])", text):
            return True
        if re.fullmatch(r"[a-z]+", self.text):
            return False
        # an identifier spelled out in prose, part by part ("the execution options' caching strategy"
        # for `execution_options.caching_strategy`): every part a content word of the text
        parts = [p for p in re.split(r"(?<=[a-z0-9])(?=[A-Z])|[^A-Za-z0-9]+", self.text) if p]
        sets = [word_set(p) for p in parts]
        if len(parts) >= 2 and all(sets):
            return frozenset().union(*sets) <= word_set(unticked(text))
        wanted = word_set(self.text)
        return bool(wanted) and wanted <= word_set(text)


#: a path the claim states (`/kserve`, `/home/jovyan`): a value, though no identifier
_PATH = re.compile(r"(?<![\w/.:-])/[A-Za-z_][\w.-]*(?:/[\w.-]+)*")


#: an expression's names and values (`execution_options.caching_strategy.max_cache_staleness`, `P0D`)
_EXPRESSION_PART = re.compile(r"[A-Za-z_][\w.-]*[\w]|\"([^\"\n]+)\"|'([^'\n]+)'|\d[\w.]*")


def span_parts(span: str) -> list[str]:
    """What a claim's code span asserts: the span itself, or, for an expression (`a.b = "P0D"`,
    `f(x=1)`), each of its names and values, which an answer may state in prose one by one."""
    if not re.search(r"[=(),]|:\s", span) or re.match(r"\s*\w+://", span):
        return [span]  # a name, a value, a command line or a URL: one piece
    parts = []
    for m in _EXPRESSION_PART.finditer(span):
        part = m.group(1) or m.group(2) or m.group(0)
        if len(part) > 1 and part.lower() not in STOPWORDS:
            parts.append(part)
    return list(dict.fromkeys(parts)) or [span]


def claim_anchors(claim: str, question: str) -> list[Anchor]:
    """A claim's anchors: its code spans (unless the question quotes the same), its specifics, paths
    and numbers and its proper names (a capitalised word inside a sentence) beyond the question's."""
    asked_words = word_set(question)
    asked = squash(question)
    spans = re.findall(r"`([^`\n]+)`", claim)
    # the claim's prose and the question, in words: a value that is one of them is a word there too
    prose_words = {w.lower() for w in re.findall(r"[^\W\d_]+", re.sub(r"`[^`\n]+`", " ", claim) + " " + question)}
    out = [
        Anchor(s, value=True, code_only=bool(re.fullmatch(r"[a-z]+", s)) and s in prose_words)
        for span in spans
        for s in span_parts(span)
        if s not in question
    ]
    for item in specifics(unticked(claim)):
        if any(item in s for s in spans) or holds(asked, item) or word_set(item) <= asked_words:
            continue
        out.append(Anchor(item))
    for path in _PATH.findall(claim):
        if not any(path in s for s in spans) and not holds(asked, path):
            out.append(Anchor(path))
    prose = re.sub(r"`[^`\n]+`", " ", unticked(claim)) if spans else unticked(claim)
    for number in sorted(digits_in(prose) - numbers_in(question)):
        if not any(a.text == number for a in out):
            out.append(Anchor(number, number=True))
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


#: words that disown what they name: a sentence calling a thing deprecated or replaced recommends
#: it no more than one saying "not" ("`dsl.Condition` is deprecated in favour of `dsl.If`")
_DISOWNED = re.compile(
    r"\b(?:deprecated|obsolete|legacy|superseded|discouraged|no longer|in favou?r of|replaced by|removed in"
    r"|avoid|veraltet|obsol[èe]te|d[ée]pr[ée]ci[ée]|obsoleto|descontinuad[oa]|en desuso)\b|非推奨|已弃用|已廢棄|不推荐",
    re.IGNORECASE,
)


def is_negative(text: str) -> bool:
    """A sentence negates or disowns what it names."""
    return bool(NEGATION.search(text) or _DISOWNED.search(text))


#: where a sentence's clauses part: a semicolon, a dash, "i.e." (a negation after it is about
#: something else: "... staleness of P0D, i.e. zero; a cached result is then never fresh")
_CLAUSES = re.compile(r";|\s[—–]\s|\bi\.e\.|\be\.g\.")


def clause_negative(sentence: str, anchors: Sequence[Anchor]) -> bool:
    """The polarity of what a sentence says of a claim's anchors: that of the clauses holding them
    (the whole sentence when no one clause holds an anchor)."""
    clauses = [c for c in _CLAUSES.split(sentence) if any(a.in_text(c) for a in anchors)]
    return any(is_negative(c) for c in clauses) if clauses else is_negative(sentence)


def _claim_value(claim: str, anchors: Sequence[Anchor]) -> Anchor | None:
    """What a claim asserts of its subject: its last anchor, when that is a value (a number, a path,
    a code span, a name in CamelCase: "... is `bayesian`", "... is LongRunning", "... is /kserve")."""
    placed = sorted(
        ((claim.rfind(a.text), a) for a in anchors if claim.rfind(a.text) >= 0),
        key=lambda pair: pair[0],
    )
    if not placed:
        return None
    last = placed[-1][1]
    if last.number or last.value or last.text.startswith("/") or re.fullmatch(r"[A-Z][a-z]+[A-Z]\w*", last.text):
        return last
    return None


def _values_of(kind: Anchor, sentence: str) -> set[str]:
    """The values of a sentence of the same kind as `kind`: numbers, paths, or names and code spans."""
    if kind.number:
        return numbers_in(unticked(sentence))
    if kind.text.startswith("/"):
        return set(_PATH.findall(sentence))
    return set(re.findall(r"`([^`\n]+)`", sentence)) | set(re.findall(r"\b[A-Z][a-z]+[A-Z]\w*\b", sentence))


def stated_otherwise(claim: str, anchors: Sequence[Anchor], words: set[str], answer: str) -> str | None:
    """A prose sentence that states the claim's subject (its other anchors, half its words) with
    another value of the same kind, while the claim's own value is nowhere in the prose ("the
    default policy, `Never`, ..." against "the default resume policy is LongRunning"; a code block
    setting `LongRunning` is an example, no statement of the default): the claim is not made."""
    value = _claim_value(claim, anchors)
    if value is None:
        return None
    sentences = prose_sentences(answer)
    if any(value.in_text(s) for s in sentences):
        return None
    others = [a for a in anchors if a is not value]
    subject = words - word_set(unticked(value.text))
    for sentence in sentences:
        if not all(a.in_text(sentence) for a in others) or not subject:
            continue
        share = len(subject & word_set(unticked(sentence))) / len(subject)
        found = {v for v in _values_of(value, sentence) if v.lower() != value.text.lower()}
        if share >= CLAIM_STATED and found:
            return f'states it with another value ({sorted(found)[0]}): "{quote(sentence)}"'
    return None


def offline_claim(claim: str, case: CheckCase, answer: str) -> ClaimFinding:
    """One forbidden claim against the answer (see the module docstring)."""
    anchors = claim_anchors(claim, case.question)
    words = set(word_set(unticked(claim)) - word_set(case.question))
    negative = is_negative(claim)
    stated: tuple[float, str] | None = None
    rejected: str | None = None
    # numbers and paths are what a claim says, not what names it: they are needed to make it again,
    # but a number or a path alone can neither reject it ("not 1 unless ...") nor be gone (reworded)
    named = [a for a in anchors if not a.number and not a.text.startswith("/")]
    for sentence in prose_sentences(answer):
        if not all(a.in_text(sentence) for a in anchors):
            continue
        share = len(words & word_set(unticked(sentence))) / len(words) if words else 1.0
        if clause_negative(sentence, anchors) == negative:
            # a claim without anchors is never made again by its words alone: generic words
            # ("default", "run", "set") meet in any answer on the subject
            if anchors and share >= CLAIM_STATED and (stated is None or share > stated[0]):
                stated = (share, sentence)
        elif named and share >= CLAIM_NAMED:
            rejected = rejected or sentence
    if stated is not None:
        return ClaimFinding(claim, False, "medium", f'makes it again: "{quote(stated[1])}"')
    if rejected is not None:
        return ClaimFinding(claim, True, "medium", f'names it only to reject it: "{quote(rejected)}"')
    otherwise = stated_otherwise(claim, anchors, words, answer)
    if otherwise is not None:
        return ClaimFinding(claim, True, "medium", otherwise)
    text = fold(answer)
    values = [a for a in anchors if a.value]
    # a claim is gone when its names are: a number or a path may be reworded ("one at a time" for 1,
    # "the models path" for /models), so their absence alone says nothing
    if named and not any(a.in_text(text) for a in named):
        return ClaimFinding(
            claim, True, "medium", f"none of {', '.join(a.text for a in named[:4])} in the answer"
        )
    if values and not any(a.in_text(text) for a in values):
        return ClaimFinding(
            claim,
            True,
            "medium",
            f"the value it asserts ({', '.join(a.text for a in values[:3])}) is not in the answer",
        )
    if not anchors:
        return ClaimFinding(claim, None, "low", "the claim names no value strings can look for")
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


#: a decline that turns to a way of its own ("but you can", "that said", "in practice", "here is how")
_TURN = re.compile(
    r"\b(?:but|however|that said|still|anyway)\b,? (?:you|we) (?:can|could|may|should)\b|\bthat said\b"
    r"|\bin practice\b|\bhere(?:'s| is) how\b|\bworkaround\b|\b(?:aber|jedoch) (?:k[öo]nnen sie|kannst du)\b"
    r"|\bpraktisch\b|\bcependant,? vous pouvez\b|\ben pratique\b|\bsin embargo,? (?:puedes|puede)\b"
    r"|\ben la pr[áa]ctica\b|\bna pr[áa]tica\b|\bno entanto,? (?:voc[êe] )?pode\b"
    r"|但(?:是)?(?:你|您)?可以|ただし.{0,10}できます",
    re.IGNORECASE,
)


#: a path through a UI, in prose ("**Settings → Export → CSV**", "Runs > Archive"): a menu is a
#: specific as a field is, though no identifier
_MENU = re.compile(r"[A-Z][\w-]*(?: [\w-]+){0,3}(?:\s*(?:→|->|›|»|>)\s*[A-Z][\w-]*(?: [\w-]+){0,3})+")


def unseen_menus(answer: str, seen: Sequence[str]) -> list[str]:
    """The UI paths of `answer` (in prose, outside code) with a step no text the agent saw names."""
    haystack = squash(" ".join(seen))
    known = word_union(seen)
    out = []
    for prose in prose_sentences(answer):
        for match in _MENU.finditer(re.sub(r"`[^`\n]*`", " ", prose)):
            steps = [squash(s) for s in re.split(r"\s*(?:→|->|›|»|>)\s*", match.group(0))]
            # a step is seen as written, or word by word ("Use Experiments" for the Experiments tab)
            if any(step not in haystack and not word_set(step) <= known for step in steps if step):
                out.append(match.group(0))
    return list(dict.fromkeys(out))


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
            if not is_pointer(s, hosts) and not (_SLASHED_WORDS.fullmatch(s) and not any(s in c for c in spans))
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
    turn = _TURN.search(answer)
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

