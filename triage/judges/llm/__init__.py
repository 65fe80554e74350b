"""The LLM judge (`LLMJudge`): see `triage.judges.llm.judge`."""
