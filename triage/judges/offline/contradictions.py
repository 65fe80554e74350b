"""Contradictions: an answer that says what its passages deny.

Three kinds, each read from strings: a `key: value` pair of the answer that swaps one the passages
give (`value_contradictions`), a term the passages negate that the answer affirms or the reverse
(`negation_contradictions`, `affirmed_negations`), and a value the answer says is the only one where
the passages list others (`restriction_contradictions`). The offline judge counts them against
grounding; the offline check judge reads a corrected value's swap with `value_contradictions`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from triage.domain.kernel import TextMemo
from triage.judges.offline.text import (
    PLACEHOLDER,
    STOPWORDS,
    plain,
    specifics,
    squash,
    squash_joined,
    word_set,
    words_in,
)

#: a function word after `key:` starts free text; YAML's own words (`yes`, `no`, `on`, ...) are values
_PROSE_WORDS = STOPWORDS - {"yes", "no", "on", "off", "none", "all", "any", "up", "down"}


def pairs(text: str) -> dict[str, set[str]]:
    """`key: value` and `key=value` pairs, keys lower-cased, values as written (quotes dropped, and
    a sentence's closing period: `port=8080.` gives `8080`)."""
    out: dict[str, set[str]] = {}
    for key, written in _PAIR.findall(text):
        # one closing period; `...` is a placeholder, not a sentence's end
        value = written[:-1] if written.endswith(".") and not written.endswith("..") else written
        if key.lower() in ("http", "https") or value.startswith("//"):
            continue
        if value.lower() in _PROSE_WORDS:
            continue  # free text (`Note: the ...`, `description: How to ...`): its first word is no value
        out.setdefault(key.lower(), set()).add(value.lower())
    return out


#: values any question may hold as words ("is it true that ..."): never the user's own value
_GENERIC_VALUE = re.compile(r"(?i)true|false|yes|no|on|off|none|null|enabled|disabled|\d[\d.]*")


def swaps(
    answer: str, passages: Sequence[str], seen: Sequence[str], question: str
) -> tuple[list[str], list[str]]:
    """The answer's `key: value` pairs whose key the passages give, only ever with other values: the
    swapped ones, and those whose value the question supplies (`Grounding.filled`)."""
    given: dict[str, set[str]] = {}
    for text in passages:
        for key, values in pairs(text).items():
            given.setdefault(key, set()).update(values)
    haystack = squash_joined([*passages, *seen])
    asked = squash(question)
    swapped: list[str] = []
    filled: list[str] = []
    for key, values in pairs(answer).items():
        theirs = {v for v in given.get(key, set()) if not PLACEHOLDER.search(v)}
        mine = {v for v in values if not PLACEHOLDER.search(v) and squash(v) in haystack}
        if len(key) > 2 and theirs and mine and not values & theirs:
            said = f"{key}: {sorted(mine)[0]} (the passages give {', '.join(sorted(theirs)[:3])})"
            asked_for = any(words_in(squash(v), asked) for v in values if not _GENERIC_VALUE.fullmatch(v))
            (filled if asked_for else swapped).append(said)
    return swapped, filled


def value_contradictions(
    answer: str, passages: Sequence[str], seen: Sequence[str] = (), question: str = ""
) -> list[str]:
    """The answer's `key: value` whose key the passages give, only ever with other values, while the
    value itself is seen elsewhere (a swapped value; an unseen value is already an unsupported
    specific). A value the question supplies is the user's own, filled into the docs' example
    (`name: dana` for "owned by dana"), not a swap (`Grounding.filled`)."""
    return swaps(answer, passages, seen, question)[0]


#: a term a passage sentence denies ("for non-production experiments", "is not production-ready",
#: "never recommended"): the negating word or prefix, then the term
_NEGATED_TERM = re.compile(r"(?<![\w-])(?:non-|not\s+|never\s+)([a-z][a-z-]{3,})", re.IGNORECASE)


#: words after "not" that carry no claim of their own ("not only", "not just", "not have")
_NOT_A_TERM = frozenset(
    "only just also even always have been being need needed needs that this these those sure much "
    "many more very well when where what which while with from into".split()
)


@dataclass(frozen=True)
class _Sentence:
    """One sentence of a passage, as the polarity checks read it."""

    words: frozenset[str]
    #: it negates something (then it states nothing positive for `negation_contradictions`)
    negates: bool
    #: the terms it denies (`_NEGATED_TERM`), for `affirmed_negations`
    denied: tuple[str, ...]


def _read_sentences(text: str) -> tuple[_Sentence, ...]:
    out = []
    for sentence in _SENTENCE.split(plain(text)):
        if not sentence.strip():
            continue
        denied = (m.group(1).lower().strip("-") for m in _NEGATED_TERM.finditer(sentence))
        out.append(
            _Sentence(
                word_set(sentence),
                _NEGATION.search(sentence) is not None,
                tuple(term for term in denied if term not in _NOT_A_TERM),
            )
        )
    return tuple(out)


def negation_contradictions(answer: str, passages: Sequence[str], question: str = "") -> list[str]:
    """Answer sentences that deny what a passage states: a term negated in the answer ("X is not
    supported") that a passage sentence gives without any negation, near the same subject."""
    found = []
    positive = [one.words for text in passages for one in _sentences(text) if not one.negates]
    for sentence in _SENTENCE.split(plain(answer)):
        match = _DECLARATIVE_NEGATION.search(sentence)
        if not match:
            continue
        subject = word_set(sentence[: match.start()])
        if not subject:
            continue
        # the terms the sentence denies, held together by one positive passage sentence
        asked = word_set(question)
        if any(len(subject & ws) >= min(2, len(subject)) and subject <= ws | asked for ws in positive):
            found.append(sentence.strip()[:200])
    return found


def affirmed_negations(answer: str, passages: Sequence[str]) -> list[str]:
    """The reverse of `negation_contradictions`: terms a passage sentence denies ("for non-production
    experiments") that an answer sentence on the same subject (two more words in common) states
    with no negation at all ("the recommended production setup"). A polarity the answer may have
    flipped: not proof of a contradiction (the answer may speak of something else), so it only
    keeps grounding from being sure."""
    denied = [(term, one.words) for text in passages for one in _sentences(text) for term in one.denied]
    if not denied:
        return []
    found: list[str] = []
    for sentence in _SENTENCE.split(plain(answer)):
        lowered = sentence.lower()
        if _NEGATION.search(sentence) or not lowered.strip():
            continue
        words = word_set(sentence)
        for term, passage_words in denied:
            stated = re.search(rf"(?<![\w-]){re.escape(term)}(?![\w])", lowered) is not None
            if stated and len((words & passage_words) - word_set(term)) >= 2:
                found.append(term)
                break
    return list(dict.fromkeys(found))


#: a word that restricts a statement to what follows it ("works only with `StdOut` or `File`")
_RESTRICTION = re.compile(r"\b(?:only|solely|exclusively)\b", re.IGNORECASE)


#: a specific of one piece (`TensorFlowEvent`, `StdOut`): what a restricted list names
_ONE_PIECE = re.compile(r"[\w-]+")


def _named(value: str, allowed: set[str]) -> bool:
    return any(a == value or words_in(a, value) for a in allowed)


#: a value named to leave it out ("not `RStudio`", "except RStudio", "but never RStudio")
_LEFT_OUT = re.compile(r"\b(?:not|no|never|nor|except|excluding|without|other than|but)\W+(?:\w+\W+){0,2}$")


#: an extra value is listed with the restricted ones: this close to one of them (characters)
_LISTED = 60


def _spots(value: str, sentence: str) -> list[int]:
    return [m.start() for m in re.finditer(rf"(?<!\w){re.escape(value)}(?!\w)", sentence)]


def _denied(value: str, sentence: str) -> bool:
    """`value` appears in `sentence` (lower case) only right after a word that leaves it out."""
    spots = _spots(value, sentence)
    return bool(spots) and all(_LEFT_OUT.search(sentence[max(0, at - 40) : at]) for at in spots)


def _shape(value: str) -> tuple[bool, bool, bool]:
    """How a name is written: capitalised, all capitals, with an underscore (`StdOut`, `GPU`, `max_x`)."""
    return value[:1].isupper(), value.isupper(), "_" in value


def restriction_contradictions(answer: str, passages: Sequence[str], question: str = "") -> list[str]:
    """Answer sentences that go beyond a restriction a passage states: a passage sentence says the
    statement holds *only* for the values it names (`early stopping works only with `StdOut` or
    `File` metrics collectors`), and an answer sentence on the same subject (two of its words, the
    values aside) lists one of those values with another name written the same way, one the
    restricting passage never names (`... with StdOut, File and TensorFlowEvent`). A value the
    sentence names to leave it out ("but not `RStudio`") is no extra one."""
    rules: list[tuple[dict[str, tuple[bool, bool, bool]], frozenset[str], str]] = []
    for text in passages:
        whole = squash(plain(text))
        for sentence in _SENTENCE.split(plain(text)):
            found = _RESTRICTION.search(sentence)
            if not found:
                continue
            allowed = {squash(v): _shape(v) for v in specifics(sentence[found.end() :]) if _ONE_PIECE.fullmatch(v)}
            if allowed:
                subject = word_set(sentence) - word_set(" ".join(allowed))
                rules.append((allowed, subject, whole))
    if not rules:
        return []
    asked = squash(question)
    out: list[str] = []
    for sentence in _SENTENCE.split(plain(answer)):
        mine = [(squash(v), v) for v in specifics(sentence) if _ONE_PIECE.fullmatch(v)]
        words = word_set(sentence)
        lowered = sentence.lower()
        for allowed, subject, whole in rules:
            named = [at for v, _ in mine if _named(v, set(allowed)) for at in _spots(v, lowered)]
            if len(words & subject) < 2 or not named:
                continue
            shapes = set(allowed.values())
            extra = [
                v
                for v, written in mine
                if not _named(v, set(allowed))
                and _shape(written) in shapes
                and not words_in(v, whole)
                and v not in asked
                and any(abs(at - near) <= _LISTED for at in _spots(v, lowered) for near in named)
                and not _denied(v, lowered)
            ]
            if extra:
                out.append(f"{extra[0]} (a passage restricts it to {', '.join(sorted(allowed)[:4])})")
                break
    return list(dict.fromkeys(out))


#: a value runs on through colons without a space (`http://host:9000/x`, `python:3.11`): cut at the
#: first one, every URL's value was its scheme. It is on the key's line: a YAML key that ends its
#: line (`objective:`) opens a mapping, and its first child key is no value of it
_PAIR = re.compile(
    r"(?<![\w.-])([A-Za-z_][\w.-]*[A-Za-z0-9_])[ \t]*[:=][ \t]*[\"']?([\w./-]+(?::[\w./-]+)*)[\"']?"
)


_SENTENCE = re.compile(r"(?<=[.!?;:])\s+|\n+")


_NEGATION = re.compile(
    r"\b(?:not|no|never|isn't|aren't|doesn't|don't|cannot|can't|won't|neither|nor|without|unsupported)\b",
    re.IGNORECASE,
)


_DECLARATIVE_NEGATION = re.compile(
    r"\b(?:(?:is|are)\s+not|isn't|aren't|(?:does|do)\s+not|doesn't|don't|cannot|can't)\s+"
    r"(?:supported|available|possible|allowed|among|included|listed|part of|support|work|run|exist)\b",
    re.IGNORECASE,
)


#: a passage recurs across a night's traces, and both polarity checks read its sentences: each
#: passage is split and read once
_sentences = TextMemo(_read_sentences, size=2048)
