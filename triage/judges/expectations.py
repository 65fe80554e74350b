"""The check judges (`triage check`): does the agent's new run meet its regression case's expectations?

Two `domain.checks.CheckJudge`s decide, expectation by expectation (`Expected.names()`), each with
its evidence (the quoted span, the matching URL, the tool call) and a confidence:

- **code decides the mechanical two, for both judges** (no model can do them better):
  `must_cite` holds when a URL the answer cites (its `sources`, or a URL written in the answer) or
  a retrieved passage's `source_url` is the same page as one of the case's URLs (`page_of`: the
  scheme, the host's case, `www.`, a trailing slash, a `#anchor` or `#L..` and a `?query` do not
  change the page); `tool_behavior` holds when the run called the tool, or searched the collection,
  that the expected behaviour names (`call a search tool` takes any search; a name after "not",
  "instead of" or "rather than" is not wanted). A run that does not say which tools it called
  (`AgentRun.tool_calls` None) leaves it undecided, and a behaviour that names no tool or collection
  is left to the model (the offline judge leaves it undecided).
- **the offline judge** (`OfflineCheckJudge`, no model) decides the other three with the offline
  triage judge's machinery (`offline_text`: decline phrases, specifics; `grounding`: specifics seen
  nowhere, `key: value` swaps), and says `passed=None` where that machinery cannot be sure:
  - `correction`: a value of the correction (its specifics and numbers, number words read as
    digits) missing from the answer, or a `key: value` of the answer that swaps one of the
    correction's, fails. Every value present is no pass: whether an added sentence contradicts the
    correction ("start_step is only advisory") is meaning, not strings (undecided).
  - `must_not_claim`: per claim, its *anchors* (its code spans, specifics and proper names beyond
    the question's words) and its content words are looked for in the answer's prose sentences
    (fenced code states no claim). A sentence holding every anchor and half of the words (three
    quarters for a claim without anchors), with the claim's polarity, makes it again (fail); one
    holding them with the other polarity ("not `bayesian`") names it to reject it; a claim none of
    whose anchors, or none of whose quoted values, appears anywhere is gone. Anything in between
    (a rewording, a part of the claim) is undecided.
  - `decline`: a decline phrase (`offline_text.decline_phrases`) and no specific that no retrieved
    passage holds (`grounding.unsupported_specifics`, against the question and the passages):
    invented specifics fail (a decline that goes on to a field, command or value of its own, or no
    decline at all); a single one is undecided (a harmless name the agent knows, or not); no
    decline phrase fails, unless the answer says something is not told ("nothing about TLS").
- **the LLM judge** (`LLMCheckJudge`) asks an OpenAI-compatible model, in one call per case, about
  the expectations code cannot decide (`correction`, `must_not_claim`, `decline`, and a tool
  behaviour code cannot read). The instructions are one byte-identical system message
  (`prompts/check_system.j2`, cache-friendly: no nonce, no case in it); the untrusted text (the
  question, the expectations, the answer, the sources, the passages, the tool calls) follows in the
  user message (`prompts/check_user.j2`), cleaned and JSON-encoded inside blocks fenced with a
  per-call nonce. The reply is structured (a fixed strict schema, a verdict per expectation asked:
  `pass | fail | unsure` with a quote and a confidence) and verified in code: every expectation
  asked answered once, every quote an exact substring of the answer shown, a claim made again and
  a decline that passes quoted. A reply that fails gets one retry told why; an unusable reply
  (not JSON, refused, failing twice) makes the expectations asked undecided with the reason, never
  a crash.

Both apply the injection guard of `judges.prompts` to the answer: an answer that tries to instruct
or fool the judge is never passed by the judge alone (a pass becomes undecided, for a person); a
fail stands. The LLM judge also lowers a pass the model itself flags.

`CHECK_JUDGES` (name -> factory from a `judges.JudgeSetup`) is their registry: the triage
registry `JUDGES` holds `domain.ports.Judge`s (a trace to facts), a shape these do not have.
"""
from __future__ import annotations

from collections.abc import Callable

import openai

from triage.domain.checks import CheckJudge
from triage.errors import ConfigError
from triage.judges import JudgeSetup
from triage.judges.check_evidence import check_must_cite, check_tool_behavior, page_of
from triage.judges.check_llm import LLMCheckJudge
from triage.judges.check_offline import OfflineCheckJudge

__all__ = [
    "CHECK_JUDGES",
    "LLMCheckJudge",
    "OfflineCheckJudge",
    "check_must_cite",
    "check_tool_behavior",
    "page_of",
]

# -- the registry ------------------------------------------------------------------------------------


def _offline(setup: JudgeSetup) -> OfflineCheckJudge:
    return OfflineCheckJudge(tools=setup.config.tools)


def _llm(setup: JudgeSetup) -> LLMCheckJudge:
    if not setup.model:
        raise ConfigError("the llm check judge needs a model: set TRIAGE_JUDGE_MODEL (and OPENAI_API_KEY)")
    client = openai.AsyncOpenAI(base_url=setup.base_url, api_key=setup.api_key or "unused", max_retries=0)
    return LLMCheckJudge(
        client=client,
        model=setup.model,
        tools=setup.config.tools,
        concurrency=setup.config.judge.concurrency,
        budget=setup.budget,
    )


#: the check judges by name (`triage check --judge`): a factory from the judges' setup
CHECK_JUDGES: dict[str, Callable[[JudgeSetup], CheckJudge]] = {
    "offline": _offline,
    "llm": _llm,
}
