"""Words, stems and specifics: the string machinery the offline judge's signals share.

Everything here is language-neutral string work (no model, no word lists beyond English stopwords):
words are cut at identifier boundaries as well as spaces, so `min_trials_required` also yields
`min`, `trial`, `required`; stems come from a light suffix stripper, so `reused`, `reusing` and
`reuse` meet, and a compound is stemmed whole as well (`SparkApplications` meets `SparkApplication`,
`KServe` meets `kserve`); invisible format characters (zero-width spaces, bidi marks) are removed before
comparing words, but kept where exact strings are compared (grounding), and words are compared in NFKC
form (full-width `ＫＦＰ` meets `KFP`).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache

from triage.domain.kernel import TextMemo

STOPWORDS = frozenset(
    """a about above after again all also am an and any are as at be been before being below between both but by
    can cannot could did do does doing done don down during each even ever every few for from further get gets
    getting got had has have having he her here hers him his how however i if in into is it its itself just
    let like make makes many may me might more most much must my need needs no nor not now of off on once only or
    other our out over own per please really same see set she should show so some still such than that the their
    them then there these they this those through to too try trying under until up upon us use used using very
    want wants was way we well were what when where whether which while who whom why will with within without
    would yes yet you your yours thing things something anything work works working there's it's i'm don't
    doesn't isn't aren't can't won't didn't wasn't weren't hasn't haven't hadn't shouldn't couldn't wouldn't
    via etc e.g i.e one two our ours able""".split()
)
#: words are cut at apostrophes, so a contraction's head (`doesn` of `doesn't`) is what meets the list
STOPWORDS |= frozenset(w.split("'")[0] for w in STOPWORDS if "'" in w)

_WORD = re.compile(r"[^\W_](?:[\w.\-/]*[^\W_])?")
#: an identifier's parts: runs of capitals, a capital and its lower-case run, digits. An accented
#: letter (or any other non-ASCII one) is a lower-case letter here, so `configuración` is one part,
#: not `configuraci` + `ó` + `n`; Latin-1 capitals (`É`, `Ü`) start a part as A-Z do
_UPPER = "A-Z\u00c0-\u00d6\u00d8-\u00de"
_LOWER = rf"[^\W\d_{_UPPER}]"
_SUBWORD = re.compile(rf"[A-Z]{{2,}}s(?!{_LOWER})|[{_UPPER}]+(?!{_LOWER})|[{_UPPER}]?{_LOWER}+|[0-9]+")
#: a run of letters: what `looks_english` counts as a word
_TOKEN = re.compile(r"[^\W\d_]+", re.UNICODE)
#: an acronym's plural (`GPUs`, `APIs`, `CRDs`): the lower-case `s` is the plural, not a word of its own
_ACRONYM_PLURAL = re.compile(r"[A-Z]{2,}s")
#: a Japanese, Chinese or Korean character; a run of them with their punctuation
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\u3000-\u303f\uff01-\uff0f\uff1a-\uff20]+")

#: a URL ends where CJK text or punctuation begins (`https://.../を参照`, `https://...。`): Japanese and
#: Chinese put no space after it
_URL = re.compile(r"https?://[^\s<>()\[\]`'\"\u3000-\u30ff\u3400-\u9fff\uac00-\ud7af\uff00-\uffef]+")
#: a command-line flag (`--max-trial-count`), not a Markdown rule or an em dash
_FLAG = re.compile(r"(?<![\w-])--[a-zA-Z][\w-]*")
#: an inline code span
_CODE = re.compile(r"`([^`\n]+)`")
#: a fenced code block: its opening line (the info string after the fence), its body, and the closing
#: fence of the same kind (or the end of the text, for a block left open)
FENCE = re.compile(r"^ *(```|~~~)[^\n]*(?:\n(.*?))?(?:^ *\1|\Z)", re.DOTALL | re.MULTILINE)
#: the extensions of the files answers and docs name (`profile.yaml`, `train.py`)
FILE_EXTENSIONS = r"(?:ya?ml|json|py|ipynb|sh|txt|toml|cfg|conf|ini|env|md)"
_IDENT = re.compile(
    r"(?<![\w./-])(?:[A-Za-z_][\w-]*(?:[._/][A-Za-z0-9_-]+)+|[a-z]+[A-Z][A-Za-z0-9]*|[A-Za-z]+_[A-Za-z0-9_]+"
    r"|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)"
)
#: Markdown emphasis with underscores (`__Manage Contributors__`, `_Note_`): the underscores are
#: markup, not part of an identifier. A lower-case single word (`__init__`) is a Python dunder
_EMPHASIS = re.compile(r"(?<!\w)(__?)(?=[^\s_])([^\n]*?[^\s_])\1(?!\w)")
#: ... and a dunder whose underscores are its name
_DUNDER = re.compile(r"__[a-z][a-z0-9_]*__")
#: an abbreviation with points (`e.g.`), no identifier
_ABBREVIATION = re.compile(r"^(?:e\.g|i\.e|etc|vs|a\.k\.a|cf)\.?$", re.IGNORECASE)
#: a unit symbol (`GiB`, `MiB`, `GHz`) looks like a CamelCase identifier but names no setting: "5 GiB"
#: restates a passage's `5Gi`, and its number is what is checked
_UNIT = re.compile(r"^(?:[KMGTPE]i?B|[KMGTPE]i|[kMGT]Hz|[KMGT]bps)$")


def _standing_alone(number: str) -> re.Pattern[str]:
    """`number` with no word character or point on either side (`1.9` is not in `v1.9.0`)."""
    return re.compile(rf"(?<![\w.]){number}(?!\w|\.\w)")


#: a number with its unit (`5Gi`, `30s`, `80%`), a version (`v1.9.0`), a number of two digits or more
_QUANTITY = _standing_alone(r"\d+(?:\.\d+)?(?:[KMGT]i|[KMGT]B|ms|[mkKMGsh%])")
_VERSION = _standing_alone(r"v?\d+\.\d+(?:\.\d+)*")
_NUMBER = _standing_alone(r"\d{2,}")
#: a number with thousands separators (`1,000`, `10,000,000`) is one number, not `1` and `000`
GROUPED_NUMBER = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?![\w,]|\.\w)")


def strip_invisible(text: str) -> str:
    """`text` without format characters (zero-width spaces and joiners, bidi controls)."""
    if text.isascii():
        return text
    return "".join(ch for ch in text if unicodedata.category(ch) != "Cf")


def plain(text: str) -> str:
    """`text` without invisible characters, a typographic apostrophe as a straight one (`isn’t`):
    patterns spell contractions with `'`."""
    return strip_invisible(text).replace("\u2019", "'")


def fold(text: str) -> str:
    """`text` without format characters and in NFKC form, for comparing words: full-width letters
    (`ＫＦＰ`, common in Japanese and Chinese text) and decomposed accents (`e` + U+0301, as macOS
    writes them) become the ordinary ones."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", strip_invisible(text))


def fenced_code(text: str) -> list[str]:
    """The bodies of the fenced code blocks of `text`."""
    return [match.group(2) or "" for match in FENCE.finditer(text)]


def quotes_code(text: str) -> bool:
    """`text` holds inline code or a fenced code block."""
    return bool(_CODE.search(text) or FENCE.search(text))


def without_code(text: str) -> str:
    """`text` with its fenced code blocks and inline code spans as a space each: what is left is prose."""
    return _CODE.sub(" ", FENCE.sub(" ", text))


def _squash(text: str) -> str:
    """Lower case, runs of whitespace as one space: how strings are compared."""
    return _SPACES.sub(" ", text).strip().lower()


_SPACES = re.compile(r"\s+")
#: every check squashes the trace's passages again: each text once (bounded: 2,048 results of at
#: most 8,000 characters)
squash = TextMemo(_squash, size=2048, max_chars=8_000)


def squash_joined(texts: Iterable[str]) -> str:
    """`squash` of the texts joined by newlines, from each text's own (remembered) squash."""
    return " ".join(part for part in map(squash, texts) if part)


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light suffix stripper: plural, -ing, -ed (-ies and -ied as -y), -ly, a final -e; enough to match
    word forms."""
    w = word.lower()
    if len(w) <= 3 or not w.isalpha():
        return w
    if w.endswith(("ies", "ied")) and len(w) > 4:
        w = w[:-3] + "y"  # specifies, specified -> specify
    elif w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    for suffix in ("ing", "ed", "ly"):
        if w.endswith("eed"):
            break  # no past tense of a verb in -e (succeed, proceed, speed): the -eed rule below
        if suffix == "ly" and w.endswith("ply"):
            break  # a verb in -ply (apply, supply, comply), not an adverb: `apply` is not `app`
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "lsz":
                w = w[:-1]  # running -> run, stopped -> stop
            break
    if w.endswith("eed"):
        w = w[:-1]  # succeed, succeeded, succeeding -> succee (then succe); agreed -> agree
    if w.endswith("ie") and len(w) > 4:
        w = w[:-2] + "y"  # cookie, as its plural cookies -> cooky
    elif w.endswith("e") and len(w) > 4:
        w = w[:-1]
    if w.endswith("ll") and len(w) > 4:
        w = w[:-1]  # controlled -> control, as install -> instal and labelled -> label (labeled)
    return w


def _stem(token: str) -> str:
    """`stem` of a token as written: an acronym's plural loses its `s` (`GPUs` meets `GPU`), which
    the lower-cased word cannot tell from a word in -us or -is (`status`, `analysis`)."""
    if _ACRONYM_PLURAL.fullmatch(token):
        return token[:-1].lower()
    return stem(token.lower())


def words(text: str) -> list[str]:
    """Stemmed content words of `text`, identifiers whole and in parts, stopwords dropped.

    CJK text has no spaces: each CJK character pair counts as a word there, and the words written
    between CJK characters (`SparkApplicationの設定`) are read as in any other text."""
    text = fold(text)
    out: list[str] = []
    for token in _WORD.findall(text):
        if not token.isascii() and _CJK.search(token):
            chars = [c for c in token if _CJK.match(c)]
            out += [a + b for a, b in zip(chars, chars[1:], strict=False)]
            out += words(_CJK.sub(" ", token))  # the words between, as in any text: compounds whole
            continue
        parts = [p for p in _SUBWORD.findall(token) if p]
        if _content(token):
            out.append(_stem(token))
        if len(parts) > 1:
            out += [_stem(p) for p in parts if _content(p)]
    return out


def _content(token: str) -> bool:
    """A content word: no stopword, three letters or more, or a two-letter acronym (`UI`, `ML`) whole
    or as a part (`AI/ML`, `UI-based`)."""
    low = token.lower()
    return low not in STOPWORDS and (len(low) >= 3 or (len(low) == 2 and token.isupper()))


def word_set(text: str) -> frozenset[str]:
    """The set of `words(text)`; remembered, since a trace's passages recur across traces and
    several checks read the same text."""
    return _word_sets(text)


_word_sets = TextMemo(lambda text: frozenset(words(text)), size=4096)


def word_union(texts: Iterable[str]) -> frozenset[str]:
    """`word_set` of the texts joined by newlines, from each text's own (remembered) set: no word
    runs across a line break."""
    return frozenset().union(*(word_set(t) for t in texts))


def _unemphasise(match: re.Match[str]) -> str:
    return match.group(0) if _DUNDER.fullmatch(match.group(0)) else f" {match.group(2)} "


def _prose_pair(ident: str) -> bool:
    """Function words joined by a slash or a point (`and/or`, `on/off`, `in/out`): prose, no identifier."""
    return all(part.lower() in STOPWORDS for part in re.split(r"[._/]", ident))


def specifics(answer: str) -> list[str]:
    """The checkable specifics of a text (URLs, flags, code spans, identifiers, versions, numbers), in
    order of appearance, without repeats."""
    found: list[str] = []
    without_urls = _URL.sub(" ", answer)
    found += [u.rstrip(".,;:!?*") for u in _URL.findall(answer)]  # `**https://...**` is bold
    found += _FLAG.findall(without_urls)
    found += [c.strip() for c in _CODE.findall(answer)]  # as written, a URL inside too
    plain = _EMPHASIS.sub(_unemphasise, _CODE.sub(" ", without_urls))
    if not plain.isascii():
        plain = _CJK_RUN.sub(r" \g<0> ", plain)  # CJK text is no part of a word: `設定spec.x`, `ポート9090で`
    found += [i.rstrip(".,;:") for i in _IDENT.findall(plain) if not _prose_pair(i)]
    found += _VERSION.findall(plain)
    found += _QUANTITY.findall(plain)
    found += GROUPED_NUMBER.findall(plain)
    found += _NUMBER.findall(GROUPED_NUMBER.sub(" ", _VERSION.sub(" ", plain)))
    return [s for s in dict.fromkeys(found) if s and not _ABBREVIATION.match(s) and not _UNIT.match(s)]


class Pool:
    """Document frequencies over the passages of one trace (retrieved and re-searched): a term's
    weight is its inverse document frequency there, so words every passage shares count little and
    a term no passage holds counts most."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.sets = [word_set(t) for t in texts]
        self.df: Counter[str] = Counter()
        for s in self.sets:
            self.df.update(s)
        self.n = len(texts)

    def idf(self, term: str) -> float:
        return math.log((self.n + 1) / (self.df.get(term, 0) + 0.5))

    def holds(self, name: str) -> bool:
        """Whether some text of the pool holds `name` as one of its words."""
        return self.df[name] > 0

    def weighted_coverage(self, terms: Iterable[str], have: frozenset[str] | set[str]) -> float:
        """The share of the terms' total weight that `have` holds (0 when there are no terms)."""
        terms = set(terms)
        total = sum(self.idf(t) for t in terms)
        if total <= 0:
            return 0.0
        return sum(self.idf(t) for t in terms if t in have) / total


def looks_english(text: str) -> bool:
    """True when `text` reads as English: enough of its words are English function words."""
    text = fold(text)
    # code and URLs are no language: an English sentence around `trainer.kubeflow.org/v1alpha1` is
    # English (their words count only when nothing else is there)
    prose = without_code(_URL.sub(" ", text))
    tokens = [t.lower() for t in _TOKEN.findall(prose)] or [t.lower() for t in _TOKEN.findall(text)]
    if not tokens:
        return True
    if not any(t.isascii() for t in tokens):
        return False
    return sum(t in STOPWORDS for t in tokens) / len(tokens) >= 0.15


PLACEHOLDER = re.compile(
    r"<[^<>\s]+>|\$\{?[A-Z_][A-Z0-9_]*\}?|\b(?:my|your|our)(?:[_-][\w.-]*)?\b|\b(?:example|foo|bar)\b|\.\.\.",
    re.IGNORECASE,
)


def words_in(words: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(words)}(?!\w)", text) is not None
