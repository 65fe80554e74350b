"""Decline phrases: the answer declares the topic not covered (or says it could not find it).

English first, then the languages users of a docs agent commonly write in (Spanish, Portuguese,
French, German, Italian, Japanese, Chinese, Korean, Russian). Phrases are about the act of not
finding or the docs not saying; a plain negation ("X is not supported") is a claim, not a decline.
"""

from __future__ import annotations

import re

from triage.judges.offline.text import plain, without_code

_EN = [
    # "we" as well as "I": agents speak for their team as often as for themselves
    r"\b(?:i|we) (?:do not|don't|didn't|did not) (?:have|find|see|know)\b",
    r"\b(?:i|we) (?:could not|couldn't|can't|cannot|can not|was unable to|am unable to|are unable to|were unable to"
    r"|wasn't able to|was not able to|weren't able to|were not able to) (?:find|tell|confirm|locate|see|determine"
    r"|say|answer)\b",
    r"\b(?:unable|not able) to (?:find|locate|confirm)\b",
    r"\b(?:i|we) found (?:no|nothing|none)\b",
    r"\bfound nothing\b",
    r"\bno (?:relevant |specific |such )?(?:information|mention|documentation|details?) (?:about|on|of|regarding|in)\b",
    r"\bno documented (?:way|option|setting|method|support|mechanism|feature)\b",
    r"\b(?:is|are|was|were) not (?:covered|documented|mentioned|described|explained|listed)\b",
    r"\b(?:isn't|aren't|wasn't|weren't) (?:covered|documented|mentioned|described|explained|listed)\b",
    r"\bnot (?:covered|documented|mentioned|described) (?:in|by|on) the\b",
    # "the pages I found don't say": the docs named, and perhaps how the agent came by them
    r"\b(?:docs|documentation|pages?|guide|overview|passages?|results?|sources?)"
    r"(?: (?:i|we) (?:found|searched|retrieved|got|read|checked))?"
    r" (?:do not|don't|does not|doesn't|did not|didn't)"
    r" (?:mention|cover|say|describe|document|explain|include|list|show|give)\b",
    r"\b(?:doesn't|does not|don't|do not|didn't|did not) (?:mention|cover|describe|document|explain)\b",
    r"\b(?:says?|said|mentions?|tells?) nothing (?:about|on|of)\b",
    r"\bneither (?:of them |page |one |source )?(?:mentions|covers|says|describes|documents|explains)\b",
    r"\bnothing in the (?:docs|documentation|search results|pages|passages|results)\b",
    r"\b(?:there is|there's) no (?:documentation|information|mention)\b",
    r"\bi(?:'m| am) not sure\b",
]
_OTHER = [
    # Spanish, Portuguese
    r"\bno (?:encontr[ée]|encuentro|he encontrado|pude encontrar|logr[ée] encontrar)\b",
    r"\bn[ãa]o (?:encontrei|consegui encontrar|achei)\b",
    r"\bno (?:est[áa]n?|aparece[n]?) (?:documentad[oa]s?|descrit[oa]s?|mencionad[oa]s?)\b",
    r"\bn[ãa]o (?:est[áa]|é) (?:documentad[oa]|descrit[oa]|mencionad[oa])\b",
    r"\bla documentaci[óo]n no (?:menciona|describe|cubre|dice|explica)\b",
    r"\bno hay (?:informaci[óo]n|documentaci[óo]n)\b",
    # French
    r"\bje n'ai (?:pas|rien) trouv[ée]\b",
    r"\bje ne (?:trouve|peux) (?:pas|rien)\b",
    r"\bn'(?:est|sont) pas (?:document[ée]e?s?|d[ée]crite?s?|mentionn[ée]e?s?)\b",
    r"\bla documentation ne (?:mentionne|d[ée]crit|dit|couvre|pr[ée]cise) (?:pas|rien)\b",
    r"\baucune (?:information|mention|documentation)\b",
    # German
    r"\b(?:habe|konnte)\b[^.]{0,60}\b(?:keine|nichts|nicht)\b[^.]{0,40}\b(?:gefunden|finden)\b",
    r"\bnicht (?:dokumentiert|beschrieben|erw[äa]hnt)\b",
    r"\bkeine (?:informationen|angaben|dokumentation|hinweise)\b",
    r"\b(?:die )?dokumentation (?:erw[äa]hnt|beschreibt|nennt) (?:nicht|kein|nichts)\b",
    # Italian
    r"\bnon (?:ho trovato|trovo|riesco a trovare)\b",
    r"\bnon (?:è|sono) (?:documentat[oaie]|descritt[oaie]|menzionat[oaie])\b",
    # Russian
    r"не (?:нашёл|нашел|нашла|удалось найти|могу найти)",
    r"не (?:описан|документирован|упомина)",
    r"нет (?:информации|сведений|упоминани)",
    # Japanese
    r"見つかりませんでした|見つけられませんでした|見つかりません|見当たりません",
    r"記載(?:が|は)?(?:ありません|見当たりません|されていません)|書かれていません|説明されていません",
    r"(?:確認|判断)できません|わかりませんでした",
    # Chinese
    r"没有找到|未找到|找不到|未能找到|没能找到",
    r"(?:文档|资料|页面)(?:中|里)?(?:没有|未|并未)(?:提到|提及|说明|描述|记载|涉及)",
    r"没有(?:相关)?(?:信息|说明|记载|文档)|无法(?:确定|确认)",
    # Korean
    r"찾을 수 없|찾지 못했|문서에[^.]{0,30}없습니다|확인할 수 없",
]

DECLINE_PATTERNS = re.compile("|".join(_EN + _OTHER), re.IGNORECASE)


def decline_phrases(answer: str) -> list[str]:
    """The decline phrases in `answer`, as written (apostrophes normalised, and any run of whitespace
    as one space: the patterns spell one, and a phrase wraps at a line end or holds a no-break space).
    Code is left out: a quoted error message (`Unable to find image 'x' locally`) is not the agent's."""
    text = re.sub(r"\s+", " ", without_code(plain(answer)))
    return [m.group(0) for m in DECLINE_PATTERNS.finditer(text)]


def declines(answer: str) -> bool:
    return bool(decline_phrases(answer))
