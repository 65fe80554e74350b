"""What the judge is shown when a tool output or a passage set does not fit: the parts most
relevant to the question (and, for grounding, the answer), never the first N."""

from __future__ import annotations

import re

import openai
import pytest

from tests.doubles.openai_server import OpenAIServer, data_blocks, keyword_responder
from tests.judges.test_llm_judge import base_for, make_judge
from triage.domain.ports import JudgeRequest
from triage.domain.records import Passage, ToolCall, Trace
from triage.judges.model import prompts
from triage.judges.model.replies import (
    CAP_PASSAGE,
    CAP_TOOL_OUTPUT,
    MAX_PASSAGES,
    SET_BUDGET,
    passage_set,
    quote_found,
    shared_caps,
    tool_blocks,
)
from triage.reading.passages import GAP, excerpt, most_relevant, terms

QUESTION = "How do I set a default namespace so I don't have to pass namespace= to every KFP SDK call?"
ANSWER_PARA = (
    "* To set a default namespace for Pipelines SDK commands, use the `kfp.Client().set_user_namespace()` "
    "method, this method stores your user namespace in a configuration file at `$HOME/.config/kfp/context.json`."
)


def filler(n: int, topic: str = "artifact") -> str:
    """`n` paragraphs about something else, each different."""
    return "\n\n".join(
        f"Paragraph {i} explains how the {topic} store keeps outputs of step {i} for later viewing in the UI."
        for i in range(n)
    )


def test_short_text_is_unchanged() -> None:
    text = "a short passage\n\nwith two paragraphs"
    assert excerpt(text, QUESTION, 1000) == text


def test_the_answer_deep_inside_a_long_text_is_kept() -> None:
    text = filler(200) + "\n\n" + ANSWER_PARA + "\n\n" + filler(20, "metadata")
    shown = excerpt(text, QUESTION, CAP_PASSAGE)
    assert len(shown) <= CAP_PASSAGE
    assert ANSWER_PARA in shown
    assert shown.startswith(GAP.lstrip()) and shown.endswith(GAP.rstrip())  # the cuts are visible


def test_kept_parts_stay_in_their_order_and_each_is_exact() -> None:
    parts = [f"The namespace setting number {i} for the KFP SDK client." for i in range(3)]
    text = "\n\n".join([filler(40), parts[0], filler(40), parts[1], filler(40), parts[2], filler(40)])
    shown = excerpt(text, QUESTION, 600)
    positions = [shown.find(p) for p in parts]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)
    for piece in shown.split(GAP.strip()):
        assert piece.strip() in text


def test_one_long_line_is_cut_at_spaces_and_searched_too() -> None:
    html = "<div class='nav'>menu item</div> " * 2000  # 66 KB on one line, like a fetched page
    text = html + ANSWER_PARA.replace("\n", " ") + " " + html
    shown = excerpt(text, QUESTION, CAP_TOOL_OUTPUT)
    assert len(shown) <= CAP_TOOL_OUTPUT
    assert "set_user_namespace" in shown and "context.json" in shown


def test_nothing_relevant_keeps_the_head() -> None:
    text = filler(100)
    shown = excerpt(text, "zzz qqq", 500)
    assert len(shown) <= 500 and text.startswith(shown.removesuffix(GAP.rstrip()).rstrip())


def test_identifiers_match_by_their_parts() -> None:
    assert {"earlystopping", "early", "stopping"} <= set(terms("earlyStopping"))
    assert {"set_user_namespace", "user", "namespace"} <= set(terms("set_user_namespace()"))


def test_most_relevant_keeps_order_and_all_when_few() -> None:
    texts = ["kfp namespace default", "unrelated", "sdk call namespace", "other"]
    assert most_relevant(texts, QUESTION, 10) == [0, 1, 2, 3]
    assert most_relevant(texts, QUESTION, 2) == [0, 2]


def _page(i: int, text: str) -> Passage:
    return Passage(id=f"R{i}", collection="docs", source_url=f"https://x/{i}", title=f"Page {i}", text=text)


def test_a_passage_set_shows_the_answer_deep_in_a_whole_page() -> None:
    """A search server that returns whole pages (kf-014's shape): the answer near the end of the
    fourth 20 KB result still reaches the judge, quotable."""
    pages = [_page(i, filler(150)) for i in range(1, 4)]
    pages.append(_page(4, filler(150) + "\n\n" + ANSWER_PARA + "\n\n" + filler(10)))
    shown = passage_set("retrieved", "R", pages, prompts.new_nonce(), QUESTION)
    text = shown.blocks["R4"].texts[0]
    assert len(text) <= SET_BUDGET // 4  # four long pages share the set's room
    assert sum(len(b.texts[0]) for b in shown.blocks.values()) <= SET_BUDGET
    assert quote_found("set_user_namespace()` method, this method stores your user namespace", text)


def test_short_passages_leave_their_room_to_a_long_one() -> None:
    # kf-123's shape: one 5.6 KB section among two short chunks is shown whole, its far end too
    long = _page(1, filler(40) + "\n\nRegister it under `suggestions:` in katib-config.")
    pages = [long, _page(2, "Katib runs experiments."), _page(3, "Trials report metrics.")]
    assert CAP_PASSAGE < len(long.text) < SET_BUDGET
    shown = passage_set("retrieved", "R", pages, prompts.new_nonce(), QUESTION)
    assert shown.blocks["R1"].texts[0] == long.text


def test_shared_caps_never_go_below_the_floor_nor_over_the_budget() -> None:
    assert shared_caps([5627, 546, 389], 12000, 2000) == [5627, 546, 389]
    assert shared_caps([9000, 9000, 300], 12000, 2000) == [5850, 5850, 300]
    assert shared_caps([5000] * 24, 12000, 2000) == [2000] * 24  # a large set: the floor, as before
    assert shared_caps([], 12000, 2000) == []
    for lengths in ([100, 20000, 7000, 3000], [12001], [4000] * 3 + [1]):
        caps = shared_caps(lengths, 12000, 2000)
        assert all(min(n, 2000) <= c <= n for n, c in zip(lengths, caps, strict=True))
        assert sum(caps) <= max(12000, 2000 * len(lengths))


def test_a_passage_set_over_the_cap_keeps_the_relevant_ones() -> None:
    pages = [_page(i, filler(3) + f" (page {i})") for i in range(1, MAX_PASSAGES + 12)]
    pages.append(_page(MAX_PASSAGES + 12, ANSWER_PARA))
    shown = passage_set("research", "S", [p.model_copy(update={"id": f"S{p.id[1:]}"}) for p in pages],
                        prompts.new_nonce(), QUESTION)  # fmt: skip
    assert len(shown.passages) == MAX_PASSAGES
    assert f"S{MAX_PASSAGES + 12}" in shown.blocks
    ids = [p["id"] for p in shown.passages]
    assert ids == sorted(ids, key=lambda i: int(i[1:]))  # still in the order the search gave


@pytest.mark.parametrize("name", ["fetch_url", "run_kubectl"])
def test_a_large_tool_output_shows_the_part_the_answer_rests_on(name: str) -> None:
    answer = "Call `kfp.Client().set_user_namespace()`; it is saved in `$HOME/.config/kfp/context.json`."
    output = ("<li>nav</li>\n" * 3000) + ANSWER_PARA + "\n" + ("<li>footer</li>\n" * 1000)
    trace = Trace(
        id="t",
        question=QUESTION,
        answer=answer,
        tool_calls=[ToolCall(id="o1", name=name, args={"url": "https://x"}, output=output)],
    )
    nonce = prompts.new_nonce()
    calls, blocks = tool_blocks(trace, nonce, f"{QUESTION}\n{answer}")
    shown = blocks["T1"].texts[0]
    assert len(shown) <= CAP_TOOL_OUTPUT
    assert "$HOME/.config/kfp/context.json" in shown
    # and what the prompt carries is that same text, inside its data block
    block = data_blocks(f'<tool_call id="T1" nonce="{nonce}">{calls[0]["data"]}</tool_call>', nonce)[0]
    assert block.value["output"] == shown and re.search("set_user_namespace", block.value["output"])


@pytest.mark.anyio
async def test_both_judge_prompts_carry_the_answer_from_deep_in_a_long_result() -> None:
    """Through the LLM judge: the containment and the grounding prompt both show the answering
    paragraph of a 20 KB page, the fourth result of one search."""
    pages = [_page(i, filler(150)) for i in range(1, 4)]
    pages.append(_page(4, filler(150) + "\n\n" + ANSWER_PARA + "\n\n" + filler(10)))
    output = "\n---\n".join(
        f"### Result {i}\n**Source:** {p.source_url}\n\n{p.text}" for i, p in enumerate(pages, 1)
    )
    call = ToolCall(id="o1", name="search_kubeflow_docs", args={"query": "kfp namespace"}, output=output,
                    collection="docs")  # fmt: skip
    answer = "Use `kfp.Client().set_user_namespace()`; it writes `$HOME/.config/kfp/context.json`."
    trace = Trace(id="t", question=QUESTION, answer=answer, tool_calls=[call], passages=pages)
    with OpenAIServer(responder=keyword_responder) as server:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test") as client:
            judge = make_judge(client)
            await judge.judge(JudgeRequest(trace, [], None, base_for(trace)))
    for kind in ("containment", "grounding"):
        assert "$HOME/.config/kfp/context.json" in server.of_kind(kind)[0].user, kind
