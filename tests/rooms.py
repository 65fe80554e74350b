"""The rooms of `triage/` as the tree holds them: each module, its lines and its subject (the first
sentence of its docstring), and the figures ARCHITECTURE.md quotes.

`python -m tests.rooms` prints the table; `tests/test_docs.py` reads `modules()` and `subject()` to
keep ARCHITECTURE.md's rules true (a subject per module, the exceptions past 600 lines or under 60).
The per-module table is printed here, not kept in a page: a module's subject is said once, in its
docstring, so a new module costs no row anywhere."""

from __future__ import annotations

import ast
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "triage"

#: the module size past which a module is argued (a soft cap), and below which it holds a protocol,
#: constants or a package's entry
SOFT_CAP, FLOOR = 600, 60
#: the first sentence: up to a full stop followed by a space or the end
_SENTENCE = re.compile(r"^(.+?\.)(?:\s|$)", re.S)


def _code(tree: ast.Module) -> list[ast.stmt]:
    return [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]


def modules() -> dict[str, int]:
    """Every module of `triage/` and its lines; a package's `__init__.py` holding nothing but a
    docstring is a package marker, no module."""
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name == "__init__.py" and not _code(ast.parse(text)):
            continue
        found[path.relative_to(REPO).as_posix()] = len(text.splitlines())
    return found


def packages() -> list[str]:
    """Every package of `triage/` (a folder with an `__init__.py`), `triage/` itself first."""
    return sorted(p.parent.relative_to(REPO).as_posix() + "/" for p in PACKAGE.rglob("__init__.py"))


def subject(module: str) -> str | None:
    """A module's subject: its docstring's first sentence on one line; None without a docstring."""
    doc = ast.get_docstring(ast.parse((REPO / module).read_text(encoding="utf-8")))
    if not doc:
        return None
    paragraph = doc.strip().split("\n\n", 1)[0]
    found = _SENTENCE.match(paragraph)
    return " ".join((found.group(1) if found else paragraph).split())


def table() -> str:
    """The per-module table, in Markdown, and the figures above it."""
    sizes = modules()
    total = sum(sizes.values())
    largest = ", ".join(
        f"`{m.removeprefix('triage/')}` {n}" for m, n in sorted(sizes.items(), key=lambda i: -i[1])[:5]
    )
    lines = [
        f"**{len(sizes)} modules, {total:,} lines** in `triage/` (median {statistics.median(sizes.values()):g}); "
        f"largest: {largest}.",
        "",
        "| module | lines | subject |",
        "|---|---:|---|",
    ]
    for module, size in sizes.items():
        said = (subject(module) or "(no docstring)").replace("|", "\\|")
        lines.append(f"| `{module}` | {size} | {said} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
