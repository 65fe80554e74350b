"""Semantic checks of the Kubernetes manifests: what schema validation misses.

kubernetes-validate checks field names and types; it accepts `concurrencyPolicy: Forbidden`, a
schedule of `0 27 * * *`, an unknown time zone, a podFailurePolicy with `restartPolicy: OnFailure`,
a Secret reference to an object that does not exist, and so on. These rules catch that, plus the
project's own requirements of the nightly run (command line, locked-down Pod, retention).

Used by tests/deploy/test_manifests.py; also runnable: `python tests/k8s_check.py cronjob.yaml cronjob-indexed.yaml`
(the files are checked as one deployment: references resolve across them).
"""

from __future__ import annotations

import re
import sys
import tempfile
import zoneinfo
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import yaml

EXPECTED_COMMAND = ["triage"]
EXPECTED_ARGS = ["feedback", "--since-hours", "24", "--write", "--report"]
MIN_TTL_SECONDS = 345600  # 4 days: longer than the 3 Jobs the history limits keep, so none vanish unread
MIN_STARTING_DEADLINE = 10  # the CronJob controller checks every 10 s; less and a run may never start
RUN_AS_USER = 10001
EXIT_USAGE, EXIT_CONFIG, EXIT_DEGRADED, EXIT_UNCONFIRMED = 2, 3, 4, 5
DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
CRON_MACROS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
EXAMPLE_SECRET_LABEL = ("app.kubernetes.io/component", "example-secret")
PLACEHOLDER_PREFIX = "REPLACE_ME"

Doc = dict[str, Any]


class Problem(NamedTuple):
    rule: str
    file: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.where}: [{self.rule}] {self.message}"


def load(path: Path) -> list[Doc]:
    """The non-empty documents of a multi-document YAML file."""
    with path.open(encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


# ---------------------------------------------------------------- cron syntax

_CRON_FIELDS = (  # name, low, high, names accepted for values
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    (
        "month",
        1,
        12,
        {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
    ),
    ("day of week", 0, 7, {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}),
)


def _cron_value(text: str, low: int, high: int, names: dict[str, int]) -> int:
    value = names[text.lower()] if text.lower() in names else int(text)
    if not low <= value <= high:
        raise ValueError(f"{value} is outside {low}-{high}")
    return value


def cron_field(text: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    """The values one cron field selects; ValueError when it is not valid."""
    selected: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"step {step} in {part!r}")
        if base in ("*", "?"):
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start, end = _cron_value(first, low, high, names), _cron_value(last, low, high, names)
            if start > end:
                raise ValueError(f"range {base!r} runs backwards")
        else:
            start = _cron_value(base, low, high, names)
            end = high if step_text else start
        selected.update(range(start, end + 1, step))
    return selected


def parse_schedule(schedule: str) -> list[set[int]]:
    """The value sets of a 5-field schedule; ValueError when it is not valid for a CronJob."""
    if "TZ=" in schedule:
        raise ValueError("CRON_TZ=/TZ= in the schedule is rejected since Kubernetes 1.29: use timeZone")
    fields = schedule.split()
    if len(fields) != 5:
        raise ValueError(f"{len(fields)} fields, a CronJob schedule has 5")
    sets = []
    for text, (name, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        try:
            sets.append(cron_field(text, low, high, names))
        except ValueError as ex:
            raise ValueError(f"{name} field {text!r}: {ex}") from ex
    return sets


# ---------------------------------------------------------------- helpers


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _key(doc: Doc) -> tuple[str, str, str]:
    meta = doc.get("metadata") or {}
    return doc.get("kind", ""), meta.get("namespace", "default"), meta.get("name", "")


#: CronJobs beside the nightly one, each with what it runs: the nightly rules (03:00, its command,
#: its window, one name across the alternative manifests) are not theirs
SIDE_JOBS = {"triage-issues-sync": ["triage", "issues", "sync", "--apply"]}


def _workloads(files: dict[str, list[Doc]], *, nightly: bool = False) -> Iterator[tuple[str, Doc, Doc, str]]:
    """(file, CronJob or Job, its Job spec, name) for every CronJob and Job (`nightly`: the side
    jobs left out)."""
    for file, docs in files.items():
        for doc in docs:
            if nightly and _key(doc)[2] in SIDE_JOBS:
                continue
            if doc.get("kind") == "CronJob":
                yield file, doc, _get(doc, "spec", "jobTemplate", "spec") or {}, _key(doc)[2]
            elif doc.get("kind") == "Job":
                yield file, doc, doc.get("spec") or {}, _key(doc)[2]


def _containers(job_spec: Doc) -> list[Doc]:
    return list(_get(job_spec, "template", "spec", "containers") or [])


def _env(container: Doc) -> dict[str, Doc]:
    return {e.get("name"): e for e in container.get("env") or []}


# ---------------------------------------------------------------- rules

Rule = Callable[[dict[str, list[Doc]]], Iterator[tuple[str, str, str]]]  # -> (file, where, message)
RULES: dict[str, Rule] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return register


@rule("cron-schedule")
def _cron_schedule(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, doc, _, name in _workloads(files, nightly=True):
        if doc["kind"] != "CronJob":
            continue
        schedule = _get(doc, "spec", "schedule")
        if not isinstance(schedule, str):
            yield file, name, "spec.schedule is missing"
            continue
        if schedule.strip() in CRON_MACROS:
            yield file, name, f"schedule {schedule!r}: the nightly run is at 03:00, say so in 5 fields"
            continue
        try:
            minute, hour, *_ = parse_schedule(schedule)
        except ValueError as ex:
            yield file, name, f"schedule {schedule!r}: {ex}"
            continue
        if minute != {0} or hour != {3}:
            yield file, name, f"schedule {schedule!r} does not run once a day at 03:00"


@rule("time-zone")
def _time_zone(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    zones = zoneinfo.available_timezones()
    for file, doc, _, name in _workloads(files):
        if doc["kind"] != "CronJob":
            continue
        tz = _get(doc, "spec", "timeZone")
        if tz is None:
            yield file, name, "spec.timeZone is unset: the controller manager's local zone would apply"
        elif tz not in zones:
            yield file, name, f"spec.timeZone {tz!r} is not an IANA time zone name"


@rule("concurrency-policy")
def _concurrency(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, doc, _, name in _workloads(files):
        if doc["kind"] != "CronJob":
            continue
        policy = _get(doc, "spec", "concurrencyPolicy")
        if policy not in ("Allow", "Forbid", "Replace"):
            yield file, name, f"concurrencyPolicy {policy!r} is not one of Allow, Forbid, Replace"
        elif policy != "Forbid":
            yield file, name, f"concurrencyPolicy {policy!r}: two runs must never overlap (Forbid)"


@rule("starting-deadline")
def _starting_deadline(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, doc, _, name in _workloads(files):
        if doc["kind"] != "CronJob":
            continue
        deadline = _get(doc, "spec", "startingDeadlineSeconds")
        if not isinstance(deadline, int) or deadline < MIN_STARTING_DEADLINE:
            yield file, name, f"startingDeadlineSeconds {deadline!r} must be set and >= 10"


@rule("history-limits")
def _history(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, doc, _, name in _workloads(files):
        if doc["kind"] != "CronJob":
            continue
        for field in ("successfulJobsHistoryLimit", "failedJobsHistoryLimit"):
            value = _get(doc, "spec", field)
            if not isinstance(value, int) or value < 1:
                yield file, name, f"{field} {value!r} must be set and >= 1 (failed runs' logs are kept)"


@rule("job-limits")
def _job_limits(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, _, spec, name in _workloads(files):
        if not isinstance(spec.get("activeDeadlineSeconds"), int):
            yield file, name, "the Job needs activeDeadlineSeconds"
        per_index = spec.get("backoffLimitPerIndex") is not None
        if not per_index and not isinstance(spec.get("backoffLimit"), int):
            yield file, name, "the Job needs backoffLimit (the default, 6, retries too long)"
        if per_index and spec.get("backoffLimit") is not None:
            yield file, name, "backoffLimit with backoffLimitPerIndex: a global limit cuts per-shard retries"
        grace = _get(spec, "template", "spec", "terminationGracePeriodSeconds")
        if not isinstance(grace, int):
            yield file, name, "terminationGracePeriodSeconds must be set (time to finish after SIGTERM)"


@rule("ttl")
def _ttl(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, _, spec, name in _workloads(files):
        ttl = spec.get("ttlSecondsAfterFinished")
        if ttl is not None and (not isinstance(ttl, int) or ttl < MIN_TTL_SECONDS):
            yield (
                file,
                name,
                f"ttlSecondsAfterFinished {ttl!r} < {MIN_TTL_SECONDS}: failed Jobs vanish unread",
            )
        if ttl is None:
            yield file, name, "ttlSecondsAfterFinished is unset"


@rule("pod-failure-policy")
def _pod_failure_policy(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, _, spec, name in _workloads(files):
        policy = spec.get("podFailurePolicy")
        if not policy:
            yield file, name, "the Job needs a podFailurePolicy"
            continue
        if _get(spec, "template", "spec", "restartPolicy") != "Never":
            yield file, name, "podFailurePolicy requires restartPolicy: Never"
        names = {c.get("name") for c in _containers(spec)}
        # what the first matching rule does with each exit code we care about (rules apply in order)
        action_for: dict[int, str] = {}
        ignores_disruption = False
        for i, r in enumerate(policy.get("rules") or []):
            on_exit = r.get("onExitCodes")
            if on_exit:
                values = on_exit.get("values") or []
                if values != sorted(set(values)):
                    yield file, name, f"rule {i}: onExitCodes values must be sorted and unique"
                if on_exit.get("operator") == "In" and 0 in values:
                    yield file, name, f"rule {i}: exit code 0 cannot be used with In"
                if on_exit.get("containerName") not in (None, *names):
                    yield file, name, f"rule {i}: containerName {on_exit.get('containerName')!r} is unknown"
                for code in range(1, 256):
                    if code in action_for:
                        continue
                    hit = code in values if on_exit.get("operator") == "In" else code not in values
                    if hit:
                        action_for[code] = r.get("action")
            for cond in r.get("onPodConditions") or []:
                if cond.get("type") == "DisruptionTarget" and r.get("action") == "Ignore":
                    ignores_disruption = True
        for code in (EXIT_USAGE, EXIT_CONFIG):
            if action_for.get(code) != "FailJob":
                yield file, name, f"exit code {code} must FailJob at once (a retry fails the same way)"
        for code in (EXIT_DEGRADED, EXIT_UNCONFIRMED):
            if action_for.get(code, "Count") != "Count":
                yield file, name, f"exit code {code} must be retried (Count): a rerun finishes the rest"
        if not ignores_disruption:
            yield file, name, "evictions (DisruptionTarget) must be ignored, not use up retries"


@rule("indexed")
def _indexed(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, _, spec, name in _workloads(files):
        indexed = spec.get("completionMode") == "Indexed"
        actions = {r.get("action") for r in _get(spec, "podFailurePolicy", "rules") or []}
        if "FailIndex" in actions and not indexed:
            yield file, name, "FailIndex needs completionMode: Indexed"
        if "FailIndex" in actions and spec.get("backoffLimitPerIndex") is None:
            yield file, name, "FailIndex needs backoffLimitPerIndex"
        if spec.get("backoffLimitPerIndex") is not None and not indexed:
            yield file, name, "backoffLimitPerIndex needs completionMode: Indexed"
        if spec.get("maxFailedIndexes") is not None:
            if spec.get("backoffLimitPerIndex") is None:
                yield file, name, "maxFailedIndexes needs backoffLimitPerIndex"
            if not isinstance(spec.get("completions"), int) or spec["maxFailedIndexes"] > spec["completions"]:
                yield file, name, "maxFailedIndexes must be <= completions"
        for container in _containers(spec):
            count = _get(_env(container).get("TRIAGE_SHARD_COUNT"), "value")
            if indexed and count is None:
                yield file, name, "an Indexed Job must set TRIAGE_SHARD_COUNT (= completions)"
            elif count is not None and (not indexed or str(spec.get("completions")) != str(count)):
                yield file, name, f"TRIAGE_SHARD_COUNT {count!r} != completions {spec.get('completions')!r}"
        if indexed and (spec.get("parallelism") or 1) > (spec.get("completions") or 0):
            yield file, name, "parallelism > completions"


@rule("image-digest")
def _image(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, _, spec, name in _workloads(files):
        for c in _containers(spec):
            if not DIGEST.match(str(c.get("image", ""))):
                yield file, name, f"image {c.get('image')!r} is not pinned by a sha256 digest"


@rule("command")
def _command(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, _, spec, name in _workloads(files, nightly=True):
        for c in _containers(spec):
            if c.get("command") != EXPECTED_COMMAND or c.get("args") != EXPECTED_ARGS:
                got = [*(c.get("command") or []), *(c.get("args") or [])]
                yield file, name, f"runs {got}, expected {EXPECTED_COMMAND + EXPECTED_ARGS}"


@rule("side-jobs")
def _side_jobs(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    """A side job runs what it is for, and starts suspended: an operator turns it on."""
    for file, doc, spec, name in _workloads(files):
        if name not in SIDE_JOBS:
            continue
        if _get(doc, "spec", "suspend") is not True:
            yield file, name, "a side job must ship suspended (spec.suspend: true)"
        for c in _containers(spec):
            got = [*(c.get("command") or []), *(c.get("args") or [])]
            if got != SIDE_JOBS[name]:
                yield file, name, f"runs {got}, expected {SIDE_JOBS[name]}"


@rule("references")
def _references(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    defined: dict[tuple[str, str, str], set[str]] = {}
    for docs in files.values():
        for doc in docs:
            if doc.get("kind") in ("ConfigMap", "Secret"):
                keys = {*(doc.get("data") or {}), *(doc.get("stringData") or {})}
                defined[_key(doc)] = keys
    for file, doc, spec, name in _workloads(files):
        ns = _key(doc)[1]

        def missing(kind: str, ref: Doc | None, key: str | None = None, ns: str = ns) -> str | None:
            if not ref:
                return None
            keys = defined.get((kind, ns, ref.get("name", "")))
            if keys is None:
                return f"{kind} {ref.get('name')!r} is not defined in namespace {ns!r}"
            if key is not None and key not in keys and not ref.get("optional"):
                return f"{kind} {ref.get('name')!r} has no key {key!r}"
            return None

        found: list[str | None] = []
        for c in _containers(spec):
            for src in c.get("envFrom") or []:
                found += [
                    missing("ConfigMap", src.get("configMapRef")),
                    missing("Secret", src.get("secretRef")),
                ]
            for env in c.get("env") or []:
                ref = _get(env, "valueFrom", "secretKeyRef")
                found.append(missing("Secret", ref, ref and ref.get("key")))
                ref = _get(env, "valueFrom", "configMapKeyRef")
                found.append(missing("ConfigMap", ref, ref and ref.get("key")))
        for vol in _get(spec, "template", "spec", "volumes") or []:
            found.append(missing("ConfigMap", vol.get("configMap")))
            secret = vol.get("secret")
            found.append(missing("Secret", secret and {"name": secret.get("secretName")}))
        for message in found:
            if message:
                yield file, name, message


@rule("example-secret")
def _example_secret(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    label, value = EXAMPLE_SECRET_LABEL
    for file, docs in files.items():
        for doc in docs:
            if doc.get("kind") != "Secret":
                continue
            where = _key(doc)[2]
            if _get(doc, "metadata", "labels", label) != value:
                yield file, where, f"the example Secret must carry {label}={value} (for the apply selector)"
            if doc.get("data"):
                yield file, where, "the example Secret must use stringData placeholders, not data"
            for key, text in (doc.get("stringData") or {}).items():
                if not str(text).startswith(PLACEHOLDER_PREFIX):
                    yield file, where, f"stringData {key!r} is not a {PLACEHOLDER_PREFIX} placeholder"


@rule("security-context")
def _security(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    for file, _, spec, name in _workloads(files):
        pod = _get(spec, "template", "spec") or {}
        psc = pod.get("securityContext") or {}
        if pod.get("automountServiceAccountToken") is not False:
            yield file, name, "automountServiceAccountToken must be false (the job needs no API access)"
        if psc.get("runAsNonRoot") is not True or psc.get("runAsUser") != RUN_AS_USER:
            yield file, name, f"the Pod must set runAsNonRoot: true and runAsUser: {RUN_AS_USER}"
        emptydirs = {v.get("name") for v in pod.get("volumes") or [] if "emptyDir" in v}
        for c in _containers(spec):
            csc = c.get("securityContext") or {}
            seccomp = _get(csc, "seccompProfile", "type") or _get(psc, "seccompProfile", "type")
            if seccomp != "RuntimeDefault":
                yield file, name, f"seccompProfile {seccomp!r}, expected RuntimeDefault"
            if csc.get("allowPrivilegeEscalation") is not False:
                yield file, name, "allowPrivilegeEscalation must be false"
            if csc.get("readOnlyRootFilesystem") is not True:
                yield file, name, "readOnlyRootFilesystem must be true"
            if csc.get("privileged"):
                yield file, name, "privileged container"
            if _get(csc, "capabilities", "drop") != ["ALL"] or _get(csc, "capabilities", "add"):
                yield file, name, "capabilities must drop ALL and add none"
            if csc.get("runAsUser", RUN_AS_USER) == 0 or csc.get("runAsNonRoot", True) is False:
                yield file, name, "the container overrides the Pod's non-root user"
            tmpdir = _get(_env(c).get("TMPDIR"), "value")
            mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts") or []}
            if tmpdir is None or mounts.get(tmpdir) not in emptydirs:
                yield file, name, f"TMPDIR {tmpdir!r} must be an emptyDir mount (read-only root filesystem)"
            for kind in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    if _get(c, "resources", kind, resource) is None:
                        yield file, name, f"resources.{kind}.{resource} is unset"


@rule("window-coverage")
def _window(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    """A run that starts as late as startingDeadlineSeconds must still overlap the previous window."""
    from triage.settings import load_config  # the project's own loader: the real merge over the defaults

    maps = {_key(d)[1:]: d for docs in files.values() for d in docs if d.get("kind") == "ConfigMap"}
    for file, doc, spec, name in _workloads(files, nightly=True):
        ns = _key(doc)[1]
        pod = _get(spec, "template", "spec") or {}
        for c in _containers(spec):
            env = {k: _get(v, "value") for k, v in _env(c).items()}
            for src in c.get("envFrom") or []:
                cm = maps.get((ns, _get(src, "configMapRef", "name")))
                env.update((cm or {}).get("data") or {})
            path = env.get("TRIAGE_CONFIG")
            text = None
            if path:
                mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts") or []}
                volume = mounts.get(str(Path(path).parent))
                vols = {v.get("name"): v for v in pod.get("volumes") or []}
                cm = maps.get((ns, _get(vols.get(volume), "configMap", "name")))
                text = ((cm or {}).get("data") or {}).get(Path(path).name)
                if text is None:
                    yield file, name, f"TRIAGE_CONFIG {path!r} is not a file mounted from a ConfigMap here"
                    continue
            with tempfile.TemporaryDirectory() as tmp:
                config_path = None
                if text is not None:
                    config_path = Path(tmp) / "triage.toml"
                    config_path.write_text(text, encoding="utf-8")
                try:
                    window = load_config(config_path).window
                except Exception as ex:  # the ConfigMap's TOML must load as the CLI would load it
                    yield file, name, f"the mounted config does not load: {ex}"
                    continue
            late = int(_get(doc, "spec", "startingDeadlineSeconds") or 0)
            if window.overlap_minutes * 60 < late + window.lag_minutes * 60:
                yield (
                    file,
                    name,
                    f"window overlap {window.overlap_minutes} min < start delay {late // 60} min + lag "
                    f"{window.lag_minutes} min: a late run leaves votes unread",
                )


@rule("one-cronjob")
def _one_cronjob(files: dict[str, list[Doc]]) -> Iterator[tuple[str, str, str]]:
    """The manifests are alternatives: one CronJob name, so applying one replaces the other."""
    keys = {(file, _key(doc)[1:]) for file, doc, _, _ in _workloads(files, nightly=True) if doc["kind"] == "CronJob"}
    names = {k for _, k in keys}
    if len(names) > 1:
        for file, k in sorted(keys):
            yield file, "/".join(k), f"CronJobs differ in namespace/name: {sorted(names)}"


def check(files: dict[str, list[Doc]], only: str | None = None) -> list[Problem]:
    """Every problem the rules find in the files (checked together as one deployment)."""
    problems = []
    for name, fn in RULES.items():
        if only is None or name == only:
            problems += [Problem(name, *p) for p in fn(files)]
    return problems


def main(argv: list[str]) -> int:
    files = {arg: load(Path(arg)) for arg in argv}
    problems = check(files)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
