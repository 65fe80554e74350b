"""The machinery of bench/faults.py: relay processes (started, killed with SIGKILL, restarted on
the same files and port), a Langfuse stand-in that misbehaves on a share of its requests, and a
small filesystem that can be filled up and freed.

Everything this module starts or mounts is registered and undone at exit (`cleanup`, also run by
`atexit`): processes are killed by their own id, filesystems unmounted (lazily if busy).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.doubles.langfuse_server import LangfuseStandIn  # noqa: E402

#: what this process started or mounted and has not undone yet
_PROCESSES: dict[int, subprocess.Popen[bytes]] = {}
_MOUNTS: list[SmallFilesystem] = []
_LOCK = threading.Lock()


def cleanup() -> None:
    """Kill every relay this process started (by pid) and unmount every filesystem it mounted."""
    with _LOCK:
        processes = list(_PROCESSES.values())
        _PROCESSES.clear()
        mounts = list(_MOUNTS)
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(OSError):
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
    for fs in mounts:
        fs.unmount()


atexit.register(cleanup)


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without triage's and Langfuse's settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIAGE_", "LANGFUSE_"))}
    env.update(extra)
    return env


# --------------------------------------------------------------------------- the relay


class RelayStartError(Exception):
    """The relay did not answer /healthz in time (or exited)."""


class RelayProcess:
    """`python -m triage relay` as its own process, on a fixed port, files and log (appended to, so
    a restart's log follows the killed one's). `src` is the source tree it runs from (its working
    directory, first on `sys.path`): this repository, or an export of another commit.

    (bench/relay.py's `start_relay` starts it the same way, but writes its own config, truncates
    the log and has no working directory or outbox path: a restart on the same files needs these.)
    """

    def __init__(self, *, workdir: Path, env: dict[str, str], port: int, outbox: Path, src: Path) -> None:
        self.workdir = workdir
        self.env = env
        self.port = port
        self.outbox = outbox
        self.src = src
        self.config = workdir / "relay.toml"
        self.log = workdir / "relay.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.config.write_text(
            "[relay]\nrate_per_second = 1000000.0\nrate_burst = 1000000\nbatch_wait_seconds = 0.25\n",
            encoding="utf-8",
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> float:
        """Start and wait for /healthz; the seconds it took."""
        started = time.monotonic()
        with self.log.open("ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "triage",
                    "relay",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--config",
                    str(self.config),
                    "--outbox",
                    str(self.outbox),
                    "--log-format",
                    "json",
                ],
                env=self.env,
                cwd=self.src,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C reaches this process, which then stops the relay
            )
        with _LOCK:
            _PROCESSES[process.pid] = process
        self.process = process
        self.starts += 1
        deadline = started + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                raise RelayStartError(f"the relay exited with {process.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill9()
                raise RelayStartError(f"the relay did not answer /healthz within {timeout:.0f} s")
            time.sleep(0.05)

    def kill9(self) -> None:
        """SIGKILL, and reap it."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        with _LOCK:
            _PROCESSES.pop(process.pid, None)

    def stop(self, grace: float) -> tuple[float, bool, int | None]:
        """SIGTERM, then SIGKILL after `grace` seconds: (seconds, whether it had to be killed, exit
        code)."""
        process = self.process
        if process is None:
            return 0.0, False, None
        started = time.monotonic()
        killed = False
        if process.poll() is None:
            with contextlib.suppress(OSError):
                process.terminate()
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                killed = True
                self.kill9()
        with _LOCK:
            _PROCESSES.pop(process.pid, None)
        return time.monotonic() - started, killed, process.returncode

    def get(self, path: str, timeout: float = 5.0) -> httpx.Response | None:
        try:
            return httpx.get(f"{self.url}{path}", timeout=timeout)
        except httpx.HTTPError:
            return None

    def log_tail(self, chars: int = 600) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def log_problems(self) -> Counter[str]:
        """The relay's warnings and errors (JSON log lines), by level and the message's start."""
        out: Counter[str] = Counter()
        try:
            lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return out
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                if line.strip() and not line.startswith((" ", "\t")):
                    out[f"(stderr) {line.strip()[:140]}"] += 1
                continue
            if isinstance(record, dict) and record.get("level") in ("warning", "error", "critical"):
                message = str(record.get("message", ""))
                error = str(record.get("error", "")).strip().splitlines()
                if error:  # an exception: its last line says what it was, the last frame where
                    frames = [ln.strip() for ln in error if ln.strip().startswith("File ")]
                    where = ""
                    if frames:
                        file, _, rest = frames[-1].partition(", line ")
                        where = f" at {Path(file[6:-1]).name}:{rest.replace(', in ', ' ')}"
                    message += f" [{error[-1][:120]}{where}]"
                out[f"{record['level']}: {_squash(message)[:200]}"] += 1
        return out


def _squash(text: str) -> str:
    """A log message without what varies from line to line (numbers, score ids), so lines count as one."""
    return _NUMBER.sub("N", _UUID.sub("<id>", text))


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NUMBER = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?(?![\w-])")


def relay_metrics(text: str) -> dict[str, float]:
    """Prometheus text to {series: value} (the relay's /metrics)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value)
    return out


# --------------------------------------------------------------------------- Langfuse


class FaultyStandIn(LangfuseStandIn):
    """The Langfuse stand-in (its row semantics: same id and timestamp overwrite, same id and another
    timestamp is a second physical row), answering a share of its requests badly:

    - `500`: status 500 instead of doing anything;
    - `429`: status 429 with `Retry-After: 1` instead of doing anything;
    - `slow`: does the work after waiting 2-5 s;
    - `drop`: does the work, then closes the connection without an answer.
    """

    MODES = ("500", "429", "slow", "drop")

    def __init__(self, seed: int = 7) -> None:
        super().__init__(record_bodies=False)
        self.mode: str | None = None
        self.share = 0.0
        self.injected: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()

    def misbehave(self, mode: str | None, share: float = 0.0) -> None:
        if mode is not None and mode not in self.MODES:
            raise ValueError(mode)
        self.mode, self.share = mode, share

    def _hit(self) -> tuple[bool, float]:
        with self._rng_lock:
            return self._rng.random() < self.share, self._rng.uniform(2.0, 5.0)

    def handle(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes] | None:
        mode = self.mode
        if mode is None:
            return super().handle(method, target, headers, body)
        hit, delay = self._hit()
        if not hit:
            return super().handle(method, target, headers, body)
        self.injected[mode] += 1
        if mode == "500":
            return 500, {}, b'{"message": "Internal Server Error (injected)"}'
        if mode == "429":
            return 429, {"Retry-After": "1"}, b'{"message": "Rate limit exceeded (injected)"}'
        if mode == "slow":
            time.sleep(delay)
            return super().handle(method, target, headers, body)
        super().handle(method, target, headers, body)  # drop: the work is done, the answer lost
        return None

    def status_counts(self) -> Counter[str]:
        """The stand-in's answers to the relay by method, path kind and status (0: dropped)."""
        out: Counter[str] = Counter()
        with self._lock:
            log = list(self.log)
        for r in log:
            kind = "scores" if r.path.startswith("/api/public/scores") else r.path.rsplit("/", 1)[-1]
            out[f"{r.method} {kind} {r.status}"] += 1
        return out


# --------------------------------------------------------------------------- a small filesystem


class SmallFilesystem:
    """A small filesystem of its own at `path`: tmpfs when mounting is allowed, else a loop-mounted
    ext4 image. `fill()` takes every free byte (a filler file), `free()` gives it back."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path = path
        self.size_mb = size_mb
        self.method: str | None = None
        self.image: Path | None = None
        self.filler = path / ".filler"
        self.filled_bytes = 0

    def mount(self) -> str | None:
        """Mount it; None when mounted, else why no way worked."""
        self.path.mkdir(parents=True, exist_ok=True)
        reasons = []
        done = _run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755", "tmpfs", str(self.path)]
        )
        if done is None:
            self.method = f"tmpfs {self.size_mb} MiB"
        else:
            reasons.append(f"tmpfs: {done}")
            image = self.path.parent / f"{self.path.name}.ext4"
            steps = [
                ["truncate", "-s", f"{self.size_mb}M", str(image)],
                ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
                ["mount", "-o", "loop", str(image), str(self.path)],
            ]
            for step in steps:
                done = _run(step)
                if done is not None:
                    reasons.append(f"loop ext4 ({step[0]}): {done}")
                    image.unlink(missing_ok=True)
                    return "; ".join(reasons)
            self.image = image
            self.method = f"loop-mounted ext4 {self.size_mb} MiB"
        with _LOCK:
            _MOUNTS.append(self)
        # the probe: a file written, synced and removed
        try:
            probe = self.path / ".probe"
            probe.write_bytes(b"x" * 4096)
            probe.unlink()
        except OSError as ex:
            self.unmount()
            return f"mounted with {self.method}, but not writable: {ex}"
        return None

    def fill(self) -> int:
        """Take every free byte with a filler file (fallocate in halving steps, then writes until the
        filesystem says ENOSPC): the bytes it took."""
        taken = 0
        try:
            with self.filler.open("ab", buffering=0) as handle:
                size = max(self.free_bytes(), 0)
                while size >= 1 << 16:
                    try:
                        os.posix_fallocate(handle.fileno(), taken, size)
                        taken += size
                    except OSError as ex:
                        if ex.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                            break  # no fallocate here: the writes below do it all
                        size //= 2
                handle.seek(0, os.SEEK_END)
                for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9):
                    block = b"\0" * chunk
                    while True:
                        try:
                            count = handle.write(block)
                        except OSError as ex:
                            if ex.errno not in (errno.ENOSPC, errno.EDQUOT):
                                raise
                            break
                        if not count:
                            break
                        taken += count
                with contextlib.suppress(OSError):
                    os.fsync(handle.fileno())
        except OSError:
            pass  # anything else: what was taken stays taken
        self.filled_bytes += taken
        return taken

    def free_bytes(self) -> int:
        try:
            stat = os.statvfs(self.path)
        except OSError:
            return -1
        return stat.f_bavail * stat.f_frsize

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        with _LOCK:
            if self not in _MOUNTS:
                return
            _MOUNTS.remove(self)
        if _run(["umount", str(self.path)]) is not None:
            time.sleep(0.5)
            if _run(["umount", str(self.path)]) is not None:
                _run(["umount", "-l", str(self.path)])
        if self.image is not None:
            self.image.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _run(command: list[str]) -> str | None:
    """Run a short system command; None when it succeeded, else what it said."""
    if shutil.which(command[0]) is None:
        return f"{command[0]} is not installed"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as ex:
        return str(ex)
    if done.returncode != 0:
        return (done.stderr or done.stdout).strip()[:200] or f"exit {done.returncode}"
    return None


def git_head(path: Path) -> str:
    """`git rev-parse --short HEAD` of the tree at `path`, "+ uncommitted changes" when its `triage/`
    differs from it (or "?")."""
    try:
        head = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--", "triage"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (head or "?") + (" + uncommitted changes to triage/" if dirty else "")


__all__ = [
    "FaultyStandIn",
    "RelayProcess",
    "RelayStartError",
    "SmallFilesystem",
    "clean_env",
    "cleanup",
    "git_head",
    "relay_metrics",
]
