"""How well the offline judge tells a declining answer, on the decline probes (evals/declines).

    python bench/declines.py                      # every probe file, by split and by language
    python bench/declines.py --misses             # ... and the answers it gets wrong

Each line of a probe is an agent's answer labelled `declined` by a person who did not read the
patterns (evals/declines/README.md says how each file was used). No model, no network; a second.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from triage.judges.offline.declines import decline_phrases  # noqa: E402

PROBES = ROOT / "evals" / "declines"


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help="probe files (default: every evals/declines/*.jsonl)")
    parser.add_argument("--misses", action="store_true", help="print the answers it gets wrong")
    args = parser.parse_args(list(argv) if argv is not None else None)
    files = args.files or sorted(PROBES.glob("*.jsonl"))
    print("| probe | split | answers | right | missed declines | false declines |")
    print("|---|---|---:|---:|---:|---:|")
    misses = []
    by_lang: dict[str, list[bool]] = defaultdict(list)
    for path in files:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        for split in sorted({r["split"] for r in rows}):
            part = [r for r in rows if r["split"] == split]
            found = [bool(decline_phrases(r["answer"])) for r in part]
            right = sum(f == r["declined"] for f, r in zip(found, part, strict=True))
            missed = sum(r["declined"] and not f for f, r in zip(found, part, strict=True))
            false = sum(f and not r["declined"] for f, r in zip(found, part, strict=True))
            print(f"| {path.name} | {split} | {len(part)} | {right / len(part):.2f} | {missed} | {false} |")
            for f, r in zip(found, part, strict=True):
                by_lang["en" if r["lang"] == "en" else "other"].append(f == r["declined"])
                if f != r["declined"]:
                    misses.append((path.name, r))
    print()
    for lang, hits in sorted(by_lang.items()):
        print(f"{'English' if lang == 'en' else 'other languages'}: {sum(hits)}/{len(hits)} right")
    if args.misses:
        for name, r in misses:
            kind = "missed" if r["declined"] else "false"
            print(f"- {name} {r['id']} ({r['lang']}, {kind}): {r['answer'][:200]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
