"""triage: tells the owners of an LLM agent why its answers got a thumbs-down."""

__version__ = "0.1.0"
