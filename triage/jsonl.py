"""JSON Lines, split, read and written one way by every reader and writer of triage (pure: no I/O).

A line ends at "\\n" and nowhere else. `str.splitlines` also ends one at U+2028, U+2029, U+0085,
\\x0b, \\x0c and \\x1c-\\x1e, and JSON keeps U+2028, U+2029 and U+0085 raw inside a string: a
correction pasted with a line separator cut its line in two, and every rerun then failed on it.
The writer escapes those three anyway (`dumps`), so tools that split like `splitlines` (editors,
JavaScript) read the file the same.

A line each reader could not use whole is a `ValueError` like any other line that is not JSON, so
each reader lists it with its number: one nested too deeply for `json.loads` (a RecursionError),
one nested deeper than `MAX_DEPTH` (it decodes, but a value a frame short of the recursion limit
crashed whatever walked it next: a reason quoting it, a rewrite of the file), and one holding a
lone UTF-16 surrogate (a `\\ud83d` escape decodes to one; UTF-8, so SQLite and every file written
back, cannot encode it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, overload

from triage.domain.scores import unencodable

#: the deepest nesting of arrays and objects a line may have: far beyond any record triage reads
#: (a trace's metadata, a label, a dataset item), and far below the recursion limit of whatever
#: walks the value next
MAX_DEPTH = 100

#: characters `str.splitlines` treats as line ends that `json.dumps(ensure_ascii=False)` leaves raw
_RAW_LINE_ENDS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_ESCAPE = str.maketrans(_RAW_LINE_ENDS)


@overload
def lines(data: str) -> Iterator[tuple[int, str]]: ...
@overload
def lines(data: bytes) -> Iterator[tuple[int, bytes]]: ...
def lines(data: str | bytes) -> Iterator[tuple[int, str]] | Iterator[tuple[int, bytes]]:
    """The non-blank lines of JSONL text (or bytes, each line decoded by `parse`), numbered from 1
    as an editor numbers them: split on "\\n" only."""
    if isinstance(data, str):
        return ((number, line) for number, line in enumerate(data.split("\n"), start=1) if line.strip())
    return ((number, line) for number, line in enumerate(data.split(b"\n"), start=1) if line.strip())


def parse(line: str | bytes) -> Any:
    """One line's JSON value. ValueError (its message says why) when the line is not JSON, not
    UTF-8 (bytes), nested too deeply to read, or holds text UTF-8 cannot encode."""
    try:
        value = json.loads(line)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
    if _deeper_than(value, MAX_DEPTH):
        raise ValueError(f"JSON nested too deeply to read (over {MAX_DEPTH} levels)")
    where = unencodable(value)  # recursive, so only once the depth is known to be small
    if where is not None:
        raise ValueError(f"the text at {where} holds a lone UTF-16 surrogate, which UTF-8 cannot encode")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels (a loop: no recursion to run out of)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def dumps(
    value: Any,
    *,
    sort_keys: bool = False,
    separators: tuple[str, str] | None = None,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """One JSONL line, without its "\\n": text kept as text (not `\\u` escapes), but U+0085, U+2028
    and U+2029 escaped (they can only be inside strings, where the escape reads back the same)."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=sort_keys, separators=separators, default=default)
    return text.translate(_ESCAPE)
