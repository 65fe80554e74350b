"""The judges' model floor: one exchange with an OpenAI-compatible server, its prompts, the replies
and their checks, the Batch API and its rounds. It imports neither the evidence floor nor a judge."""
