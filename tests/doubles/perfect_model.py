"""A *perfect model* stand-in: an OpenAI-compatible server that answers the `llm` judge's prompts
from the labels of the evaluation set (evals/kubeflow), for measuring the job's ceiling.

    with PerfectModel(cases, corpus) as model:
        env["OPENAI_BASE_URL"] = model.url        # ends in /v1, as the openai client wants it
        ...                                       # run `triage feedback --judge llm|cascade`
        model.unknown                             # questions it could not place (should be [])

    python tests/doubles/perfect_model.py [--port 8765]   # serve it until Ctrl-C

What it may use, and nothing else (so that a miss is the job's fault, never an oracle's luck):

- the prompt it is sent: the question, the comment, the passage sets with the ids shown, the tool
  calls and the answer, exactly as the judge rendered them;
- the labels of the one case the question identifies: the facts, the component and the `needs`
  strings (the short exact strings of the answering passage).

It does not read the corpus, the answer sources' URLs or the trace: which passage holds the answer
is decided only by finding every `needs` string in the passages of the set it was shown
(case-insensitive, whitespace-normalised, the verifier's rule for `retrieved_has_answer`). So if a
cap, a truncation or a missed re-search keeps the answering text out of the prompt, the perfect
model says "no answer" like any honest model would, and the ceiling shows it.

Its replies, per call:

- containment (call A), per set asked: `contains_answer` when the set's passages together hold
  every `needs` string, citing the fewest passages that do (greedy cover, best covering first), each
  with a quote copied from the passage around a needed string; `partial` when they hold some;
  `no_answer` otherwise, and always for a case with no `needs` (a content gap). The component is the
  labelled one; `injection_suspected` follows the case's injection tags. Where it is asked whether
  to search again and the labels say the index holds the answer that no set shown holds, its
  queries are the first two `needs` strings: the docs' own words, which a model that knows the
  docs would use (a content gap gets none).
- grounding (call B): the labelled `answer_grounded` and `answer_declined`. A grounded answer's
  claims are the `needs` strings it contains, each `supported` with a quote from the block (R.. or
  T..) where it was found; a needed string found in no block it was shown is `unsupported` (the
  answer cannot be shown to rest on text the judge never saw). An ungrounded answer gets one
  `unsupported` claim. A declining answer's quote is its sentence that declines (a phrase list),
  else its first sentence.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tests` and `triage` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.doubles.openai_server import Block, OpenAIServer, Reply, asked_sets, call_kind, data_blocks
from triage.judges.offline.declines import decline_cues

INJECTION_TAGS = frozenset(
    {
        "adversarial:injection_comment",
        "adversarial:injection_answer",
        "adversarial:injection_passage",
        "adversarial:injection_tool_output",
        "adversarial:forged_verdict",
    }
)

_NONCE = re.compile(r'nonce="([0-9a-f]+)"')
_DECLINE = re.compile(
    r"(?:\b(?:not|n't|no|nothing|unable|cannot|can't|couldn't)\b[^.!?\n]*"
    r"\b(?:find|found|cover|covers|covered|document|documented|documents|mention|mentions|mentioned|"
    r"describe|describes|described|information|sure|know|list|lists|listed|say|says)\b)",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"[^.!?\n。！？]+[.!?。！？]?")


def question_key(text: str) -> str:
    """A question as the judge's prompt shows it and as the case holds it, made comparable: no
    invisible or control characters (the prompt strips them), whitespace collapsed, case folded."""
    kept = "".join(ch for ch in text if unicodedata.category(ch) not in {"Cc", "Cf", "Co", "Cs"})
    return " ".join(kept.split()).casefold()


def _norm(text: str) -> str:
    """The comparison form of `needs` matching (the verifier's: whitespace-normalised, lower case)."""
    return " ".join(text.split()).lower()


def _quote_around(text: str, need: str, width: int = 12) -> str | None:
    """A quote copied from `text` (whitespace collapsed, as the judge's quote check normalises)
    that holds `need`, with a little context so it is never shorter than the check's minimum."""
    flat = " ".join(text.split())
    at = flat.lower().find(_norm(need))
    if at < 0:
        return None
    end = at + len(_norm(need))
    if end - at < 20:
        at, end = max(0, at - width), min(len(flat), end + width)
    return flat[at:end].strip()


class _Case:
    def __init__(self, case: Mapping[str, Any]) -> None:
        self.id: str = case["id"]
        self.facts: Mapping[str, Any] = case["facts"]
        self.component: str = case["component"]
        self.needs: list[str] = list(case["needs"])
        self.injection = bool(INJECTION_TAGS & set(case.get("tags", [])))


class PerfectResponder:
    """The reply logic, a function of the request body (usable without a server)."""

    def __init__(self, cases: Iterable[Mapping[str, Any]]) -> None:
        self.cases: dict[str, _Case] = {}
        for case in cases:
            key = question_key(case["question"])
            if key in self.cases:
                raise ValueError(f"two cases share a question: {self.cases[key].id} and {case['id']}")
            self.cases[key] = _Case(case)
        self.unknown: list[str] = []
        self.seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply | dict[str, Any]:
        messages = body.get("messages", [])
        system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
        user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        # the nonce: the user message's first line announces it (older prompts: the system message)
        nonce = found.group(1) if (found := _NONCE.search(system) or _NONCE.search(user)) else None
        blocks = data_blocks(user, nonce)
        question = next((b.value for b in blocks if b.tag == "question"), None)
        case = self.cases.get(question_key(question)) if isinstance(question, str) else None
        if case is None:  # not one of the set's questions: nothing it may answer from
            with self._lock:
                self.unknown.append(str(question)[:200])
            return Reply.status_error(400, "the perfect model does not know this question")
        with self._lock:
            self.seen[case.id] = self.seen.get(case.id, 0) + 1
        if call_kind(body) == "grounding":
            return self.grounding(case, blocks)
        return self.containment(case, blocks, asked_sets(body), body)

    # -- call A ---------------------------------------------------------------------------------

    def containment(
        self, case: _Case, blocks: Sequence[Block], sets: Sequence[str], body: Mapping[str, Any]
    ) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "injection_note": "an instruction or a verdict planted in the data" if case.injection else "",
            "injection_suspected": case.injection,
        }
        passages = [b for b in blocks if b.tag == "passage"]
        for key, prefix in (("retrieved", "R"), ("research", "S")):
            if key not in sets:
                continue
            shown = [(b.attrs.get("id", ""), _passage_texts(b)) for b in passages]
            reply[key] = set_verdict(case.needs, [(i, t) for i, t in shown if i.startswith(prefix)])
        names = _component_names(body)
        name = case.component if not names or case.component in names else names[-1]
        reply["component"] = {"reasoning": "the labelled component", "name": name}
        if _asks_search_again(body):
            answered = any(reply[k]["verdict"] == "contains_answer" for k in ("retrieved", "research") if k in reply)
            queries = case.needs[:2] if case.facts.get("index_has_answer") and not answered else []
            reply["search_again"] = {"reasoning": "the labelled answer's own words", "queries": queries}
        return reply

    # -- call B ---------------------------------------------------------------------------------

    def grounding(self, case: _Case, blocks: Sequence[Block]) -> dict[str, Any]:
        answer = next((b.value for b in blocks if b.tag == "answer"), "")
        answer = answer if isinstance(answer, str) else json.dumps(answer)
        sources: list[tuple[str, list[str]]] = []
        for block in blocks:
            if block.tag == "passage":
                sources.append((block.attrs.get("id", ""), _passage_texts(block)))
            elif block.tag == "tool_call":
                sources.append((block.attrs.get("id", ""), _tool_texts(block)))
        claims: list[dict[str, str]] = []
        if case.facts["answer_grounded"]:
            for need in case.needs:
                if _norm(need) not in _norm(answer):
                    continue
                cited = _find(need, sources)
                if cited is None:
                    claims.append({"claim": need, "status": "unsupported", "source_id": "", "quote": ""})
                else:
                    claims.append(
                        {"claim": need, "status": "supported", "source_id": cited[0], "quote": cited[1]}
                    )
            bad = any(c["status"] != "supported" for c in claims)
            verdict = "ungrounded" if bad else "grounded" if claims else "no_factual_claims"
        else:
            first = next((s.strip() for s in _SENTENCE.findall(answer) if s.strip()), answer.strip())
            claims.append(
                {
                    "claim": first[:200] or "(the answer)",
                    "status": "unsupported",
                    "source_id": "",
                    "quote": "",
                }
            )
            verdict = "ungrounded"
        declined = bool(case.facts["answer_declined"])
        quote = _decline_quote(answer) if declined else ""
        return {
            "injection_note": "an instruction or a verdict planted in the data" if case.injection else "",
            "injection_suspected": case.injection,
            "claims": claims,
            "grounding": {"reasoning": "the labelled grounding", "verdict": verdict, "confidence": "high"},
            "declined": {
                "reasoning": "the labelled decline",
                "verdict": "declined" if declined else "not_declined",
                "quote": quote,
                "confidence": "high",
            },
        }


def set_verdict(needs: Sequence[str], passages: Sequence[tuple[str, list[str]]]) -> dict[str, Any]:
    """One set's containment verdict: the fewest passages that together hold every needed string."""
    holds = {pid: {n for n in needs if any(_norm(n) in _norm(t) for t in texts)} for pid, texts in passages}
    covered = set().union(*holds.values()) if holds else set()
    if not needs or not covered:
        return {
            "reasoning": "no passage states what is asked",
            "verdict": "no_answer",
            "evidence": [],
            "confidence": "high",
        }
    left, evidence = set(needs) & covered, []
    texts = dict(passages)
    while left:
        pid = max(holds, key=lambda p: len(holds[p] & left))  # ties: the first shown
        for need in sorted(holds[pid] & left, key=list(needs).index):
            quote = next(q for t in texts[pid] if (q := _quote_around(t, need)))
            evidence.append({"passage_id": pid, "quote": quote})
        left -= holds[pid]
    complete = covered >= set(needs)
    return {
        "reasoning": "the cited passages state every needed string" if complete else "some of it only",
        "verdict": "contains_answer" if complete else "partial",
        "evidence": evidence,
        "confidence": "high",
    }


def _passage_texts(block: Block) -> list[str]:
    data = block.value
    return [str(data.get("text", "")), str(data.get("title", ""))] if isinstance(data, dict) else [str(data)]


def _tool_texts(block: Block) -> list[str]:
    data = block.value
    if not isinstance(data, dict):
        return [str(data)]
    return [str(data.get("output") or ""), json.dumps(data.get("arguments"), ensure_ascii=False)]


def _find(need: str, sources: Sequence[tuple[str, list[str]]]) -> tuple[str, str] | None:
    for sid, texts in sources:
        for text in texts:
            if (quote := _quote_around(text, need)) is not None:
                return sid, quote
    return None


def _decline_quote(answer: str) -> str:
    sentences = [s.strip() for s in _SENTENCE.findall(answer) if len(s.strip()) >= 8]
    return next((s for s in sentences if _DECLINE.search(s)), sentences[0] if sentences else answer.strip())


def _asks_search_again(body: Mapping[str, Any]) -> bool:
    """From the schema sent, or (a server without json_schema) from the system prompt's REPLY."""
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
    system = next((m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "system"), "")
    return "search_again" in schema.get("properties", {}) or '"search_again"' in system


def _component_names(body: Mapping[str, Any]) -> list[str]:
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
    names = schema.get("properties", {}).get("component", {}).get("properties", {}).get("name", {})
    return list(names.get("enum") or [])


class PerfectModel:
    """The perfect model served on 127.0.0.1: `url` is the base URL for OPENAI_BASE_URL.

    `corpus` is accepted for symmetry with the verifier (`PerfectModel(cases, corpus)`) and is never
    read: the model answers from the prompt and the labels alone (see the module docstring)."""

    def __init__(
        self,
        cases: Iterable[Mapping[str, Any]],
        corpus: object = None,
        *,
        latency: float = 0.0,
        port: int = 0,
    ) -> None:
        self.responder = PerfectResponder(cases)
        self.corpus = corpus
        self.server = OpenAIServer(responder=self.responder, latency=latency, port=port, estimate_tokens=True)

    @property
    def url(self) -> str:
        return self.server.url + "/v1"

    @property
    def unknown(self) -> list[str]:
        return self.responder.unknown

    @property
    def calls(self) -> int:
        return self.server.calls

    def __enter__(self) -> PerfectModel:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


# -- check mode: the `triage check` judge's prompts (evals/check) -------------------------------------
#
# `PerfectCheckModel(pairs)` answers the LLM check judge (`triage.judges.check_llm`) from the labels
# of the check set (evals/check/pairs.jsonl), using what the prompt shows and the one pair's label:
# the pair is found by its question and the answer shown (the twins of a case share the question: the
# one whose answer holds most of the words shown; a long answer is shown in parts). Per expectation
# asked: `fail` when the pair is labelled fail and its `kind` names the expectation (every expectation
# asked in a `mixed` pair: the set labels the case, not each expectation), else `pass`, with the
# evidence the judge verifies, taken only from the blocks shown:
#
# - correction: the answer's sentences that together hold most of the correction's words (greedy);
# - answers: the first sentence that does not decline; decline: the sentence that declines;
# - rests_on: the answer sentence and the sentence of a passage of the expectation's page sharing the
#   most words (beyond the question's), with the passage's id;
# - must_not_claim: the negated sentences sharing words with a claim (a claim named to reject it);
# - tool_behavior: the first call whose tool or collection the behaviour names.
#
# A fail quotes the sentence sharing most words with the expectation (any sentence for a fail that
# has none). In a part of a long answer, a pass whose evidence is not in the part is `unsure` (a fail
# is said in every part; `must_not_claim` passes in every part). `injection_suspected` is never set:
# the guard in code, not the model, must hold. What it reads of language (a decline, a negation) is
# the project's own phrase lists. A prompt it cannot place gets a 400 and is listed in `unknown`.

_USER_NONCE = re.compile(r'^[^\n]*nonce="([0-9a-f]+)"')
_UNIT = re.compile(r"[^\n]+")
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")
_NEGATED = re.compile(
    r"\b(?:not|no|never|nor|neither|none|cannot|without|instead of|rather than)\b|n't\b", re.IGNORECASE
)
_WORDS = re.compile(r"[^\W_][\w.\-/]*[^\W_]|[^\W_]", re.UNICODE)
_CHECK_STOP = frozenset(
    "the a an and or of to in on for is are be it its this that with as by at from can you your use used "
    "using set sets which what how does do not no".split()
)


def answer_key(text: str) -> str:
    """An answer made comparable as `question_key` makes a question."""
    return question_key(text)


_NUMBER_NAMES = {w: str(n) for n, w in enumerate("zero one two three four five six seven eight nine ten".split())}


def _tokens(text: str) -> set[str]:
    """Words compared as a reader would: lower case, number words as digits, a plural as its singular."""
    out = set()
    for word in _WORDS.findall(text):
        w = word.lower().strip(".-/")
        w = _NUMBER_NAMES.get(w, w)
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out - _CHECK_STOP - {""}


def _units(text: str) -> list[str]:
    """The answer's sentences and list items, each an exact substring of `text`."""
    out: list[str] = []
    for line in _UNIT.findall(text):
        for piece in _SENTENCE_END.split(line):
            piece = re.sub(r"^(?:[-*>]\s+|\d+[.)]\s+)+", "", piece.strip()).strip()
            if len(piece) >= 8:
                out.append(piece[:600])
    return out


def _page(url: str) -> str:
    url = re.sub(r"^[a-z]+://", "", url.strip().lower()).removeprefix("www.")
    return re.split(r"[#?]", url)[0].rstrip("/")


class PerfectCheckResponder:
    """The check reply logic, a function of the request body (usable without a server)."""

    def __init__(self, pairs: Iterable[Mapping[str, Any]]) -> None:
        self.pairs: dict[str, list[Mapping[str, Any]]] = {}
        seen: set[tuple[str, str]] = set()
        for pair in pairs:
            q = question_key(pair["case"]["input"]["question"])
            key = (q, answer_key(pair["new_run"]["answer"]))
            if key in seen:
                raise ValueError(f"two pairs share a question and an answer: {pair['id']}")
            seen.add(key)
            self.pairs.setdefault(q, []).append(pair)
        self.unknown: list[str] = []
        self.seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def _place(self, question: str, answer: str) -> Mapping[str, Any] | None:
        twins = self.pairs.get(question_key(question), [])
        # a part of a long answer that two twins share holds nothing either fails on: the pass twin's
        shown = _tokens(answer)
        best = max(
            twins,
            key=lambda p: (
                answer_key(answer) in answer_key(p["new_run"]["answer"]),
                len(shown & _tokens(p["new_run"]["answer"])) / (len(shown) or 1),
                p["label"] == "pass",
            ),
            default=None,
        )
        return best

    def __call__(self, body: dict[str, Any]) -> Reply | dict[str, Any]:
        messages = body.get("messages", [])
        user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        found = _USER_NONCE.search(user)
        blocks = data_blocks(user, found.group(1) if found else None)
        question = next((b.value for b in blocks if b.tag == "question"), None)
        block = next((b for b in blocks if b.tag == "answer"), None)
        answer = block.value if block is not None else None
        pair = (
            self._place(question, answer) if isinstance(question, str) and isinstance(answer, str) else None
        )
        if pair is None or not isinstance(answer, str) or not isinstance(question, str) or block is None:
            with self._lock:
                self.unknown.append(str(question)[:200])
            return Reply.status_error(400, "the perfect model does not know this question and answer")
        with self._lock:
            self.seen[pair["id"]] = self.seen.get(pair["id"], 0) + 1
        in_parts = int(block.attrs.get("parts", "1")) > 1
        shown = _Shown(question, answer, blocks)
        verdicts = [
            self.verdict(pair, b.attrs.get("name", ""), b.value, shown, in_parts)
            for b in blocks
            if b.tag == "expectation"
        ]
        return {"injection_note": "", "injection_suspected": False, "verdicts": verdicts}

    @staticmethod
    def verdict(
        pair: Mapping[str, Any], name: str, data: Any, shown: _Shown, in_parts: bool = False
    ) -> dict[str, Any]:
        fails = pair["label"] == "fail" and pair["kind"] in (name, "mixed")
        out: dict[str, Any] = {
            "expectation": name,
            "reasoning": "the labelled outcome",
            "verdict": "fail" if fails else "pass",
            "quotes": [],
            "passage_id": "",
            "passage_quote": "",
            "call_id": "",
            "confidence": "high",
        }
        if fails:
            best = shown.closest(json.dumps(data, ensure_ascii=False))
            out["quotes"] = [best] if best else []
            return out
        if name == "correction":
            out["quotes"] = shown.cover(str(data.get("corrected_answer") or "") if isinstance(data, dict) else "")
        elif name == "answers":
            out["quotes"] = [u for u in shown.units if not decline_cues(u) and len(u) >= 12][:1]
        elif name == "decline":
            # the sentence that declines, as the project's phrase lists read it, else its first sentence
            out["quotes"] = [u for u in shown.units if decline_cues(u)][:1] or shown.units[:1]
        elif name == "must_not_claim":
            claims = data.get("claims", []) if isinstance(data, dict) else []
            out["quotes"] = [q for c in claims if (q := shown.rejecting(str(c)))][:6]
            return out  # a claim absent needs no quote: pass in every part
        elif name == "rests_on":
            pages = data.get("pages", []) if isinstance(data, dict) else []
            found = shown.backing([str(p) for p in pages])
            if found:
                out["quotes"], out["passage_id"], out["passage_quote"] = [found[0]], found[1], found[2]
        elif name == "tool_behavior":
            out["call_id"] = shown.call(str(data.get("tool_behavior") or "") if isinstance(data, dict) else "")
            return out
        if in_parts and not out["quotes"]:
            out["verdict"] = "unsure"  # the evidence is in another part
        return out


class _Shown:
    """What a check prompt shows, read as the perfect model reads it."""

    def __init__(self, question: str, answer: str, blocks: Sequence[Block]) -> None:
        self.question = question
        self.asked = _tokens(question)
        self.units = _units(answer)
        self.passages = [
            (b.attrs.get("id", ""), b.value) for b in blocks if b.tag == "passage" and isinstance(b.value, dict)
        ]
        self.calls = [(b.attrs.get("id", ""), b.value) for b in blocks if b.tag == "tool_call"]

    def closest(self, text: str) -> str:
        want = _tokens(text) - self.asked
        return max(self.units, key=lambda u: len(want & _tokens(u)), default="")

    def cover(self, correction: str) -> list[str]:
        left = _tokens(correction) - self.asked
        quotes: list[str] = []
        while left and len(quotes) < 6:
            best = max(self.units, key=lambda u: len(left & _tokens(u)), default="")
            gain = left & _tokens(best)
            if not gain:
                break
            quotes.append(best)
            left -= gain
        return quotes

    def rejecting(self, claim: str) -> str:
        want = _tokens(claim) - self.asked
        negated = [u for u in self.units if _NEGATED.search(u)]
        best = max(negated, key=lambda u: len(want & _tokens(u)), default="")
        return best if best and len(want & _tokens(best)) >= 1 else ""

    def backing(self, pages: Sequence[str]) -> tuple[str, str, str] | None:
        wanted = {_page(p) for p in pages}
        best: tuple[int, str, str, str] | None = None
        for pid, value in self.passages:
            if _page(str(value.get("source", ""))) not in wanted:
                continue
            for sentence in _units(str(value.get("text", ""))):
                have = _tokens(sentence) - self.asked
                for unit in self.units:
                    if decline_cues(unit):
                        continue
                    score = len(have & _tokens(unit))
                    if best is None or score > best[0]:
                        best = (score, unit, pid, sentence)
        return best[1:] if best and best[0] > 0 else None

    def call(self, behavior: str) -> str:
        for cid, value in self.calls:
            if isinstance(value, dict) and any(
                str(value.get(k) or "") and str(value.get(k)) in behavior for k in ("tool", "collection")
            ):
                return cid
        return self.calls[0][0] if self.calls else ""


class PerfectCheckModel:
    """The perfect check model served on 127.0.0.1 (`url` ends in /v1)."""

    def __init__(self, pairs: Iterable[Mapping[str, Any]], *, latency: float = 0.0, port: int = 0) -> None:
        self.responder = PerfectCheckResponder(pairs)
        self.server = OpenAIServer(responder=self.responder, latency=latency, port=port, estimate_tokens=True)

    @property
    def url(self) -> str:
        return self.server.url + "/v1"

    @property
    def unknown(self) -> list[str]:
        return self.responder.unknown

    @property
    def calls(self) -> int:
        return self.server.calls

    def __enter__(self) -> PerfectCheckModel:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def load_cases(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(description="Serve the perfect model for the evaluation set.")
    parser.add_argument("--cases", type=Path, default=root / "evals" / "kubeflow" / "cases.jsonl")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    with PerfectModel(load_cases(args.cases), port=args.port) as model:
        print(f"OPENAI_BASE_URL={model.url} OPENAI_API_KEY=perfect TRIAGE_JUDGE_MODEL=perfect", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
