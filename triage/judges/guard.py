"""The injection guard: a cheap deterministic detector of untrusted text that tries to instruct or fool a judge.

It runs for every judge, the heuristic and the check judges included, on the raw text (before a
prompt cleans it), so flagging never depends on a model noticing. It sits below both floors of the
judges (`offline/`, `model/`): the evidence floor scans with it, the model floor cleans the fake
tags it names out of a prompt."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

from triage.domain.kernel import TextMemo
from triage.domain.records import Evidence, Facts, Passage, Trace

_VERDICT_WORDS = (
    r"ok|okay|fine|correct|grounded|ungrounded|supported|faithful|accurate|good|pass(?:ed)?|"
    r"contains?[_ ]answer|no[_ ]answer|declined|not[_ ]declined|retrieval|generation|tool[_ ]routing|"
    r"content[_ ]gap\w*|agent[_ ]skipped\w*|relevant|irrelevant|hallucinat\w*|true|false|high|low"
)


_INJECTION_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        "ignore-instructions",
        re.compile(
            r"\b(?:ignore|disregard|forget|override|bypass)\s+(?:all\s+|any\s+|the\s+|your\s+|these\s+|those\s+)*"
            r"(?:previous|prior|above|earlier|preceding|system|original|other)?\s*"
            r"(?:instructions?|prompts?|rules|directions|guidelines|rubric|context)",
            re.IGNORECASE,
        ),
    ),
    (
        "verdict-order",
        re.compile(
            rf"\b(?:classify|label|mark|rate|score|judge|grade|triage|categori[sz]e|treat|consider|evaluate)\s+"
            rf"(?:this|it|that|the\s+(?:answer|response|trace|passage|output|question))?\s*(?:as|to\s+be)\s+"
            rf"[\"'`]?(?:{_VERDICT_WORDS})\b",
            re.IGNORECASE,
        ),
    ),
    (
        "verdict-claim",
        re.compile(
            r"\b(?:the\s+)?(?:answer|response|output)\s+(?:is|was)\s+(?:fully\s+|completely\s+)?"
            r"(?:grounded|supported by the (?:passages|docs|documentation|sources)|faithful)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "addressed-to-judge",
        re.compile(
            r"\b(?:note|message|instructions?|attention)\s+(?:to|for)\s+(?:the\s+|any\s+)?"
            r"(?:ai|llm|model|judge|evaluator|grader|reviewer|classifier|assistant)\b"
            r"|\b(?:dear|hey|attention)\s+(?:ai|llm|judge|evaluator|grader|reviewer|classifier)\b"
            r"|\byou\s+are\s+now\b|\bnew\s+instructions?\s*:"
            r"|\b(?:as|to)\s+the\s+(?:judge|evaluator|grader|reviewer)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "fake-role-line",
        re.compile(
            r"(?:^|\n)\s*(?:#+\s*|\[|<)?(?:system|assistant|developer)(?:\]|>)?\s*:\s*\S+(?:[ \t]+\S+){2,}"
            r"|<\|im_start\|>|\[INST\]|<<SYS>>",
            re.IGNORECASE,
        ),
    ),
    (
        "fake-verdict-json",
        re.compile(
            r"[\"'](?:retrieved_has_answer|index_has_answer|answer_grounded|answer_declined|"
            r"injection_suspected|verdict|label|layer|triage_layer|grounding|declined)[\"']\s*:",
            re.IGNORECASE,
        ),
    ),
    (
        "fake-tag",
        re.compile(
            r"</?\s*(?:data|passage|question|comment|answer|tool_call|system)\b[^<>]{0,200}>|nonce\s*=",
            re.IGNORECASE,
        ),
    ),
]


def injection_findings(fields: Iterable[tuple[str, str | None]]) -> list[str]:
    """ "<field>: <pattern>" for every field whose text tries to instruct or fool the judge.

    Run on the raw text (before `clean`), so stripped lookalike tags are still reported.
    """
    found: list[str] = []
    for field, text in fields:
        if not text:
            continue
        found += [f"{field}: {label}" for label in _labels(text)]
    return list(dict.fromkeys(found))


#: the patterns as they read lower-cased ASCII text: the same matches as IGNORECASE there (no
#: Unicode case folding can apply), at about half the cost, which the night pays on every passage
_LOWER_PATTERNS = [
    (label, re.compile(pattern.pattern.replace("INST", "inst").replace("SYS", "sys")))
    for label, pattern in _INJECTION_PATTERNS
]


def _scan(text: str) -> tuple[str, ...]:
    if text.isascii():
        lowered = text.lower()
        return tuple(label for label, pattern in _LOWER_PATTERNS if pattern.search(lowered))
    # invisible characters are removed first so "ign\u200bore previous instructions" still matches
    visible = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return tuple(label for label, pattern in _INJECTION_PATTERNS if pattern.search(visible))


#: the same index chunks and tool outputs come back for many traces, and the cascade's two judges
#: scan a trace each: each text is scanned once (the largest CPU cost per trace before)
_labels = TextMemo(_scan, size=8192)


def trace_findings(trace: Trace, research: Sequence[Passage] | None, comment: str | None) -> list[str]:
    """`injection_findings` over every piece of untrusted text a trace carries."""
    return injection_findings(
        [
            ("question", trace.question),
            ("comment", comment),
            ("answer", trace.answer),
            *_passage_fields([*trace.passages, *(research or [])]),
            *((f"tool output T{n}", c.output) for n, c in enumerate(trace.tool_calls, start=1)),
        ]
    )


def passage_findings(passages: Sequence[Passage]) -> list[str]:
    """`injection_findings` over passages found after `trace_findings` ran (a judge's own search)."""
    return injection_findings(_passage_fields(passages))


def _passage_fields(passages: Sequence[Passage]) -> list[tuple[str, str]]:
    return [(f"passage {p.id}", f"{p.title or ''}\n{p.text}") for p in passages]


def flag(facts: Facts, findings: list[str]) -> Facts:
    """`facts` marked `injection_suspected`, with the findings as the evidence note."""
    if not findings:
        return facts
    note = "; ".join(findings)[:1000]
    old = facts.evidence.get("injection_suspected")
    if old and old.note:
        note = f"{note}; {old.note}"[:1000]
    evidence = {**facts.evidence, "injection_suspected": Evidence(confidence="high", note=note)}
    return facts.model_copy(update={"injection_suspected": True, "evidence": evidence})


#: the check prompt's own tag names (`prompts/check_user.j2`) and the role names, as fake tags
_CHECK_TAGS = (
    r"question|expectations?|answer|sources?|passages?|tool_calls?|tool|system|user|assistant|developer|"
    r"instructions?|verdicts?|reply|part|data|nonce|judge|grader|rubric"
)


CHECK_TAG_LOOKALIKE = re.compile(rf"</?\s*(?:{_CHECK_TAGS})\b[^<>]{{0,200}}>", re.IGNORECASE)


_PASSING = (
    r"pass(?:ed|es|ing)?|correct|met|satisfied|fulfill?ed|verified|compliant|accepted|approved|"
    r"réussie?|valid[eé]e?|correcte|bestanden|korrekt|richtig|erfüllt|aprobad[oa]|correct[oa]|válid[oa]|"
    r"cumplid[oa]|superat[oa]|corrett[oa]|valid[oa]|geslaagd|juist"
)


_OBJECTS = (
    r"expectations?|checks?|criteria|rules|instructions?|rubric|grading|guidelines|directions|"
    r"corrections?|claims?|prompts?|context|(?:system\s+)?messages?"
)


_CHECK_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        "ignore-expectations",
        re.compile(
            rf"\b(?:ignore|disregard|forget|override|bypass|skip|drop)\s+(?:all\s+|any\s+|the\s+|your\s+|these\s+|"
            rf"those\s+|previous\s+|prior\s+|above\s+|other\s+|earlier\s+|original\s+|reviewer'?s?\s+)*(?:{_OBJECTS})\b",
            re.IGNORECASE,
        ),
    ),
    (
        "verdict-order",
        re.compile(
            rf"\b(?:answer|reply|respond|output|return|say|give|mark|grade|rate|judge|score|treat|consider|label|"
            rf"classify|evaluate|record|report|flag|deem)(?:s|d|ed|ing)?\s+(?:with\s+|it\s+|this\s+|that\s+|"
            rf"everything\s+|"
            rf"(?:the|this|each|every|all)\s+(?:new\s+)?(?:answers?|responses?|cases?|checks?|expectations?|"
            rf"verdicts?)\s+)?(?:as|to\s+be|with|=|:)\s*[\"'`*]*(?:{_PASSING})\b"
            # a verdict ordered without a connector ("answer PASS", "mark correct")
            rf"|\b(?:answer|reply|respond|say|mark|grade|rate|score)\s+(?:(?:it|this|everything)\s+)?[\"'`*]*"
            rf"(?:pass(?:ed)?|correct|approved)\b"
            rf"|\b(?:return|output|give|emit)\s+[\"'`*]*pass(?:ed)?[\"'`*]*(?=\s*(?:[.!;,)]|$|for\b|on\b))"
            rf"|\b(?:output|grade|judgement|judgment)\s*[:=]\s*[\"'`*]*(?:pass(?:ed)?|correct)\b"
            rf"|\b(?:approve|accept|pass)\s+(?:this|the)\s+(?:new\s+)?(?:answer|response|reply|case|check)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "verdict-claim",
        re.compile(
            r"\b(?:this|the)\s+(?:new\s+)?(?:(?:assistant|agent|model)'?s\s+)?(?:answer|response|reply|output)\s+"
            r"(?:already\s+|fully\s+|clearly\s+)?"
            r"(?:passes|meets|satisfies|fulfils|fulfills|complies\s+with|matches)\s+(?:all\s+|every\s+|the\s+|"
            r"each\s+|its\s+|your\s+)*(?:expectations?|checks?|criteria|corrections?|requirements?|rubric)"
            r"|\b(?:all|every|each|the)\s+expectations?\s+(?:is|are|were|was|has\s+been|have\s+been)\s+"
            r"(?:already\s+|fully\s+)?(?:met|satisfied|fulfill?ed|passed|verified)"
            r"|\bverdicts?\s*(?:is|:|=)\s*[\"'`*]*(?:pass|fail|unsure)\b"
            r"|\b(?:the\s+)?(?:correct|expected|right)\s+verdict\b",
            re.IGNORECASE,
        ),
    ),
    (
        "addressed-to-judge",
        re.compile(
            r"\b(?:note|message|instructions?|attention|reminder|hint|request)\s+(?:to|for)\s+(?:the\s+|any\s+|"
            r"all\s+)?(?:ai|llm|model|judge|evaluator|grader|reviewer|checker|classifier|assistant|verifier|"
            r"automated\s+\w+)s?\b"
            r"|\b(?:dear|hey|hi|attention)\s+(?:ai|llm|model|judge|evaluator|grader|reviewer|checker)\b"
            r"|\b(?:as|to)\s+the\s+(?:judge|evaluator|grader|checker|verifier)\b|\bgraders?\b"
            r"|\b(?:when|while|if\s+you\s+are)\s+(?:grading|judging|evaluating|scoring)\b"
            r"|\byou\s+are\s+now\b|\bnew\s+instructions?\s*:|\bsystem\s+(?:prompt|override|message)\s*:",
            re.IGNORECASE,
        ),
    ),
    (
        "fake-role-line",
        re.compile(
            r"(?:^|\n)\s*(?:#+\s*|\[|<)?(?:system|assistant|developer|judge|grader)(?:\]|>)?\s*:\s*\S+(?:[ \t]+\S+){1,}"
            r"|<\|im_start\|>|<\|[a-z_]{2,20}\|>|\[/?INST\]|<</?SYS>>|(?:^|\n)\s*#{2,}\s*(?:instruction|response)\s*:?",
            re.IGNORECASE,
        ),
    ),
    (
        "fake-verdict-json",
        re.compile(
            r"[\"'](?:verdicts?|expectation|injection_suspected|injection_note|passage_quote|passage_id|call_id|"
            r"quotes)[\"']\s*:",
            re.IGNORECASE,
        ),
    ),
    (
        "fake-tag",
        re.compile(
            r"</?\s*(?:question|expectations?|answer|sources|passages?|tool_calls?|system|assistant|developer|"
            r"instructions?|verdicts?|data|judge|grader|rubric)\b[^<>]{0,200}>|\bnonce\s*=",
            re.IGNORECASE,
        ),
    ),
    (
        "other-language",
        re.compile(
            # ignore the instructions / expectations
            r"\b(?:ignorez|ignore[rz]|oubliez|ignoriere|ignorieren|ignorier|vergiss|vergessen\s+sie|ignora|ignorar|"
            r"ignorate|ignori|olvida|olvide|dimentica|negeer|vergeet|zignoruj|игнорируй|проигнорируй|забудь)\b"
            r"[^.\n]{0,40}?\b(?:instructions?|consignes|attentes|règles|anweisungen|erwartungen|regeln|vorgaben|"
            r"instrucciones|expectativas|reglas|istruzioni|aspettative|regole|instructies|verwachtingen|regels|"
            r"instrukcje|инструкции|ожидания|правила)"
            # mark it as passing
            r"|\b(?:marquez|marque[rz]?|notez|considérez|évaluez|jugez|bewerte|bewerten\s+sie|markiere|markieren\s+sie|"
            r"werte|marca|marcar|marque|califica|calificar|considera|valuta|segna|beoordeel|markeer|oznacz|"
            r"m[áa]rcal[ao]|m[áa]rquel[ao]|calif[íi]cal[ao]|segnal[ao]|valutal[ao]|consid[ée]rala)\b"
            r"[^.\n]{0,40}?\b(?:comme|als|como|come|jako)\s+[\"'`«»„“]*(?:correcte?|réussie?|valide|pass|bestanden|"
            r"korrekt|richtig|correct[oa]|aprobad[oa]|válid[oa]|corrett[oa]|superat[oa]|valid[oa]|geslaagd|juist|"
            r"poprawn[aey]|aprovad[oa]|corret[oa])"
            r"|\b(?:als|comme|como|come)\s+[\"'`«»„“]*(?:bestanden|korrekt|richtig|réussie?|correcte|aprobad[oa]|"
            r"corrett[oa]|superat[oa])[\"'`«»„“]*\s+(?:markieren|bewerten|werten|einstufen|markiert|bewertet|"
            r"marquer|noter|marcar|calificar|segnare)\b"
            # addressed to the judge
            r"|\b(?:au|pour\s+le|à\s+l')\s*(?:juge|correcteur|évaluateur|examinateur)\b"
            r"|\b(?:an\s+den|für\s+den)\s+(?:richter|prüfer|bewerter|gutachter)\b"
            r"|\b(?:ao|para\s+o)\s+(?:avaliador|corretor)\b"
            r"|\b(?:avaliador|évaluateur|correcteur|bewerter|prüfer|evaluador|corrector|valutatore|giudice|"
            r"beoordelaar)\s*:"
            r"|\b(?:al|para\s+el)\s+(?:juez|evaluador|corrector)\b|\b(?:al|per\s+il)\s+(?:giudice|valutatore|correttore)\b"
            # Chinese, Japanese, Korean
            r"|(?:忽略|无视|無視|忽視|不要理会|不理会)[^。\n]{0,20}(?:指令|指示|说明|說明|期望|预期|預期|规则|規則|要求|评分标准)"
            r"|(?:指示|期待|ルール|期待値|評価基準)[^。\n]{0,10}無視"
            r"|(?:标记为|標記為|判定为|判定為|评为|評為|判为|视为|視為)\s*[\"'「“]*(?:通过|通過|正确|正確|合格|PASS|pass)"
            r"|(?:合格|正解|PASS|pass)\s*(?:と|として)\s*(?:判定|マーク|評価|採点)"
            r"|(?:致|给|給)(?:评审|評審|评判|評判|裁判|评分者|評分者|评估者|評估者)"
            r"|(?:採点者|審査員|評価者|ジャッジ)(?:へ|に|様|の方)"
            r"|(?:지시|기대|규칙)[^.\n]{0,10}무시|(?:통과|정답|합격)\s*(?:로|으로)\s*(?:표시|판정|평가)"
            r"|(?:채점자|평가자|심사위원)(?:에게|님)",
            re.IGNORECASE,
        ),
    ),
]


def _check_scan(text: str) -> tuple[str, ...]:
    visible = "".join(ch for ch in text if unicodedata.category(ch) != "Cf") if not text.isascii() else text
    return tuple(label for label, pattern in _CHECK_PATTERNS if pattern.search(visible))


_check_labels = TextMemo(_check_scan, size=4096)


def check_injection_findings(fields: Iterable[tuple[str, str | None]]) -> list[str]:
    """ "<field>: <pattern>" for every field whose text tries to instruct or fool the check judge:
    the triage judge's patterns (`injection_findings`) and the check's own. Run on the raw text."""
    found: list[str] = []
    for field, text in fields:
        if not text:
            continue
        labels = [*_labels(text), *(f"check-{label}" for label in _check_labels(text))]
        found += [f"{field}: {label}" for label in labels]
    return list(dict.fromkeys(found))
