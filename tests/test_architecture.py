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
        ("judges/offline/grounding.py", "import triage.judges.model.prompts", "The judges' wing in floors"),
        ("judges/model/replies.py", "import triage.judges.offline.text", "The judges' wing in floors"),
        ("judges/guard.py", "import triage.judges.model.prompts", "The judges' wing in floors"),
        ("judges/offline/text.py", "import triage.judges.heuristic", "The judges' lower floors never import a judge"),
        # a judge no contract names: the wildcard forbids it all the same
        ("judges/guard.py", "import triage.judges.check_replies", "The judges' lower floors never import a judge"),
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


_CYCLES = """
import json, sys
import grimp

graph = grimp.build_graph(sys.argv[1], cache_dir=None)
index, low, stack, cycles = {}, {}, [], []

def visit(module):  # Tarjan's algorithm: each strongly connected group of 2+ modules is a cycle
    index[module] = low[module] = len(index)
    stack.append(module)
    for other in sorted(graph.find_modules_directly_imported_by(module) & graph.modules):
        if other not in index:
            visit(other)
            low[module] = min(low[module], low[other])
        elif other in stack:
            low[module] = min(low[module], index[other])
    if low[module] == index[module]:
        group = [stack.pop()]
        while group[-1] != module:
            group.append(stack.pop())
        if len(group) > 1:
            cycles.append(sorted(group))

sys.setrecursionlimit(10000)
for module in sorted(graph.modules):
    if module not in index:
        visit(module)
print(json.dumps(cycles))
"""


def import_cycles(package: str, root: Path) -> list[list[str]]:
    """The import cycles of `package` under `root` (every import, those under TYPE_CHECKING too),
    read by grimp in a process of its own (so it reads `root`'s files, not the imported package)."""
    import json

    result = subprocess.run(
        [sys.executable, "-c", _CYCLES, package],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    cycles: list[list[str]] = json.loads(result.stdout)
    return cycles


def test_no_module_imports_itself_through_others() -> None:
    assert import_cycles("triage", REPO) == []


def test_a_cycle_made_on_purpose_is_found(tmp_path: Path) -> None:
    root = copy_of_tree(tmp_path)
    rounds = root / "triage" / "judges" / "model" / "exchange.py"
    # the cycle #38 broke: the exchange typed its batch lane with the rounds that import it back
    rounds.write_text(rounds.read_text(encoding="utf-8") + "\nimport triage.judges.model.rounds  # on purpose\n")
    cycles = import_cycles("triage", root)
    assert any("triage.judges.model.exchange" in group and "triage.judges.model.rounds" in group for group in cycles)
