"""Shared fixtures: every test starts with a clean environment (no real keys, no real servers)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles.clock import VirtualClock
from triage.retry import use_clock

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CORPUS = SHARED / "corpus"

_PREFIXES = ("TRIAGE_", "LANGFUSE_", "OPENAI_", "JOB_COMPLETION_INDEX")


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(_PREFIXES):
            monkeypatch.delenv(name)
    # never touch the user's real store
    monkeypatch.setenv("TRIAGE_STORE", str(tmp_path / "store.sqlite"))
    yield


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip(
            f"the shared corpus is not here ({CORPUS}); it ships only beside the project's own checkout"
        )
    return CORPUS


@pytest.fixture
def virtual_time() -> Iterator[VirtualClock]:
    """Every retry back-off and confirm poll inside the test waits in virtual time (no real sleep)."""
    with use_clock(VirtualClock()) as clock:
        yield clock
