"""Test doubles: fakes for the ports (queue-driven, with `enqueue()` and `history`), a virtual
clock, httpx transports for the Langfuse client, and real-protocol servers on 127.0.0.1."""
