"""JSON Lines, split, read and written one way by every reader and writer of triage (pure: no I/O).

A line ends at "\\n" and nowhere else. `str.splitlines` also ends one at U+2028, U+2029, U+0085,
\\x0b, \\x0c and \\x1c-\\x1e, and JSON keeps U+2028, U+2029 and U+0085 raw inside a string: a
correction pasted with a line separator cut its line in two, and every rerun then failed on it.
The writer escapes those three anyway (`dumps`), so tools that split like `splitlines` (editors,
JavaScript) read the file the same. A line nested too deeply for `json.loads` (a RecursionError)
is a `ValueError` like any other line that is not JSON, so each reader lists it with its number.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, overload

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
    UTF-8 (bytes), or nested too deeply to read."""
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


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
