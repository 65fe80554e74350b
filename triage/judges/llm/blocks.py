"""The citable blocks of a prompt: passage sets (R1.., S1..) and tool calls (T1..), cleaned and capped.

Each block keeps the cleaned text exactly as the model saw it, which is what quotes are checked
against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from triage.domain.records import Passage, Trace
from triage.errors import JudgeError
from triage.judges import prompts
from triage.judges.llm.quotes import BLOCK_ID, normalise
from triage.judges.llm.replies import SetKey

# Field caps (characters). They bound the prompt (about 8k tokens for a typical trace) and stop a
# huge tool output from crowding out the rest.
CAP_QUESTION = 2000
CAP_COMMENT = 1000
CAP_ANSWER = 8000
CAP_PASSAGE = 2000
CAP_TITLE = 300
CAP_URL = 500
CAP_TOOL_OUTPUT = 3000
CAP_TOOL_ARG = 500
MAX_PASSAGES = 24
MAX_TOOL_CALLS = 12


@dataclass
class Block:
    """A citable block as the model saw it: the cleaned text quotes are checked against."""

    id: str
    texts: list[str]
    source_url: str | None = None
    collection: str | None = None


@dataclass
class PassageSet:
    key: SetKey
    prefix: str
    passages: list[dict[str, str]] = field(default_factory=list)
    blocks: dict[str, Block] = field(default_factory=dict)


def passage_set(key: SetKey, prefix: str, passages: Sequence[Passage], nonce: str) -> PassageSet:
    out = PassageSet(key=key, prefix=prefix)
    seen: set[str] = set()
    for passage in passages:
        if len(out.passages) >= MAX_PASSAGES:
            break
        if not BLOCK_ID.match(passage.id):
            raise JudgeError(f"passage id {passage.id[:20]!r} is not a short id like R1 or S1")
        text = prompts.clean(passage.text, CAP_PASSAGE, nonce)
        if normalise(text) in seen:  # the same chunk found by two queries: send it once
            continue
        seen.add(normalise(text))
        title = prompts.clean(passage.title or "", CAP_TITLE, nonce)
        data = {
            "title": title,
            "source": prompts.clean(passage.source_url or "", CAP_URL, nonce),
            "collection": prompts.clean(passage.collection or "", 40, nonce),
            "text": text,
        }
        out.passages.append({"id": passage.id, "data": prompts.encode(data)})
        out.blocks[passage.id] = Block(passage.id, [text, title], passage.source_url, passage.collection)
    return out


def tool_blocks(trace: Trace, nonce: str) -> tuple[list[dict[str, str]], dict[str, Block]]:
    """Tool calls as T1..; a search output whose results are already listed as passages is not sent
    twice (it is the same text, and it would double the prompt)."""
    shown = [normalise(p.text)[:80] for p in trace.passages if p.text.strip()]
    calls: list[dict[str, str]] = []
    blocks: dict[str, Block] = {}
    for number, call in enumerate(trace.tool_calls[:MAX_TOOL_CALLS], start=1):
        tid = f"T{number}"
        output_norm = normalise(call.output)
        if call.is_search and not call.error and shown and any(s in output_norm for s in shown):
            output = "[the results of this search are listed as passages in the retrieved set]"
        else:
            output = prompts.clean(call.output, CAP_TOOL_OUTPUT, nonce)
        args = prompts.clean_value(call.args, CAP_TOOL_ARG, nonce)
        data = {
            "tool": prompts.clean(call.name, 100, nonce),
            "arguments": args,
            "error": call.error,
            "output": output,
        }
        calls.append({"id": tid, "data": prompts.encode(data)})
        blocks[tid] = Block(tid, [output, prompts.encode(args)])
    return calls, blocks
