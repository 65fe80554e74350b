"""Corrections and claims read in an answer, without a model: the values a correction asks for and
whether the answer states them, turns them or counts otherwise, and whether a claim the case rejects
is made again, named to reject it, or gone (its anchors: code spans, specifics, proper names).

The offline check judge (`judges.check_offline`) turns these findings into its verdicts on
`correction` and `must_not_claim`; what strings cannot tell is left undecided there."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from triage.domain.checks import CheckCase
from triage.domain.records import Confidence
from triage.judges.offline.check_evidence import (
    NEGATION,
    digits_in,
    holds,
    numbers_in,
    prose_sentences,
    quote,
    unticked,
)
from triage.judges.offline.text import (
    STOPWORDS,
    fenced_code,
    fold,
    specifics,
    squash,
    word_set,
    word_union,
)

#: a value that stands for any value (`author=...`, `name: <your-name>`): no value to contradict
PLACEHOLDER_VALUE = re.compile(r"\.{2,}|…|<[^<>]*>|\$\{?\w+\}?|(?:your|my)[-_]\w*|x+", re.IGNORECASE)


#: words joined by slashes in prose (`Katib/Trainer`, `CPU/GPU`, `and/or`): alternatives or a pair
#: of names the sentence runs together, no value of its own (in a code span it is one: a repository)
SLASHED_WORDS = re.compile(r"[^\W\d_]+(?:/[^\W\d_]+)+")


def correction_values(correction: str) -> list[str]:
    """The values a correction states, which a passing answer must state too: its specifics, but not
    a placeholder (`author=...`) nor words joined by slashes in prose."""
    spans = re.findall(r"`([^`\n]+)`", correction)
    out = []
    for item in specifics(unticked(correction)):
        if re.search(r"\.\.\.|…", item):
            continue
        if SLASHED_WORDS.fullmatch(item) and not any(item in span for span in spans):
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
        names = [s for s in specifics(clause) if not SLASHED_WORDS.fullmatch(s) and not _SMALL & {s}]
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


#: a decline that turns to a way of its own ("but you can", "that said", "in practice", "here is how")
TURN = re.compile(
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
