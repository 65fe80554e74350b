"""The architecture is checked, not only described: the import-linter contracts in pyproject.toml
hold on this tree, and a contract broken on purpose fails the check (so CI would catch it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]

pytestmark = pytest.mark.slow


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LINT, "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_of_tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "triage", root / "triage", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_contracts_hold_on_this_tree(tmp_path: Path) -> None:
    result = lint(copy_of_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "bad_import", "contract"),
    [
        ("sinks/report.py", "import triage.engine.run", "Sinks never import the engine"),
        ("domain/rule.py", "import httpx", "The domain is pure"),
        ("judges/heuristic.py", "import triage.settings", "Adapters and the engine never import"),
        ("sources/store.py", "import triage.judges.heuristic", "The flow in layers"),
    ],
)
def test_a_contract_broken_on_purpose_fails(tmp_path: Path, module: str, bad_import: str, contract: str) -> None:
    root = copy_of_tree(tmp_path)
    target = root / "triage" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{bad_import}  # broken on purpose\n")
    result = lint(root)
    assert result.returncode != 0
    assert "Broken contracts" in result.stdout, result.stdout + result.stderr
    broken = " ".join(result.stdout.split("Broken contracts", 1)[1].split())  # unwrap the report's lines
    assert contract in broken
    importer = "triage." + module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {bad_import.removeprefix('import ')}" in broken
