"""The demo builder (scripts/build_demo.py): the shipped demo data is exactly what its specs build."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build_demo.py"
DEMO = REPO / "triage" / "demo"


def load_builder() -> ModuleType:
    # a script, not a module of the package: load it from its file
    spec = importlib.util.spec_from_file_location("build_demo_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["traces.jsonl", "expected.jsonl"])
def test_shipped_demo_data_is_what_the_specs_build(tmp_path: Path, name: str) -> None:
    assert load_builder().main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / name).read_bytes() == (DEMO / name).read_bytes(), (
        f"triage/demo/{name} differs from what scripts/demo_specs.toml builds: run python scripts/build_demo.py"
    )


def test_the_builder_is_not_in_the_package() -> None:
    # the wheel ships every .py under triage/; the demo folder must hold data only
    assert sorted(p.relative_to(REPO).as_posix() for p in DEMO.rglob("*.py")) == []
    assert SCRIPT.is_file() and (REPO / "scripts" / "demo_specs.toml").is_file()


def test_a_misspelt_spec_key_is_rejected() -> None:
    builder = load_builder()
    trace = {"id": "t", "user": "u", "question": "q?", "answer": "a.", "ouput_shape": "chat"}
    with pytest.raises(ValueError, match="unknown keys \\['ouput_shape'\\]"):
        builder.check_trace(trace)
