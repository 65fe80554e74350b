"""Trims GitHub's REST API OpenAPI description to the operations `triage issues sync` uses.

Source of tests/doubles/github_openapi.json (regenerate with this script, never edit it by hand):

    python tests/doubles/github_openapi_trim.py FULL.json tests/doubles/github_openapi.json

- FULL.json was `generated/api.github.com.json` of the npm package `@octokit/openapi` 23.0.2, which
  is github/rest-api-description's `descriptions/api.github.com/api.github.com.json` plus `x-octokit`
  keys (this script drops them). The repository itself was too large to fetch whole here (the file
  is 12.9 MB); its stored copy at rest-api-description commit
  0000036e42b5e7121c2b1ac244cb7bba1d2f3914 was read in part and the `issue` and `issue-comment`
  schemas (properties, required, breaking-change patches) agree with this copy.
- Kept: the operations in OPERATIONS and every component they reference, transitively. Dropped:
  `examples` (documentation only, and most of the size), `x-octokit`, tags not used.
- One fix, listed in `info.x-standin-fixes`: `null` is added to the `enum` of every `nullable`
  enum (e.g. an open issue's `state_reason`, which GitHub sends as null). OAS 3.0.3 says
  `nullable` only widens `type` and an `enum` without `null` still refuses it
  (OAI/OpenAPI-Specification#1900), and openapi-core applies that, so GitHub's own answers would
  fail the unpatched description.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

#: path -> methods; exactly what the sync calls
OPERATIONS: dict[str, tuple[str, ...]] = {
    "/repos/{owner}/{repo}/issues": ("get", "post"),
    "/repos/{owner}/{repo}/issues/{issue_number}": ("get", "patch"),
    "/repos/{owner}/{repo}/issues/{issue_number}/comments": ("get", "post"),
    "/rate_limit": ("get",),
}
SOURCE = (
    "github/rest-api-description descriptions/api.github.com/api.github.com.json, via npm "
    "@octokit/openapi 23.0.2 (x-octokit removed); trimmed by tests/doubles/github_openapi_trim.py"
)


def _is_example_map(value: Any) -> bool:
    """A media type's or parameter's `examples` (named Example objects), not a property so named."""
    return isinstance(value, dict) and all(
        isinstance(v, dict) and ("$ref" in v or "value" in v or "summary" in v) for v in value.values()
    )


def _clean(node: Any) -> Any:
    """A copy without `x-octokit` and without example maps."""
    if isinstance(node, dict):
        return {
            key: _clean(value)
            for key, value in node.items()
            if key != "x-octokit" and not (key == "examples" and _is_example_map(value))
        }
    if isinstance(node, list):
        return [_clean(value) for value in node]
    return node


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.add(ref)
        for value in node.values():
            found |= _refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _refs(value)
    return found


def _allow_null_in_nullable_enums(node: Any, pointer: str, fixed: list[str]) -> None:
    if isinstance(node, dict):
        enum = node.get("enum")
        if node.get("nullable") is True and isinstance(enum, list) and None not in enum:
            enum.append(None)
            fixed.append(pointer)
        for key, value in node.items():
            _allow_null_in_nullable_enums(value, f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}", fixed)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _allow_null_in_nullable_enums(value, f"{pointer}/{index}", fixed)


def trim(full: dict[str, Any]) -> dict[str, Any]:
    """The trimmed description: OPERATIONS and the components they reach."""
    paths: dict[str, Any] = {}
    for path, methods in OPERATIONS.items():
        item = full["paths"][path]
        kept = {key: value for key, value in item.items() if key not in {"get", "post", "patch", "put", "delete"}}
        for method in methods:
            kept[method] = item[method]
        paths[path] = _clean(kept)
    components: dict[str, dict[str, Any]] = {}
    pending = sorted(_refs(paths))
    seen: set[str] = set()
    while pending:
        ref = pending.pop()
        if ref in seen:
            continue
        seen.add(ref)
        prefix, section, name = ref.rsplit("/", 2)
        if prefix != "#/components":
            raise ValueError(f"unexpected reference {ref}")
        node = _clean(full["components"][section][name])
        components.setdefault(section, {})[name] = node
        pending.extend(sorted(_refs(node) - seen))
    tags = sorted({tag for item in paths.values() for op in item.values() if isinstance(op, dict)
                   for tag in op.get("tags", [])})
    fixed: list[str] = []
    _allow_null_in_nullable_enums(paths, "#/paths", fixed)
    _allow_null_in_nullable_enums(components, "#/components", fixed)
    info = dict(full["info"])
    info["description"] = "GitHub's REST API description, trimmed to the operations triage uses."
    info["x-trimmed-from"] = SOURCE
    info["x-standin-fixes"] = [f"null added to the nullable enum at {pointer}" for pointer in sorted(fixed)]
    return {
        "openapi": full["openapi"],
        "info": info,
        "servers": full.get("servers", [{"url": "https://api.github.com"}]),
        "tags": [tag for tag in full.get("tags", []) if tag.get("name") in tags],
        "paths": paths,
        "components": components,
    }


def dump(spec: dict[str, Any]) -> str:
    """Deterministic text: sorted keys, indent 1, a final newline."""
    return json.dumps(spec, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("full", type=Path, help="the full api.github.com.json")
    parser.add_argument("out", type=Path, nargs="?", default=Path(__file__).with_name("github_openapi.json"))
    args = parser.parse_args(argv)
    full = json.loads(args.full.read_text(encoding="utf-8"))
    text = dump(trim(full))
    args.out.write_text(text, encoding="utf-8")
    print(f"{args.out}: {len(text.encode())} bytes")


if __name__ == "__main__":
    main()
