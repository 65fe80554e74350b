"""The release watch's memory against the votes in its window (issue #36, item 7).

    python bench/release_memory.py                      # 200,000 votes over 5 releases
    python bench/release_memory.py --votes 50000 --releases 3 --keep /tmp/store.sqlite

Builds an embedded store in a temporary folder: `--releases` releases of the agent over the last
six days, one answer (a trace with one root observation) per vote plus `--unvoted` answers in
every four without one, `--down` of the votes thumbs-down and each of those triaged by the job (its
stored layer and signature scores). Written with SQLite's `executemany` in the store's own schema
(`Store`), so building is quick and is not what is measured.

Then `triage releases --format json` runs on it in a child process; its peak resident set size
(`os.wait4`'s rusage of that child alone: the store is built in another
process before) and its wall time are printed, with the release count and the figures it found, as
a check that the run counted every vote. The nightly CronJob's limit is 512 MiB; the target is
under 200 MB at 200,000 votes, memory growing with the releases, not the votes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYERS = ("retrieval", "generation", "tool_routing", "ok")


def build(path: Path, votes: int, releases: int, down: float, unvoted: float, seed: int) -> None:
    """The store: `votes` voted answers spread over `releases` releases in the last six days."""
    import random

    from triage.domain.kernel import iso_ms
    from triage.domain.scores import score_id
    from triage.sources.store import Store

    rng = random.Random(seed)
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(days=6)
    answers = int(votes * (1 + unvoted))
    step = timedelta(days=6) / answers
    per_release = answers // releases + 1
    with Store(path) as store:
        db = store._db  # the bench writes rows directly: building is not what is measured
        obs: list[tuple[object, ...]] = []
        scores: list[tuple[object, ...]] = []
        voted = 0
        for i in range(answers):
            trace = f"t{i:07d}"
            at = start + step * i
            release = f"2026.{i // per_release + 1}"
            obs.append((f"{trace}-root", trace, "AGENT", "docs-agent", iso_ms(at), release, f"v{release}"))
            if voted < votes and rng.random() < 1 / (1 + unvoted):
                voted += 1
                value = 0.0 if rng.random() < down else 1.0
                stamp = iso_ms(at + timedelta(minutes=1))
                scores.append((f"vote-{trace}", "user_feedback", value, None, "BOOLEAN", trace, None, "{}", stamp))
                if value == 0.0:
                    layer = rng.choice(LAYERS)
                    meta = json.dumps({"rule_version": "1", "judge": "heuristic", "owners": ["team"]})
                    scores.append((score_id(trace, "triage_layer", "1"), "triage_layer", None, layer,
                                   "CATEGORICAL", trace, None, meta, iso_ms(at)))  # fmt: skip
                    scores.append((score_id(trace, "triage_signature", "1"), "triage_signature", None,
                                   f"sig-{layer}-{rng.randrange(20)}", "CATEGORICAL", trace, None,
                                   json.dumps({"rule_version": "1", "layer": layer}), iso_ms(at)))  # fmt: skip
            if len(obs) >= 20_000 or i == answers - 1:
                with db:
                    db.executemany(
                        "INSERT INTO observations (id, traceId, type, name, startTime, release, version) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        obs,
                    )
                    db.executemany(
                        "INSERT INTO scores (id, name, value, stringValue, dataType, traceId, sessionId, metadata, "
                        "timestamp, source, environment, createdAt, updatedAt) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'API', 'production', ?, ?)",
                        [(*s, s[-1], s[-1]) for s in scores],
                    )
                obs, scores = [], []
    print(f"store: {answers:,} answers, {voted:,} votes, {releases} releases", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--votes", type=int, default=200_000)
    parser.add_argument("--releases", type=int, default=5)
    parser.add_argument("--down", type=float, default=0.2, help="share of the votes that are thumbs-down")
    parser.add_argument("--unvoted", type=float, default=0.25, help="answers without a vote, per voted one")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="build the store here (kept) instead of a temporary folder")
    parser.add_argument("--build-only", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--triage-cmd", default=f"{sys.executable} -m triage",
                        help="the command to measure (another checkout's, to compare)")  # fmt: skip
    args = parser.parse_args()
    if args.build_only:
        build(args.build_only, args.votes, args.releases, args.down, args.unvoted, args.seed)
        return
    with tempfile.TemporaryDirectory() as folder:
        path = args.keep or Path(folder) / "store.sqlite"
        if not path.exists():  # built in another process: the builder's memory is not measured
            subprocess.run(
                [sys.executable, __file__, "--build-only", str(path), "--votes", str(args.votes),
                 "--releases", str(args.releases), "--down", str(args.down), "--unvoted", str(args.unvoted),
                 "--seed", str(args.seed)],
                check=True,
            )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("LANGFUSE_")}
        env["TRIAGE_STORE"] = str(path)
        out, err = Path(folder) / "out.json", Path(folder) / "err.log"
        began = time.perf_counter()
        with out.open("w") as stdout, err.open("w") as stderr:
            child = subprocess.Popen([*args.triage_cmd.split(), "releases", "--format", "json"], env=env,
                                     stdout=stdout, stderr=stderr, cwd=ROOT)  # fmt: skip
            # this child's own rusage (not the largest child's so far, as RUSAGE_CHILDREN would be)
            _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - began
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, 7):
            sys.exit(f"triage releases failed ({code}):\n{err.read_text()[-2000:]}")
        data = json.loads(out.read_text())
        releases = data["watch"]["releases"]
        votes = sum(r["votes"] for r in releases)
        down = sum(r["thumbs_down"] for r in releases)
        triaged = sum(lr["rate"]["count"] for r in releases for lr in r["layers"])
        print(f"votes {args.votes:,}, releases {len(releases)}: counted {votes:,} voted answers, {down:,} thumbs-down, "
              f"{triaged:,} triaged; flagged: {', '.join(data['watch']['flagged']) or 'none'}")  # fmt: skip
        print(f"triage releases: peak RSS {usage.ru_maxrss / 1024:.0f} MB, wall {wall:.1f} s")


if __name__ == "__main__":
    main()
