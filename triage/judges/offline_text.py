"""Words, stems and specifics: the string machinery the offline judge's signals share.

Everything here is language-neutral string work (no model, no word lists beyond English stopwords):
words are cut at identifier boundaries as well as spaces, so `min_trials_required` also yields
`min`, `trial`, `required`; stems come from a light suffix stripper, so `reused`, `reusing` and
`reuse` meet, and a compound is stemmed whole as well (`SparkApplications` meets `SparkApplication`,
`KServe` meets `kserve`); invisible format characters (zero-width spaces, bidi marks) are removed before
comparing words, but kept where exact strings are compared (grounding), and words are compared in NFKC
form (full-width `ＫＦＰ` meets `KFP`).

Decline phrases: the answer declares the topic not covered (or says it could not find it).

English first, then the languages users of a docs agent commonly write in (Spanish, Portuguese,
French, German, Italian, Dutch, Swedish, Polish, Czech, Russian, Ukrainian, Turkish, Arabic, Hebrew,
Hindi, Japanese, Chinese, Korean, Vietnamese, Indonesian, Thai). Phrases are about the act of not
finding or the docs not saying; a plain negation ("X is not supported") is a claim, not a decline.

Phrase lists never end (agents write "the excerpts are silent on", "none of the 5 results mention",
"the material available to me doesn't list"), so English has a second check by cues: a sentence that
names what the agent read or searched (`_SOURCE`) and says, in the same breath, that it does not tell
(`_UNTOLD`: a negation right before a verb of telling or finding, "no mention", "nothing about").
"The docs say you don't need to restart" names the docs and negates, but not the telling.
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


#: what an agent calls the texts it read. Not "they", "text", "index" or bare "results": "pods restart,
#: and they don't show logs", "the trial results don't include the metric" are claims
_DOCS = (
    r"(?:docs|documentation|documents?|pages?|guides?|overview|passages?|search results|sources?|context"
    r"|excerpts?|snippets?|material|articles?)"
)
#: what the texts fail to do
_TELL_VERBS = (
    "mention|cover|say|describe|document|explain|include|list|show|give|address|specify|state|discuss"
    "|contain|detail|answer|settle|provide|talk about|touch on|go into"
)
_TELL = f"(?:{_TELL_VERBS})"
#: "the 5 results", "the four results": a search's, not a trial's
_COUNT = r"(?:\d+|two|three|four|five|six|seven|eight|nine|ten)"
_EN = [
    # "we" as well as "I": agents speak for their team as often as for themselves
    r"\b(?:i|we) (?:do not|don't|dont|didn't|didnt|did not) (?:have|find|see(?! your)|know)\b",
    r"\b(?:i|we) have (?:no|nothing) (?:data|information|info|details|idea|answer|documentation)\b",
    r"\bnothing (?:reliable|useful|definitive|concrete|documented) to (?:tell|say|offer|give)\b",
    r"\b(?:i|we|i'm|we're|i am|we are)"
    r" (?:could not|couldn't|couldnt|can't|cant|cannot|can not|was unable to|am unable to|are unable to|were unable to"
    r"|unable to|not able to|wasn't able to|was not able to|weren't able to|were not able to|haven't been able to"
    r"|have not been able to|never managed to|didn't manage to|can't seem to|couldn't seem to)"
    r" (?:find|found|tell|confirm|locate|see(?! your)|determine|say|answer|work out|turn up|pin down|verify"
    r"|(?:pin|nail) (?:this|it|that) down)\b",
    r"\b(?:unable|not able) to (?:find|locate|confirm)\b",
    r"\b(?:i|we) (?:found|came across|turned up|came up with) (?:no|nothing|none)\b",
    r"\b(?:couldn't|could not|can't|cannot) (?:find|dig up|turn up|locate|come up with) (?:anything|any information)\b",
    r"\b(?:my|our|the) (?:search|searches|query|queries)(?: \w+)? (?:didn't|did not|couldn't"
    r"|could not) (?:turn up|find|return|surface)\b",
    # "got zero hits", "the search returned 0 results"; not "the selector returns no results"
    r"\bgot (?:zero|0|no) (?:relevant )?hits\b|\b(?:i|we) (?:got|found) (?:zero|no|0) (?:relevant )?"
    r"(?:results|matches)\b|\b(?:search|searches|query|queries) (?:returned|gave) (?:zero|no|0) (?:relevant )?"
    r"(?:hits|matches|results)\b",
    # "unable to determine from the available sources", "no indexed page describes it"
    r"\b(?:unable|not able) to (?:determine|answer|tell|say)(?: (?:this|that|it))?"
    r" (?:from|based on) (?:the|my|our|what)\b",
    r"\bno (?:\w+ )?(?:page|passage|source|document|result)s? (?:describes?|mentions?|covers?|says?|explains?)\b",
    r"\b(?:i|we) have no documented\b|\bnot aware of any (?:documented|mention|page|documentation)\b",
    r"\bnot found in the (?:\w+ )?(?:docs|documentation|pages|sources|index)\b",
    rf"\b(?:answer|information|this) (?:isn't|is not|wasn't|was not) in the (?:\w+ ){{0,2}}{_DOCS}\b",
    rf"\b{_DOCS} (?:are|is|were|was|stay|stays|remain|remains) silent (?:on|about)\b",
    rf"\b{_DOCS}(?: (?:retrieved|provided|found|here))? (?:offer|offers|give|gives|provide|provides|make|makes|have|has"
    r"|contain|contains|hold|holds) no (?:explanation|mention|reference|information|details?|answer|guidance)\b",
    r"\b(?:does not|doesn't|do not|don't) appear (?:anywhere )?in the (?:\w+ ){0,2}(?:docs|documentation"
    r"|pages)\b",
    # "there's nothing on this", not "if there's nothing on port 8080"
    r"\b(?:can't|cannot|can not) help with (?:this|that)(?: one)?\b"
    r"|\bthere(?:'s| is) (?:\w+ )?nothing (?:about|on (?:this|that|it)\b)",
    r"\bnot something (?:i|we) (?:could|can|was able to|were able to) (?:find|locate|confirm)\b",
    # "the docs is not having this info"; not "the operator doesn't have INFO logging"
    rf"\b{_DOCS} (?:is not|are not|isn't|aren't|do not|does not|don't|doesn't|not) (?:have|having|has|contain"
    r"|containing) (?:this |that |the |any |such |much |enough )?info(?:rmation)?\b",
    # a status line: "Answer: unknown", "status: not_found"; not a condition's "status: Unknown"
    r"\b(?:answer|result)\s*[:=]\s*[\"']?(?:unknown|not[_ ]found|n/a)\b|\bstatus\s*[:=]\s*[\"']?not_found\b",
    r"\b(?:i|we) (?:haven't|have not|never) (?:found|seen|come across)\b",
    r"\bcame up empty\b",
    r"\bnothing (?:i|we) (?:found|read|retrieved|saw|have|got) (?:\w+ )?(?:describes?|mentions?|covers?|says?|explains?"
    r"|documents?|addresses?)\b|\bnot as far as the (?:docs|documentation|pages|sources) (?:go|goes|say|tell)\b",
    r"\bfound nothing\b",
    r"\bno (?:relevant |specific |such )?(?:information|mention|documentation|details?) (?:about|on|of|regarding|in)\b",
    # "No relevant results." opening a sentence; not "the selector returns no results for it"
    r"(?:^|[.!?:] )no (?:relevant )?(?:results?|matches|hits)\b",
    r"\bno documented (?:way|option|setting|method|support|mechanism|feature)\b",
    r"\b(?:is|are|was|were) not (?:covered|documented|mentioned|described|explained|listed|addressed)\b",
    r"\b(?:isn't|aren't|wasn't|weren't) (?:covered|documented|mentioned|described|explained|listed|addressed)\b",
    r"\bnot (?:covered|documented|mentioned|described) (?:in|by|on) the\b",
    # "the pages I found don't say", "the sources retrieved do not address", "the docs never state"
    rf"\b{_DOCS}(?: (?:i|we) (?:found|searched|retrieved|got|read|checked|consulted|have access to|have|was given))?"
    r"(?: (?:retrieved|provided|found|returned|available|shown|here))?"
    r" (?:do not|don't|does not|doesn't|did not|didn't|never)(?: (?:seem to|appear to|actually|really|explicitly))?"
    rf" {_TELL}(?:s|es)?\b",
    r"\b(?:doesn't|does not|don't|do not|didn't|did not) (?:mention|cover|describe|document|explain)\b",
    rf"\bnone of (?:the |them |these |those )?(?:(?:{_COUNT} )?(?:{_DOCS}|results) )?(?:(?:i|we) \w+ )?"
    rf"{_TELL}(?:s|es)?\b",
    rf"\bnowhere do(?:es)? (?:they|the {_DOCS}) {_TELL}\b",
    rf"\b{_DOCS}\b[^.!?]{{0,80}}? but never {_TELL}\b",
    r"\b(?:says?|said|mentions?|tells?) nothing (?:about|on|of)\b",
    r"\bneither (?:of them |page |one |source )?(?:mentions|covers|says|describes|documents|explains)\b",
    r"\bnothing in the (?:\w+ )?(?:docs|documentation|search results|pages|passages|results|sources)\b",
    r"\b(?:there is|there's) no (?:documentation|information|mention|page)\b",
    r"\b(?:there|it) (?:doesn't|does not) (?:seem|appear) to be (?:any |a )?(?:documentation|information"
    r"|mention|page)\b",
    r"\bnot something (?:the|that the) (?:\w+ )?(?:docs|documentation|pages) (?:seem to "
    r"|appear to )?(?:address|cover|describe)\b",
    r"\b(?:goes|is|'s|falls|lies) (?:past|beyond|outside) (?:what|the scope of) (?:the |my |our "
    rf"|what the )?(?:\w+ ){{0,2}}{_DOCS}\b",
    r"\b(?:insufficient|not enough|too little) (?:information |context )?to (?:determine|answer|tell|say|confirm)\b",
    r"\b(?:i|we) (?:don't|do not) have enough (?:information|context|detail)\b",
    # "I'm not sure which version you run, but ..." asks about the user's setup: no decline
    r"\bi(?:'m| am) not (?:sure|certain)\b"
    r"(?! (?:which|what|whether|if|how)\b[^.,;]{0,40}\byou(?:'re| are)?"
    r" (?:run|use|have|mean|on|installed|deployed|want))",
]
_OTHER = [
    # Spanish, Portuguese
    r"\bno (?:encontr[ée]|encuentro|he encontrado|pude encontrar|logr[ée] encontrar)\b",
    r"\bn[ãa]o (?:encontrei|consegui encontrar|achei)\b",
    r"\bno (?:est[áa]n?|aparece[n]?) (?:documentad[oa]s?|descrit[oa]s?|mencionad[oa]s?)\b",
    r"\bno se (?:menciona|describe|explica|documenta)\b",
    r"\bn[ãa]o (?:est[áa]|é) (?:documentad[oa]|descrit[oa]|mencionad[oa])\b",
    r"\b(?:documentaci[óo]n|p[áa]ginas|fuentes|fragmentos|resultados) (?:que \w+ )?no (?:lo |la )?"
    r"(?:menciona|mencionan|describe|describen|cubre|cubren|dice|dicen|explica|explican|especifica|habla|hablan"
    r"|indica|indican|aclara|aclaran)\b",
    r"\b(?:informaci[óo]n|documentaci[óo]n) (?:\w+ )?no (?:indica|menciona|dice|aclara|especifica)\b",
    r"\bno (?:puedo|podemos) (?:confirmar|decir|responder|asegurar)\w*\b",
    r"\b(?:documenta[çc][ãa]o|p[áa]ginas|fontes|trechos|resultados) (?:que \w+ )?n[ãa]o (?:o |a )?"
    r"(?:menciona|mencionam|descreve|descrevem|cobre|cobrem|diz|dizem|explica|explicam|fala|falam)\b",
    r"\bno (?:hay|tengo|dispongo de) (?:informaci[óo]n|documentaci[óo]n)\b",
    r"\bn[ãa]o (?:h[áa]|tenho) (?:informa[çc](?:[ãa]o|[õo]es)|documenta[çc][ãa]o|nada (?:sobre|a respeito))\b",
    r"\bn[ãa]o (?:sei|saberia) (?:dizer|responder|informar)\b|\bn[ãa]o (?:posso|consigo) (?:confirmar"
    r"|responder|dizer)\b",
    # French
    r"\bje n'ai (?:pas|rien) (?:pu )?trouv[ée]\b",
    r"\bje ne (?:trouve|peux|sais) (?:donc |malheureusement )?(?:pas|rien)\b",
    r"\bn'(?:est|sont) pas (?:document[ée]e?s?|d[ée]crite?s?|mentionn[ée]e?s?)\b",
    r"\b(?:documentation|documents|pages|sources|passages|r[ée]sultats) (?:\w+ )?ne (?:le "
    r"|l')?(?:mentionnent?|d[ée]crivent?|disent?|dit"
    r"|couvrent?|pr[ée]cisent?|expliquent?|parlent?|abordent?) (?:pas|rien)\b",
    r"\baucune (?:information|mention|documentation)\b",
    r"\bil n'y a (?:pas|aucune?) (?:d'information|d'informations|de documentation|information|mention)\b",
    # German
    r"\b(?:habe|konnte)\b[^.]{0,60}\b(?:keine|nichts|nicht)\b[^.]{0,40}\b(?:gefunden|finden)\b",
    r"\bnicht (?:dokumentiert|beschrieben|erw[äa]hnt)\b",
    r"\bkeine (?:informationen|angaben|dokumentation|hinweise)\b",
    r"\b(?:die )?dokumentation (?:erw[äa]hnt|beschreibt|nennt) (?:nicht|kein|nichts)\b",
    r"\b(?:sagt|sagen|erw[äa]hnt|erw[äa]hnen)(?: aber| jedoch| leider)? nichts\b",
    r"\bkann ich (?:ihnen |dir |euch )?(?:daher |leider )?nicht beantworten\b",
    r"\bkeine (?:\w+ )?(?:auskunft|aussage|antwort) (?:geben|machen|treffen)\b",
    # Italian
    r"\bnon (?:ho trovato|trovo|riesco a trovare|sono riuscit[oa] a trovare|siamo riusciti a trovare)\b",
    r"\bma nulla (?:su|sul|sulla|sui|sugli)\b",
    r"\binformazion[ei] non c['’]?[èe]\b|\bnon c['’]?[èe] (?:questa|quest['’]|alcuna|nessuna) ?informazione\b",
    r"\bnessun[oa]? (?:del|della|dei|degli|delle|di) (?:\w+ ){0,2}(?:indica|indicano|menziona|menzionano|dice|dicono"
    r"|spiega|spiegano|descrive|descrivono)\b",
    r"\bnon (?:posso|possiamo) (?:darti|darle|dirti|dirle|confermare|rispondere|indicare)\b",
    r"\bnon (?:è|sono) (?:documentat[oaie]|descritt[oaie]|menzionat[oaie])\b",
    r"\b(?:documentazione|pagine|fonti|risultati) (?:\w+ ){0,3}non (?:spiega|spiegano|menziona|menzionano|descrive"
    r"|descrivono|dice|dicono|copre|coprono|parla|parlano)\b",
    r"\b(?:non ci sono|nessuna) (?:informazion[ei]|documentazione|menzione)\b",
    # Dutch
    r"\b(?:niets|niks) (?:kunnen )?(?:vinden|gevonden)\b|\bniet (?:kunnen )?vinden\b|\bniet gevonden\b",
    r"\b(?:zeggen|zegt|vermelden|vermeldt|beschrijven|beschrijft) (?:er )?niets\b",
    r"\bgeen (?:informatie|documentatie)\b|\bniet (?:gedocumenteerd|beschreven|vermeld)\b",
    r"\bkan ik (?:\w+ ){0,4}niet (?:opmaken|vinden|zeggen|bevestigen|beantwoorden)\b"
    r"|\bstaat er (?:dus |ook |helaas )?niet\b",
    # Polish
    r"\bnie (?:uda[łl]o mi si[ęe]|mog[ęe]|mogli[śs]my) (?:znale[źz][ćc]|odnale[źz][ćc])\b",
    r"\bnie znalaz[łl](?:em|am|y[śs]my)\b|\bbrak informacji\b",
    r"\bdokumentacj[aie] (?:\w+ ){0,2}nie (?:opisuje|wspomina|zawiera|m[óo]wi)\b",
    # Turkish
    r"\b(?:bulamad[ıi]m|ula[şs]amad[ıi]m|bulamad[ıi]k)\b",
    # "not specified in the docs"; a version that "does not include" a feature is a claim
    r"\b(?:dok[üu]manlarda|dok[üu]mantasyonda|belgelerde)\b[^.]{0,40}(?:belirtilmemi[şs]|bahsedilmiyor)"
    r"|\bbilgi (?:yok|bulunmuyor)\b",
    # Russian, Ukrainian
    r"(?<!\w)не (?:нашёл|нашел|нашла|удалось найти|могу найти)",
    r"(?<!\w)не (?:описан|документирован|упомина)",
    r"(?<!\w)нет (?:информации|сведений|упоминани)",
    r"(?<!\w)ничего не (?:сказано|говорится|написано)|(?<!\w)ничего нет",
    r"(?<!\w)не (?:знайшов|знайшла|вдалося знайти|можу знайти)",
    r"(?<!\w)немає (?:відповіді|інформації|відомостей|згадк)|(?<!\w)не (?:описано|згадується)",
    # Japanese
    r"見つかりませんでした|見つけられませんでした|見つかりません|見当たりません",
    r"記載(?:が|は)?(?:ありません|見当たりません|されていません)|書かれていません|説明されていません",
    r"(?:確認|判断)できません|わかりませんでした|触れられていない|触れられていません|お答えできません|回答できません",
    r"情報(?:が|は)(?:ありません|見つかりません)",
    # Chinese (simplified and traditional)
    r"没有找到|未找到|找不到|未能找到|没能找到|沒有找到|沒能找到",
    r"(?:文档|资料|页面|文件|文檔|資料|頁面)(?:中|里|裡)?(?:没有|沒有|未|并未|並未)(?:提到|提及|说明|說明|描述|记载|記載|涉及)",
    r"没有(?:相关)?(?:信息|说明|记载|文档)|沒有(?:相關)?(?:資訊|信息|說明|記載|文件)|无法(?:确定|确认|回答)|無法(?:確定|確認|回答)",
    # Korean
    r"찾을 수 없|찾지 못했|문서에[^.]{0,30}없습니다|확인할 수 없|정보가 없(?:습니다|어서|어요)|나와 있지 않"
    r"|언급(?:되어 있지 않|이 없|하지 않)|내용이 없|답변(?:드리기|하기) 어렵",
    # Vietnamese, Indonesian
    # "I found no", "no information"; not the error "báo không tìm thấy namespace"
    r"\b(?:tôi|chúng tôi) (?:đã )?không tìm thấy\b|\bkhông (?:tìm thấy thông tin|thấy thông tin|có thông tin"
    r"|được đề cập)\b|\btài liệu (?:\w+ )?không (?:đề cập|nói|mô tả)\b",
    r"\btidak (?:menemukan|dapat menemukan|ada informasi|disebutkan|dijelaskan|dibahas|membahas|menjelaskan"
    r"|menyebutkan)\b",
    # Hindi
    r"मुझे[^।.]{0,40}नहीं मिल|जानकारी नहीं (?:मिली|है)|उल्लेख नहीं|नहीं बताया गया|मुझे नहीं पता",
    # "I don't know", in the languages above and a few more
    r"\bno (?:lo )?sé\b|\bn[ãa]o sei\b|\bje ne sais pas\b|\bwei(?:ß|ss) (?:ich|es) nicht\b|\bich wei(?:ß|ss) es nicht\b"
    r"|\bnon (?:lo )?so\b|\bweet ik niet\b|\bik weet het niet\b|\bvet (?:jag )?inte\b|\bnie wiem\b|\bnev[íi]m\b"
    r"|\bbilmiyorum\b|\bkhông biết\b|\btidak tahu\b|(?<!\w)не знаю|لا أعرف|לא יודע|我(?:也)?(?:不知道|不清楚)"
    r"|모르겠습니다|ไม่ทราบ"
    r"|分かりかねます|わかりかねます",
    # Swedish, Czech
    r"\b(?:framg[åa]r|n[äa]mns|beskrivs|dokumenteras) inte\b|\bhittade (?:jag )?inte\b|\bkunde inte hitta\b"
    r"|\bingen (?:information|dokumentation)\b|\bkan (?:jag )?inte bekr[äa]fta\b",
    r"\bo tom (?:\w+ )?nic nen[íi]\b|\bnic jsem nena[šs]e?l\b|\bnena[šs](?:el|la) jsem\b"
    r"|\bnepoda[řr]ilo se (?:mi )?naj[íi]t\b"
    r"|\bnen[íi] (?:zdokumentov[áa]no|pops[áa]no|uvedeno)\b|\b[žz][áa]dn[ée] informace\b",
    # Polish, Italian, Ukrainian (more forms)
    r"\bnie ma (?:tej |tych |takiej |[żz]adnej )?(?:informacji|nic)\b|\bnie m[óo]wi(?:[ąa])? nic\b",
    r"\bnie mog[ęe] (?:\w+ )?(?:odpowiedzie[ćc]|potwierdzi[ćc])\b",
    r"\bnon c'?[èe] traccia\b",
    r"(?<!\w)не (?:пояснює|пояснюють|описує|описують)|(?<!\w)(?:підтвердити|сказати) не можу|(?<!\w)не скажу",
    # Arabic, Hebrew, Thai
    r"لم (?:أجد|أعثر)|لا توجد (?:أي )?معلومات|لا (?:تذكر|توضح|تشرح)",
    r"לא מצאתי|אין (?:לי )?מידע|לא (?:מוזכר|מתועד|מוסבר)",
    r"ไม่พบ|หาไม่เจอ|ไม่มีข้อมูล|ไม่ได้(?:ระบุ|กล่าวถึง)",
    # Chinese (more forms)
    r"查不到|查无|(?:并|並)(?:没有|沒有)(?:提到|提及|说明|說明)",
]

DECLINE_PATTERNS = re.compile("|".join(_EN + _OTHER), re.IGNORECASE)


#: what the agent read or searched, as it names it ("they" is no source here: "pods restart, and they
#: don't show logs")
_SOURCE = re.compile(
    # results as the search's ("the 5 results", "search results"), not a trial's or a selector's
    rf"\b(?:docs?|documentation|documents?|pages?|passages?|search results|{_COUNT} results|results (?:i|we) \w+"
    r"|sources?|context|excerpts?|snippets?|materials?"
    r"|articles?|guides?|overview|index|knowledge base|search(?:es|ed)?|retrieved|looked|came back|available to me"
    r"|(?:i|we) (?:have|was given|were given|can see|found)"
    # the texts as "it" or "they" once named: "It covers the variables, but nothing about TLS"
    r"|(?:it|they) (?:covers?|mentions?|describes?|explains?|lists?|says?|shows?|gives?|talks? about|documents?))\b",
    re.IGNORECASE,
)
#: ... and, in a sentence that names them, what the agent fails to do with them
_TELLING = (
    rf"(?:{_TELL_VERBS}|talk|touch|spell|speak|indicate|clarify|reference|find|found|locate|confirm|tell|determine"
    r"|come across|turn up|dig up)"
)
#: it does not tell: a negation right before a verb of telling or finding, or an absence named
_UNTOLD = re.compile(
    # "if the ConfigMap is (still) not provided", "it has not been provided", "cannot be found": a
    # passive is about the thing, no telling; nor is "not only"
    r"\b(?<!\bis )(?<!\bare )(?<!\bwas )(?<!\bwere )(?<!\bstill )"
    r"(?:not|never|nor|doesn't|don't|didn't|dont|doesnt|didnt|haven't|hasn't|cannot|can't|couldn't)"
    rf"(?: (?!be\b|been\b|being\b|only\b|just\b)\w+)?? {_TELLING}(?:s|es|ed|ing)?\b"
    rf"|\bnone of (?:\w+ ){{0,6}}?{_TELLING}(?:s|es)?\b"
    r"|\bno (?:relevant |useful |specific |such |real )?(?:mention|information|info|data|details?|reference|trace"
    r"|material|guidance|explanation|page|passage|answer|coverage)\b"
    r"|\bnothing (?:about|on|regarding|concerning|there|relevant|useful|reliable|that)\b"
    r"|\b(?:silent|quiet) (?:on|about)\b|\bstops? short of\b|\bdrawn a blank\b|\bno luck\b"
    r"|\bcame up (?:empty|short|dry)\b|\bcomes? up short\b|\ba gap in\b"
    r"|(?:\b(?:isn't|is not|aren't|are not|wasn't|was not) in|^not in) (?:the |my |our |any |what )(?:\w+ ){0,2}?"
    r"(?:docs|documentation|sources|pages|passages|material|results|context)\b",
    re.IGNORECASE,
)
_SENTENCES = re.compile(r"(?<=[.!?;:])\s+|\s+[—–]\s+")
#: reported speech: "the docs say that if the ConfigMap is not provided ...", "per the docs, no data
#: is lost" tell what the texts do say
_REPORTED = re.compile(
    r"\b(?:according to|per) the\b|\b(?:docs?|documentation|pages?|guides?|passages?|sources?|overview)"
    r" (?:says?|notes?|explains?|states?|confirms?|warns?) (?:that|the|you|it)\b",
    re.IGNORECASE,
)


def _untold(text: str) -> list[str]:
    """The English sentences that name the agent's sources and say they do not tell (see above)."""
    found = []
    for sentence in _SENTENCES.split(text):
        if not _SOURCE.search(sentence):
            continue
        match = _UNTOLD.search(sentence)
        if match and not _REPORTED.search(sentence) and looks_english(sentence):
            found.append(match.group(0))
    return found


#: Markdown emphasis around words (`_don't cover_`, `**not documented**`); underscores inside an
#: identifier (`max_trial_count`) are no emphasis
_EMPHASIS_MARKS = re.compile(r"(?<![\w*])[*_]{1,3}(?=\S)|(?<=\S)[*_]{1,3}(?![\w*])")


@lru_cache(maxsize=256)
def _prose(answer: str) -> str:
    """`answer` as the patterns read it: apostrophes normalised, any run of whitespace as one space
    (the patterns spell one; a phrase wraps at a line end or holds a no-break space), emphasis marks
    and code left out (a quoted error message, `Unable to find image 'x' locally`, is not the agent's)."""
    return re.sub(r"\s+", " ", _EMPHASIS_MARKS.sub("", without_code(plain(answer))))


def listed_phrases(answer: str) -> list[str]:
    """The decline phrases of the phrase lists in `answer`, as written."""
    return [m.group(0) for m in DECLINE_PATTERNS.finditer(_prose(answer))]


def decline_phrases(answer: str) -> list[str]:
    """The decline phrases in `answer`, as written: the phrase lists', else the cue check's."""
    return listed_phrases(answer) or cue_phrases(answer)


def cue_phrases(answer: str) -> list[str]:
    """What the cue check finds in `answer` (English sentences naming the sources, see above)."""
    return _untold(_prose(answer))


def absence_cues(answer: str) -> list[str]:
    """What in `answer` says that something is not told or not found, whether or not the sentence
    names the agent's sources ("but nothing about TLS"): a substantive answer with one may be a
    decline the checks do not see."""
    return [m.group(0) for m in _UNTOLD.finditer(_prose(answer))]


def declines(answer: str) -> bool:
    return bool(decline_phrases(answer))
