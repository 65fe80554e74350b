"""Grounding: is every specific of the answer in what the agent saw, and does none contradict it?

- **unsupported specifics**: URLs, flags, code spans, identifiers, versions and numbers of the answer
  found in no text the agent saw (question, tool outputs, passages, their URLs). Exempt: a
  specific the question itself supplies, a placeholder (`<namespace>`, `${NAME}`, `my_pipeline.py`),
  a number that is arithmetic on two numbers shown (a sum, difference, product or ratio), and a
  code span made only of seen words (a command line reworded). Exact strings are compared, so a
  zero-width space inside `kubectl` makes it unsupported.
- **contradictions**: a `key: value` / `key=value` of the answer whose key the passages give with
  another value and never with this one; an answer sentence that negates a term ("X is not
  supported", "no X") which a passage states without negation; an answer sentence that names a
  value beside the ones a passage restricts the same statement to ("works only with `StdOut` or
  `File`": the answer adds `TensorFlowEvent`).
- **support outside the answering passages**: a specific seen by the agent, but only in passages
  other than the ones that answer the question (and outside any span the answer quotes from a
  passage). A token seen somewhere is no support: such an answer may be grounded, never surely.
- **no answer**: an empty or whitespace answer is not grounded (and not a decline): the agent failed.
- **names the answer may use** without a passage holding them: a passage's template filled in and
  the names the answer's own code binds (the last section).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from triage.judges.offline.contradictions import (
    affirmed_negations,
    negation_contradictions,
    restriction_contradictions,
    swaps,
)
from triage.judges.offline.declines import declines
from triage.judges.offline.text import (
    FILE_EXTENSIONS,
    GROUPED_NUMBER,
    PLACEHOLDER,
    fenced_code,
    looks_english,
    specifics,
    squash,
    squash_joined,
    strip_invisible,
    word_set,
    word_union,
    words_in,
)

_NUM = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w|\.\w)")


def _ungroup(match: re.Match[str]) -> str:
    return match.group(0).replace(",", "")


def answer_text(answer: str) -> str:
    """The answer's prose: a JSON object answer is read for its string values (an agent that leaked
    its structured output still said something), other answers as they are."""
    stripped = answer.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        try:
            data = json.loads(stripped)
        except ValueError:
            return answer
        if isinstance(data, dict):
            texts = [
                v for k, v in data.items() if isinstance(v, str) and k.lower() not in ("confidence", "id")
            ]
            texts += [s for v in data.values() if isinstance(v, list) for s in v if isinstance(s, str)]
            return "\n".join(texts) if texts else answer
    return answer


def _numbers(text: str) -> set[Fraction]:
    out: set[Fraction] = set()
    for m in _NUM.findall(text):
        try:
            out.add(Fraction(m))
        except (ValueError, ZeroDivisionError):
            continue
    return out


def arithmetic(value: str, shown: set[Fraction], limit: int = 40) -> bool:
    """`value` is a sum, difference, product or ratio of two shown numbers (or of one with itself)."""
    try:
        target = Fraction(value)
    except (ValueError, ZeroDivisionError):
        return False
    small = sorted(shown)[:limit]
    for i, a in enumerate(small):
        for b in small[i:]:
            if target in (a + b, abs(a - b), a * b) or (b and target == a / b) or (a and target == b / a):
                return True
    return False


@dataclass
class Grounding:
    """What the grounding checks found."""

    unsupported: list[str] = field(default_factory=list)
    contradictions: list[str] = field(default_factory=list)
    checked: int = 0  # specifics checked (after the exemptions)
    empty: bool = False
    #: the share of the answer's content words (declining sentences and the question's words left
    #: out) found in what the agent saw; None when the answer has too few to tell
    prose_support: float | None = None
    #: the answer's words with an invisible character inside (also among `unsupported`)
    invisible: list[str] = field(default_factory=list)
    #: the answer's `key: value` where the question's value replaces the passages' (their example
    #: filled in for the user): no contradiction, but grounded only as far as the example fits
    filled: list[str] = field(default_factory=list)
    #: specifics seen by the agent only outside the passages that answer (`check`'s `answering`) and
    #: outside the spans the answer quotes from a passage: seen, but not supported where it matters
    outside: list[str] = field(default_factory=list)
    #: where there are `contradictions`, those the passages that answer make themselves
    against_answering: list[str] = field(default_factory=list)
    #: terms the passages that answer deny and the answer states (`affirmed_negations`)
    affirmed: list[str] = field(default_factory=list)

    @property
    def grounded(self) -> bool:
        return not self.empty and not self.unsupported and not self.contradictions


def _seen_words(token: str, haystack_words: set[str]) -> bool:
    parts = [p for p in re.split(r"[^\w]+", token.lower()) if len(p) > 1]
    return all(p in haystack_words for p in parts)


_KEY_PATH = re.compile(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)+")
_KIND_NAME = re.compile(r"[A-Z][A-Za-z]+/[a-z0-9][\w.-]*")


def _page_seen(needle: str, haystack: str) -> bool:
    """A URL whose page is seen: an anchor (`.../profiles/#manage-contributors`) or a missing or
    extra trailing slash names the same page, no new claim."""
    if not needle.startswith(("http://", "https://")):
        return False
    page = needle.split("#", 1)[0].rstrip("/")
    if page == needle or page.count("/") < 3:
        return False  # nothing to take off, or only a host left: the plain check decides
    return re.search(re.escape(page) + r"(?=[/#\s)\]>\"'`,;]|$)", haystack) is not None


def _seen_call_chain(needle: str, haystack: str, haystack_words: set[str]) -> bool:
    """A call or a chain of calls (`kfp.Client().set_user_namespace("<ns>")`) where every link's name
    is seen as a call and every argument word is seen or a placeholder."""
    if "(" not in needle:
        return False
    links = [link for link in re.split(r"\)\s*\.", needle) if link.strip()]
    for link in links:
        head, paren, args = link.partition("(")
        head = head.strip(" .")
        if not head or (f"{head}(" not in haystack and f"{head.rsplit('.', 1)[-1]}(" not in haystack):
            return False
        if not _seen_words(PLACEHOLDER.sub(" ", args), haystack_words):
            return False
    return True


_EMOJI = "\u2600-\u27bf\U0001f000-\U0001faff"
_EMOJI_JOINER = re.compile(rf"(?<=[{_EMOJI}\ufe0f])\u200d(?=[{_EMOJI}])")


def invisible_marks(answer: str) -> list[str]:
    """Words of the answer with an invisible character inside (`kube\u200bctl`): pasted, they fail."""
    if answer.isascii():
        return []
    # a byte-order mark opening the text, and the joiner inside an emoji sequence (🧑‍💻), are
    # invisible by design: no word holds them
    text = _EMOJI_JOINER.sub("", answer.lstrip().removeprefix("\ufeff"))
    found = []
    for token in re.findall(r"\S+", text):
        stripped = strip_invisible(token)
        if stripped != token and stripped.strip():
            found.append(f"{stripped.strip('`.,;:')} (with an invisible character)")
    return list(dict.fromkeys(found))


def _whole_number_in(number: str, haystack: str) -> bool:
    return re.search(rf"(?<![\d.,]){re.escape(number)}(?!\d|[.,]\d)", haystack) is not None


#: a CamelCase name in the plural (`SparkApplications`, `InferenceServices`): prose's plural of a kind
_KIND_PLURAL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+s")

#: a file name: what comes before its extension
_FILE_NAME = re.compile(rf"([\w.-]+)\.{FILE_EXTENSIONS}")

#: hyphens, underscores and spaces: one separator when a specific is compared with the question
_SEPARATORS = re.compile(r"[-_\s]+")


def unsupported_specifics(answer: str, seen: Iterable[str], question: str = "") -> tuple[list[str], int]:
    """Specifics of `answer` in none of the texts seen, and how many were checked."""
    texts = list(seen)
    haystack = squash_joined(texts)
    q = squash(question)
    q_spaced = _SEPARATORS.sub(" ", q)
    # made when first needed: most specifics are found in the haystack itself
    words_seen: set[str] | None = None
    shown: set[Fraction] | None = None
    templates: list[tuple[str, ...]] | None = None

    def haystack_words() -> set[str]:
        nonlocal words_seen
        if words_seen is None:
            words_seen = {w for w in re.split(r"[^\w]+", haystack) if w}
        return words_seen

    bound = bound_names(answer)
    missing: list[str] = []
    checked = 0
    ungrouped: str | None = None  # the haystack with `1,000` as `1000`, made when first needed
    for item in specifics(answer):
        needle = squash(item)
        number = _NUM.fullmatch(needle) is not None
        if not needle or (_whole_number_in(needle, q) if number else needle in q):
            continue
        if (
            not number
            and _SEPARATORS.search(needle)
            and words_in(_SEPARATORS.sub(" ", needle).strip(), q_spaced)
        ):
            continue  # the question's own words, joined: "simulated annealing" as `simulated-annealing`
        if not number and bound and own_name(needle, bound, haystack_words()):
            continue  # the answer's own variable (`lgbm_task` in its `lgbm_task = train_lgbm()`)
        named = _FILE_NAME.fullmatch(needle)
        if named and re.search(r"[-_\d]", named.group(1)) and words_in(named.group(1), q):
            # a file named after the question's own name (`ml-research.yaml` for "ml-research"); a
            # plain word is no name (`profile.yaml` for "a profile" is the answer's choice)
            continue
        if PLACEHOLDER.search(item) and not _seen_call_chain(needle, haystack, haystack_words()):
            # a template: what is left once the placeholders are cut out must still be seen
            rest = [squash(part) for part in PLACEHOLDER.split(item)]
            rest = [part for part in rest if len(re.sub(r"[^\w]", "", part)) > 2]
            checked += bool(rest)
            if any(part not in haystack for part in rest):
                missing.append(item)
            continue
        checked += 1
        if _whole_number_in(needle, haystack) if number else needle in haystack:
            continue  # a number is seen as a number: `90` is not inside `9090`, `10` not in `v1.10`
        if " " in needle and all(tok in haystack for tok in needle.split() if len(tok) > 1):
            continue  # a code span made only of seen tokens (a command line, reworded)
        if _seen_call_chain(needle, haystack, haystack_words()):
            continue  # seen calls with seen arguments: `.set_caching_options(True)`
        if _page_seen(needle, haystack):
            continue  # the page is seen; the anchor or slash is the answer's own
        if _KEY_PATH.fullmatch(item) and all(f"{seg.lower()}:" in haystack for seg in item.split(".")):
            continue  # a path of nested YAML keys, each one seen as a key: `runtimeRef.name`
        if _KIND_NAME.fullmatch(item) and all(part.lower() in haystack_words() for part in item.split("/")):
            continue  # Kubernetes `Kind/name` notation for a seen kind and a seen name
        if _KIND_PLURAL.fullmatch(item) and item[:-1].lower() in haystack_words():
            continue  # a seen kind in the plural, as prose writes it: `SparkApplications`
        if GROUPED_NUMBER.fullmatch(needle) and _whole_number_in(needle.replace(",", ""), haystack):
            continue  # `1,000` where the passages write `1000`
        if number:
            ungrouped = GROUPED_NUMBER.sub(_ungroup, haystack) if ungrouped is None else ungrouped
            if _whole_number_in(needle, ungrouped):
                continue  # `1000` where the passages write `1,000`
        if _NUM.fullmatch(needle.replace(",", "")):
            shown = _numbers("\n".join(texts)) if shown is None else shown
            if arithmetic(needle.replace(",", ""), shown):
                continue
        if not number:
            templates = templates_of("\n".join(texts)) if templates is None else templates
            if fills_template(needle, templates):
                continue  # a documented template filled in: `kubeflow-view` for `kubeflow-<USER_ROLE>`
        missing.append(item)
    return missing, checked


#: a span the answer quotes is long enough to name its passage from this many characters on
QUOTED_SPAN = 20
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_DOUBLE_QUOTED = re.compile(rf'"([^"\n]{{{QUOTED_SPAN},}})"')


def quoted_spans(answer: str, passages: Sequence[str]) -> list[str]:
    """The spans the answer quotes (code spans, lines of fenced code, text in double quotes) that a
    passage holds verbatim (whitespace and case aside): there the answer shows its source itself.
    A quote is a run of words (three or more, `QUOTED_SPAN` characters or more): one long token is
    a token, however long, and a token seen somewhere is no support."""
    spans = [*_CODE_SPAN.findall(answer), *_DOUBLE_QUOTED.findall(answer)]
    spans += [line for block in fenced_code(answer) for line in block.splitlines()]
    held = [squash(strip_invisible(p)) for p in passages]
    out = []
    for span in spans:
        text = squash(strip_invisible(span))
        if len(text) >= QUOTED_SPAN and len(text.split()) >= 3 and any(text in p for p in held):
            out.append(text)
    return out


def outside_support(
    answer: str, answering: Sequence[str], passages: Sequence[str], question: str = ""
) -> list[str]:
    """The specifics of `answer` that the question and the `answering` passages do not hold (each
    one checked as `unsupported_specifics` checks it), and that no span the answer quotes from one
    of `passages` holds: wherever else they were seen, they are not supported where it matters."""
    missing = unsupported_specifics(answer, [question, *answering], question)[0]
    if not missing:
        return []
    quoted = quoted_spans(answer, passages)
    return [s for s in missing if not any(squash(s) in q for q in quoted)]


MIN_PROSE_WORDS = 6


def prose_support(answer: str, seen: Sequence[str], question: str = "") -> float | None:
    """The share of the answer's content words found in what the agent saw.

    Sentences with a decline phrase are left out (they talk about the docs, not about Kubeflow), and
    so are the question's own words. A faithful answer paraphrases, but most of its words are the
    passages' words; an answer written from memory is not."""
    if not looks_english(answer):
        return None  # the passages are English: a translated answer shares few of their words
    kept = [
        s for s in re.split(r"(?<=[.!?;])\s+|\n+", strip_invisible(answer)) if s.strip() and not declines(s)
    ]
    mine = word_set(" ".join(kept)) - word_set(question)
    if len(mine) < MIN_PROSE_WORDS:
        return None
    theirs = word_union(seen)
    return len(mine & theirs) / len(mine)


def check(
    answer: str,
    seen: Sequence[str],
    passages: Sequence[str],
    question: str = "",
    answering: Sequence[str] | None = None,
) -> Grounding:
    """Every grounding check on `answer` against what the agent saw. `answering`: the texts of the
    passages that answer the question (None: unknown, every passage counts). A restriction is read
    from them, and a specific seen only outside them is `Grounding.outside`."""
    if not answer.strip():
        return Grounding(empty=True)
    text = answer_text(answer)
    missing, checked = unsupported_specifics(text, seen, question)
    marks = invisible_marks(text)
    swapped, filled = swaps(text, passages, seen, question)
    negated = negation_contradictions(text, passages, question)
    restricted = restriction_contradictions(text, passages if answering is None else answering, question)
    contradictions = swapped + negated + restricted
    prose = prose_support(text, seen, question)
    outside: list[str] = []
    against: list[str] = []
    if answering is not None:
        outside = [s for s in outside_support(text, answering, passages, question) if s not in missing]
        if swapped or negated:
            # which of them the passages that answer make themselves (another page may be about
            # another thing)
            against = swaps(text, answering, seen, question)[0] + negation_contradictions(text, answering, question)
        against += restricted
    return Grounding(
        marks + missing,
        contradictions,
        checked,
        prose_support=prose,
        invisible=marks,
        filled=filled,
        outside=outside,
        against_answering=against,
        affirmed=affirmed_negations(text, passages if answering is None else answering),
    )


# -- names the answer may use ------------------------------------------------------------------------
#
# Names the answer may use without a passage holding them: a passage's template filled in
# (`kubeflow-view` for `kubeflow-<USER_ROLE>`) and the names the answer's own code binds
# (`lgbm_task = ...`). Both are read in linear time (a long name costs no backtracking).

#: a placeholder in a passage's name (`kubeflow-<USER_ROLE>`, `user-${EMAIL}-edit`): the name is a
#: template the answer may fill in
_TEMPLATE_SLOT = re.compile(r"<[A-Z][A-Z0-9_]*>|\$\{[A-Z][A-Z0-9_]*\}")
#: a template's reach on either side of a placeholder: bounded, so a long run of word characters
#: costs linear time
_NAME_BEFORE = re.compile(r"[\w./:-]{0,80}\Z")
_NAME_AFTER = re.compile(r"(?:[\w./:-]|<[A-Z][A-Z0-9_]*>|\$\{[A-Z][A-Z0-9_]*\})*")
#: a slot is filled by one name: these characters, at least one
_FILL = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.@-")
#: a Kubernetes name is at most 253 characters; longer needles are no filled-in template
_MAX_NAME = 253
_MAX_SLOTS = 3
_EXTENSION = re.compile(rf"\.{FILE_EXTENSIONS}$")


def templates_of(text: str) -> list[tuple[str, ...]]:
    r"""The templates of `text`, each as its literal parts (lower case) around its placeholders. A
    template needs a literal part of three characters or more besides a file extension (`<NAME>`
    or `<NAME>.yaml` alone fits anything), and at most three placeholders."""
    found: dict[tuple[str, ...], None] = {}
    for slot in _TEMPLATE_SLOT.finditer(text):
        before = _NAME_BEFORE.search(text, max(0, slot.start() - 80), slot.start())
        after = _NAME_AFTER.match(text, slot.end(), slot.end() + 80)
        template = (before.group(0) if before else "") + slot.group(0) + (after.group(0) if after else "")
        template = template.rstrip(".:/-")  # a sentence's period, a colon: no part of the name
        parts = tuple(part.lower() for part in _TEMPLATE_SLOT.split(template))
        if len(parts) - 1 > _MAX_SLOTS:
            continue
        if max(len(_EXTENSION.sub("", part).strip("-_./:")) for part in parts) < 3:
            continue
        found[parts] = None
    return list(found)


def _fills(name: str, parts: tuple[str, ...]) -> bool:
    """`name` is the template `parts` with each slot filled by one name (`_FILL` characters). The
    literals are found left to right, each slot taking what lies between: linear, no backtracking
    (the earliest place for each literal leaves the most room for the rest)."""
    if len(name) < len(parts[0]) + len(parts[-1]) + 1:
        return False
    if not name.startswith(parts[0]) or not name.endswith(parts[-1]):
        return False
    at, end = len(parts[0]), len(name) - len(parts[-1])
    for literal in parts[1:-1]:
        found = name.find(literal, at + 1, end) if literal else at + 1
        if found < 0 or not _FILL.issuperset(name[at:found]):
            return False
        at = found + len(literal)
    return end > at and _FILL.issuperset(name[at:end])


def fills_template(needle: str, templates: Sequence[tuple[str, ...]]) -> bool:
    """`needle` (lower case), or the name of its `Kind/name`, is a passage's template filled in."""
    if len(needle) > _MAX_NAME:
        return False
    names = {needle}
    if needle.count("/") == 1 and ":" not in needle:
        names.add(needle.split("/")[1])  # `clusterrole/kubeflow-view`
    return any(_fills(name, parts) for parts in templates for name in names)


#: a name the answer's own code binds (`lgbm_task = train_lgbm()`, `for trial in ...`, `with ... as
#: client`, `def make_op(`): the answer's variable, no claim about Kubeflow
_BOUND = re.compile(
    # `a, b = ...` and `x: int = ...` (a Python annotation; YAML's `args: --epochs=10` is none)
    r"^[ \t]*(?:(?:async[ \t]+)?def[ \t]+(\w+)|(\w+(?:[ \t]*,[ \t]*\w+)*)[ \t]*(?::[ \t]*[\w\[\]., ]+)?=(?!=)"
    r"|for[ \t]+(\w+)[ \t]+in\b)|\bas[ \t]+(\w+)[ \t]*:",
    re.MULTILINE,
)


def bound_names(answer: str) -> set[str]:
    """The names the answer's fenced code binds, lower case (a one-letter name is none). Only lines
    outside brackets bind: `pip_extra_index_url='...'` inside a call is a keyword argument, a claim."""
    names: set[str] = set()
    for block in fenced_code(answer):
        depth = 0
        for line in block.splitlines():
            if depth == 0:
                for match in _BOUND.finditer(line):
                    found = (n for group in match.groups() if group for n in re.split(r"[ \t]*,[ \t]*", group))
                    names.update(n.lower() for n in found if len(n) > 1)
            depth = max(0, depth + sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}"))
    return names


def own_name(needle: str, bound: set[str], haystack_words: set[str]) -> bool:
    """`needle` is a bound name, or an attribute or call of one whose names are seen
    (`lgbm_task.output`; not an invented `client.magic_resume_all()`)."""
    head, _, rest = needle.partition(".")
    if not bound or re.split(r"[(\[]", head, maxsplit=1)[0] not in bound:
        return False
    return all(word in haystack_words for word in re.findall(r"[a-z_][a-z0-9_]*", rest))
