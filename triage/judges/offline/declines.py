"""Declines: an answer that says the topic is not covered, or that it could not find it.

English first, then the languages users of a docs agent commonly write in (Spanish, Portuguese,
French, German, Italian, Dutch, Swedish, Polish, Czech, Russian, Ukrainian, Turkish, Arabic, Hebrew,
Hindi, Japanese, Chinese, Korean, Vietnamese, Indonesian, Thai). Phrases are about the act of not
finding or the docs not saying; a plain negation ("X is not supported") is a claim, not a decline.

Phrase lists never end (agents write "the excerpts are silent on", "none of the 5 results mention",
"the material available to me doesn't list"), so English has a second check by cues: a sentence that
names what the agent read or searched (`_SOURCE`) and says, in the same breath, that it does not tell
(`_UNTOLD`: a negation right before a verb of telling or finding, "no mention", "nothing about").
"The docs say you don't need to restart" names the docs and negates, but not the telling.

Other languages than English are also read by the check judges' patterns (`other_language_declines`,
`decline_cues`): a decline that names what it read ("laut der Dokumentation ... nicht").
"""

from __future__ import annotations

import re
from functools import lru_cache

from triage.judges.offline.text import fold, looks_english, plain, without_code

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


#: what the agent read, per language (German, French, Spanish, Portuguese, Italian)
_READ_DE = (
    r"(?:dokumentation|doku|docs|unterlagen|seiten?|quellen?|passagen?|(?:such)?ergebnisse?|abschnitte?"
    r"|anleitung|handbuch)"
)


_READ_ROMANCE = (
    r"(?:documentation|doc|docs|documentaci[óo]n|documenta[çc][ãa]o|documentazione|pages?|p[áa]ginas?|pagine"
    r"|sources?|fuentes|fontes|fonti|passages?|pasajes|trechos|fragmentos|extraits?|r[ée]sultats?|resultados?"
    r"|risultati|guide|gu[íi]as?|guias?)"
)


#: a clause the sentence reports ("indique que", "dice que", "sagt, dass"): what the docs do say
_NO_REPORT = r"(?:(?!\b(?:que|qu['’]|dass|che|laut|selon|seg[úu]n|segundo)\b)[^.!?。！？])"


_OTHER_LANGUAGE_DECLINES = [
    # German: "die Doku erwähnt das nicht", "in der Dokumentation steht dazu nichts", "keine Angaben"
    rf"\b{_READ_DE}\b{_NO_REPORT}{{0,60}}?\b(?:nicht|nichts|keine?n?|nirgends|nirgendwo)\b{_NO_REPORT}{{0,40}}?"
    r"(?:erw[äa]hn\w*|beschrieb\w*|beschreib\w*|dokumentier\w*|behandel\w*|abgedeckt|deck\w*|erkl[äa]r\w*"
    r"|aufgef[üu]hrt|angegeben|steh\w*|enth[äa]lt|enthalten|nenn\w*|geh\w* \w+ ein|eingegangen|beantwort\w*)",
    rf"\b{_READ_DE}\b{_NO_REPORT}{{0,80}}?\b(?:erw[äa]hn\w*|beschreib\w*|behandel\w*|deck\w*|erkl[äa]r\w*|nenn\w*"
    rf"|sag\w*|enth[äa]lt|enthalten|geh\w*|spricht|sprechen|geben|gibt)\b{_NO_REPORT}{{0,30}}?"
    r"\b(?:nicht|nichts|keine?n?|nirgends)\b",
    # the verb first: "Das deckt die Dokumentation nicht ab", "Dazu sagt die Doku leider nichts"
    rf"\b(?:deck\w*|behandel\w*|erw[äa]hn\w*|beschreib\w*|nenn\w*|erkl[äa]r\w*|sag\w*|enth[äa]lt|geh\w*|gib\w*"
    r"|liefer\w*)"
    rf"\b{_NO_REPORT}{{0,30}}?\b{_READ_DE}\b{_NO_REPORT}{{0,30}}?\b(?:nicht|nichts|keine?n?|nirgends)\b",
    r"\b(?:dazu|dar[üu]ber|hierzu|davon)\b[^.!?]{0,50}\b(?:nichts|keine (?:\w+ )?(?:informationen|angaben|hinweise"
    r"|beschreibung|erw[äa]hnung))\b",
    r"\bkeine (?:\w+ )?(?:informationen|angaben|hinweise|erw[äa]hnung|beschreibung|dokumentation|antwort|auskunft)\b",
    # "the page I found does not say": a relative clause of the reader, no report
    rf"\b{_READ_ROMANCE} (?:que|qu['’]) ?(?:j['’]ai|nous avons|encontr[ée]|encontrei|consult[ée]|revis[ée]|vi)"
    r"(?: \w+)? (?:ne |n['’]|no |n[ãa]o )(?:\w+ )?(?:pas|rien|\w+)",
    r"(?:没有|沒有|未)在[^。！？]{0,12}(?:找到|查到|看到)",
    r"\b(?:nicht|nirgends|nirgendwo) (?:\w+ ){0,3}(?:erw[äa]hnt|beschrieben|dokumentiert|behandelt|abgedeckt"
    r"|aufgef[üu]hrt|beantwortet)\b",
    r"\b(?:konnte|kann|habe|hab)\b[^.!?]{0,50}\b(?:nicht|nichts|keine?n?)\b[^.!?]{0,40}"
    r"\b(?:finden|gefunden|beantworten|best[äa]tigen|sagen)\b",
    # French: "la documentation ne couvre pas", "la doc n'en parle pas", "aucune information"
    rf"\b{_READ_ROMANCE}\b{_NO_REPORT}{{0,60}}?(?:\bne\b|\bn['’])(?:en |y |le |la |l['’])?{_NO_REPORT}{{0,30}}?"
    r"\b(?:pas|rien|aucun\w*|nulle part)\b",
    r"\bje n['’]ai (?:rien|pas|aucune?)\b[^.!?]{0,30}\b(?:trouv[ée]|information|mention)|\bje ne (?:trouve|vois)"
    r" (?:pas|rien|aucun)",
    r"\baucune? (?:\w+ )?(?:information|mention|pr[ée]cision|indication|documentation|r[ée]ponse|r[ée]f[ée]rence)\b",
    r"\bpas (?:d['’]informations?|de documentation|de mention|d['’]indication)\b",
    rf"\brien dans (?:la |les |l['’])?{_READ_ROMANCE}\b",
    r"\bn['’](?:est|sont) (?:pas|nulle part) (?:\w+ )?(?:document[ée]e?s?|d[ée]crite?s?|mentionn[ée]e?s?"
    r"|couverte?s?|abord[ée]e?s?|trait[ée]e?s?|expliqu[ée]e?s?)\b",
    r"\bje ne (?:sais|peux) pas (?:\w+ )?(?:dire|r[ée]pondre|confirmer)\b",
    # Spanish, Portuguese, Italian: "la documentación no cubre", "a documentação não aborda"
    rf"\b{_READ_ROMANCE}\b{_NO_REPORT}{{0,100}}?\b(?:no|n[ãa]o|non)\b(?: \w+){{0,2}}? (?:lo |la |o |a |ne )?"
    r"(?:cubre\w*|cobre\w*|copre\w*|trata\w*|tratta\w*|aborda\w*|menciona\w*|describe\w*|descreve\w*|descrive\w*"
    r"|documenta\w*|explica\w*|spiega\w*|dice\w*|diz\w*|dicono|habla\w*|fala\w*|parla\w*|incluye\w*|inclui\w*"
    r"|detalla\w*|detalha\w*|especifica\w*|recoge\w*|contempla\w*|dicen|dizem)\b",
    r"\b(?:no|n[ãa]o|non) (?:encontr[ée]|he encontrado|encontramos|pude encontrar|encontrei|achei"
    r"|consegui encontrar|ho trovato|hay|h[áa]|tengo|tenho|c['’]?[èe])\b[^.!?]{0,30}"
    r"\b(?:informaci[óo]n|informa[çc](?:[ãa]o|[õo]es)|informazion[ei]|nada|nulla|documentaci[óo]n"
    r"|documenta[çc][ãa]o|menci[óo]n|men[çc][ãa]o|menzione|referencia|refer[êe]ncia)\b",
    r"\b(?:ninguna?|nenhuma?|nessuna?) (?:\w+ )?(?:informaci[óo]n|informa[çc][ãa]o|informazione|menci[óo]n"
    r"|men[çc][ãa]o|menzione|referencia|refer[êe]ncia|documentaci[óo]n|documenta[çc][ãa]o)\b",
    r"\b(?:no|n[ãa]o|non) (?:est[áa]n?|aparece[mn]?|viene|vem|[èe]|sono) (?:\w+ ){0,2}(?:documentad|descrit|mencionad"
    r"|explicad|cubiert|cobert|tratad|documentat|menzionat|descritt)\w*",
    r"\bnada (?:sobre|acerca|a respeito)\b",
    r"\b(?:no|n[ãa]o) (?:puedo|podemos|posso|sabr[íi]a|saberia|sei) (?:\w+ )?(?:decir|dizer|confirmar|responder"
    r"|dar(?:te|le)?|ofrecer(?:te|le)?|oferecer)\b",
    # Chinese: "文档中没有相关说明", "文档未涉及", "没有找到相关信息"
    r"(?:文档|文檔|资料|資料|页面|頁面|说明文档|檢索結果|检索结果|搜索结果|搜尋結果|结果|結果)[^。！？]{0,12}?"
    r"(?:没有|沒有|未|并未|並未|并没有|並沒有|不)[^。！？]{0,6}?"
    r"(?:提到|提及|说明|說明|描述|记载|記載|涉及|介绍|介紹|覆盖|覆蓋|包含|给出|給出|讲|講|写|寫|谈到|談到|找到)",
    r"(?:没有|沒有|未)(?:找到|查到|搜到)",
    r"(?:没有|沒有)(?:相关|相關|有关|有關|具体|具體)?(?:的)?(?:信息|資訊|说明|說明|内容|內容|资料|資料|记载|記載)",
    r"无法(?:回答|确认|确定|找到)|無法(?:回答|確認|確定|找到)",
    # Japanese: "ドキュメントには記載がありません", "扱われていません", "情報は見当たりません"
    r"(?:記載|説明|言及|記述|情報)(?:が|は|も)?(?:ありません|ない(?:です|ため|ので)?|なく|見当たりません"
    r"|見つかりません|されていません|されておらず)",
    r"(?:扱われて|触れられて|カバーされて|書かれて|載って|触れて)(?:い)?(?:ません|ない|おらず)",
    r"(?:分かりません|わかりません|見つけられませんでした|見つかりませんでした|確認できませんでした)",
]


_OTHER_LANGUAGE = re.compile("|".join(_OTHER_LANGUAGE_DECLINES), re.IGNORECASE)


def other_language_declines(text: str) -> list[str]:
    """Decline phrases in the other languages users write that the shared lists miss (see above)."""
    prose = re.sub(r"\s+", " ", without_code(fold(text)).replace("\u2019", "'"))
    return [m.group(0) for m in _OTHER_LANGUAGE.finditer(prose)]


def decline_cues(text: str) -> list[str]:
    """Every decline phrase of `text`: the shared lists and cues, then the other languages'."""
    return decline_phrases(text) or other_language_declines(text)
