"""Names the answer may use without a passage holding them: a passage's template filled in
(`kubeflow-view` for `kubeflow-<USER_ROLE>`) and the names the answer's own code binds
(`lgbm_task = ...`). Both are read in linear time (a long name costs no backtracking)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from triage.judges.offline.text import FILE_EXTENSIONS, fenced_code

#: a placeholder in a passage's name (`kubeflow-<USER_ROLE>`, `user-${EMAIL}-edit`): the name is a
#: template the answer may fill in
_TEMPLATE_SLOT = re.compile(r"<[A-Z][A-Z0-9_]*>|\$\{[A-Z][A-Z0-9_]*\}")
#: a template's reach on either side of a placeholder: bounded, so a long run of word characters
#: costs linear time
_NAME_BEFORE = re.compile(r"[\w./:-]{0,80}\Z")
_NAME_AFTER = re.compile(r"(?:[\w./:-]|<[A-Z][A-Z0-9_]*>|\$\{[A-Z][A-Z0-9_]*\})*")
#: a slot is filled by one name: these characters, at least one
_FILL = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.@-")
#: a Kubernetes name is at most 253 characters; longer needles are no filled-in template
_MAX_NAME = 253
_MAX_SLOTS = 3
_EXTENSION = re.compile(rf"\.{FILE_EXTENSIONS}$")


def templates_of(text: str) -> list[tuple[str, ...]]:
    r"""The templates of `text`, each as its literal parts (lower case) around its placeholders. A
    template needs a literal part of three characters or more besides a file extension (`<NAME>`
    or `<NAME>.yaml` alone fits anything), and at most three placeholders."""
    found: dict[tuple[str, ...], None] = {}
    for slot in _TEMPLATE_SLOT.finditer(text):
        before = _NAME_BEFORE.search(text, max(0, slot.start() - 80), slot.start())
        after = _NAME_AFTER.match(text, slot.end(), slot.end() + 80)
        template = (before.group(0) if before else "") + slot.group(0) + (after.group(0) if after else "")
        template = template.rstrip(".:/-")  # a sentence's period, a colon: no part of the name
        parts = tuple(part.lower() for part in _TEMPLATE_SLOT.split(template))
        if len(parts) - 1 > _MAX_SLOTS:
            continue
        if max(len(_EXTENSION.sub("", part).strip("-_./:")) for part in parts) < 3:
            continue
        found[parts] = None
    return list(found)


def _fills(name: str, parts: tuple[str, ...]) -> bool:
    """`name` is the template `parts` with each slot filled by one name (`_FILL` characters). The
    literals are found left to right, each slot taking what lies between: linear, no backtracking
    (the earliest place for each literal leaves the most room for the rest)."""
    if len(name) < len(parts[0]) + len(parts[-1]) + 1:
        return False
    if not name.startswith(parts[0]) or not name.endswith(parts[-1]):
        return False
    at, end = len(parts[0]), len(name) - len(parts[-1])
    for literal in parts[1:-1]:
        found = name.find(literal, at + 1, end) if literal else at + 1
        if found < 0 or not _FILL.issuperset(name[at:found]):
            return False
        at = found + len(literal)
    return end > at and _FILL.issuperset(name[at:end])


def fills_template(needle: str, templates: Sequence[tuple[str, ...]]) -> bool:
    """`needle` (lower case), or the name of its `Kind/name`, is a passage's template filled in."""
    if len(needle) > _MAX_NAME:
        return False
    names = {needle}
    if needle.count("/") == 1 and ":" not in needle:
        names.add(needle.split("/")[1])  # `clusterrole/kubeflow-view`
    return any(_fills(name, parts) for parts in templates for name in names)


#: a name the answer's own code binds (`lgbm_task = train_lgbm()`, `for trial in ...`, `with ... as
#: client`, `def make_op(`): the answer's variable, no claim about Kubeflow
_BOUND = re.compile(
    # `a, b = ...` and `x: int = ...` (a Python annotation; YAML's `args: --epochs=10` is none)
    r"^[ \t]*(?:(?:async[ \t]+)?def[ \t]+(\w+)|(\w+(?:[ \t]*,[ \t]*\w+)*)[ \t]*(?::[ \t]*[\w\[\]., ]+)?=(?!=)"
    r"|for[ \t]+(\w+)[ \t]+in\b)|\bas[ \t]+(\w+)[ \t]*:",
    re.MULTILINE,
)


def bound_names(answer: str) -> set[str]:
    """The names the answer's fenced code binds, lower case (a one-letter name is none). Only lines
    outside brackets bind: `pip_extra_index_url='...'` inside a call is a keyword argument, a claim."""
    names: set[str] = set()
    for block in fenced_code(answer):
        depth = 0
        for line in block.splitlines():
            if depth == 0:
                for match in _BOUND.finditer(line):
                    found = (n for group in match.groups() if group for n in re.split(r"[ \t]*,[ \t]*", group))
                    names.update(n.lower() for n in found if len(n) > 1)
            depth = max(0, depth + sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}"))
    return names


def own_name(needle: str, bound: set[str], haystack_words: set[str]) -> bool:
    """`needle` is a bound name, or an attribute or call of one whose names are seen
    (`lgbm_task.output`; not an invented `client.magic_resume_all()`)."""
    head, _, rest = needle.partition(".")
    if not bound or re.split(r"[(\[]", head, maxsplit=1)[0] not in bound:
        return False
    return all(word in haystack_words for word in re.findall(r"[a-z_][a-z0-9_]*", rest))
