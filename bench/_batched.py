"""The nightly job as a user would write it with Langfuse's own batch evaluator (SDK 5.0.4).

    python bench/_batched.py [--concurrency 5] [--fetch-batch-size 50] [--since-hours 24]

Settings from the environment, as the SDK reads them: LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY,
LANGFUSE_BASE_URL; OPENAI_BASE_URL, OPENAI_API_KEY; TRIAGE_JUDGE_MODEL names the model.

`Langfuse.run_batched_evaluation` walks root observations of the window (it cannot select by a
`user_feedback` vote; every trace of the benchmark is a thumbs-down, so this is the same set). The
async mapper reads the trace's tool observations (the passages the judge needs; the root row has
only the question and the answer), the async evaluator makes one judge call through an
`AsyncOpenAI` client, and the runner writes one CATEGORICAL score per trace through the SDK's
background uploader, flushed at the end. Prints one JSON line with the result counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import openai
from langfuse import Evaluation, EvaluatorInputs, Langfuse

LAYERS = ["ok", "generation", "retrieval", "content_gap_handled", "content_gap_hallucination"]
SCHEMA = {
    "type": "object",
    "properties": {"reasoning": {"type": "string"}, "layer": {"type": "string", "enum": LAYERS}},
    "required": ["reasoning", "layer"],
    "additionalProperties": False,
}
SYSTEM = (
    "You review a thumbs-down answer of the Kubeflow docs assistant. From the question, the passages "
    "its searches returned and its answer, say which layer failed. Reply with JSON."
)


def _text(raw: str | None) -> str:
    """A v2 observation's input/output (a JSON-encoded string) as plain text."""
    if raw is None:
        return ""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(value, dict):
        if isinstance(value.get("messages"), list):
            users = [m for m in value["messages"] if m.get("role") == "user"]
            return str(users[-1].get("content", "")) if users else ""
        return str(value.get("content") or value.get("output") or value)
    return value if isinstance(value, str) else json.dumps(value)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=5)
    parser.add_argument("--fetch-batch-size", type=int, default=50)
    parser.add_argument("--since-hours", type=float, default=24.0)
    args = parser.parse_args()

    started = time.monotonic()
    langfuse = Langfuse()  # keys and base URL from the environment
    judge = openai.AsyncOpenAI()  # base URL and key from the environment
    model = os.environ["TRIAGE_JUDGE_MODEL"]
    end = datetime.now(UTC) - timedelta(minutes=15)
    begin = end - timedelta(hours=args.since_hours, minutes=60)
    condition = [
        {"type": "boolean", "column": "isRootObservation", "operator": "=", "value": True},
        {"type": "datetime", "column": "startTime", "operator": ">=", "value": begin.isoformat()},
        {"type": "datetime", "column": "startTime", "operator": "<", "value": end.isoformat()},
    ]

    async def mapper(*, item: Any) -> EvaluatorInputs:
        # the passages live on the trace's TOOL observations: one more read per trace
        page = await asyncio.to_thread(
            langfuse.api.observations.get_many, trace_id=item.trace_id, fields="core,basic,io", limit=1000
        )
        tools = [o for o in page.data if o.type == "TOOL"]
        passages = "\n\n".join(f"[{o.name}]\n{_text(o.output)[:6000]}" for o in tools)
        return EvaluatorInputs(
            input=_text(item.input),
            output=_text(item.output),
            expected_output=None,
            metadata={"passages": passages},
        )

    async def triage_layer(
        *, input: Any, output: Any, expected_output: Any, metadata: dict[str, Any] | None, **_: Any
    ) -> Evaluation:
        passages = (metadata or {}).get("passages", "")
        completion = await judge.chat.completions.create(
            model=model,
            temperature=0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "batch_triage", "strict": True, "schema": SCHEMA},
            },
            messages=[
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": f"Question:\n{input}\n\nPassages:\n{passages}\n\nAnswer:\n{output}",
                },
            ],
        )
        reply = json.loads(completion.choices[0].message.content or "{}")
        return Evaluation(
            name="batch_triage_layer",
            value=reply["layer"],
            comment=reply.get("reasoning"),
            data_type="CATEGORICAL",
        )

    result = langfuse.run_batched_evaluation(
        mapper=mapper,
        evaluators=[triage_layer],
        filter=json.dumps(condition),
        fetch_batch_size=args.fetch_batch_size,
        max_concurrency=args.concurrency,
    )
    langfuse.shutdown()
    print(
        json.dumps(
            {
                "fetched": result.total_items_fetched,
                "processed": result.total_items_processed,
                "failed": result.total_items_failed,
                "scores": result.total_scores_created,
                "evaluations_failed": result.total_evaluations_failed,
                "completed": result.completed,
                "duration": result.duration_seconds,
                "elapsed": time.monotonic() - started,
            }
        )
    )
    failed = result.total_items_failed or result.total_evaluations_failed
    sys.exit(0 if result.completed and not failed else 1)


if __name__ == "__main__":
    main()
