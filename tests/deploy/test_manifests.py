"""The Kubernetes manifests and the image, validated offline.

- yamllint (.yamllint.yaml) and `kubernetes-validate --strict` on cronjob.yaml and cronjob-indexed.yaml,
  against the oldest Kubernetes version the manifests need and the newest the package bundles;
- the semantic rules of tests/k8s_check.py (what schema validation misses), each shown to fail on
  a deliberately broken copy;
- the Dockerfile's invariants, and the wheel build it relies on.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CRONJOB = ROOT / "cronjob.yaml"
INDEXED = ROOT / "cronjob-indexed.yaml"
MANIFESTS = [CRONJOB, INDEXED]
# 1.33: backoffLimitPerIndex (the Indexed variant) is GA there, podFailurePolicy since 1.31;
# 1.37: the newest schema kubernetes-validate 1.37 bundles, to catch fields that were removed since.
K8S_VERSIONS = ["1.33.0", "1.37.0"]


def _load_checker() -> ModuleType:
    # by path, so this works whether or not tests/ becomes a package
    spec = importlib.util.spec_from_file_location("k8s_check", Path(__file__).parents[1] / "k8s_check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["k8s_check"] = module
    spec.loader.exec_module(module)
    return module


k8s = _load_checker()


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in this Python ({sys.executable}); pip install '.[test]'")


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


# ------------------------------------------------------------------ yamllint


def _yamllint(*paths: Path) -> subprocess.CompletedProcess[str]:
    _need("yamllint")
    return _run("-m", "yamllint", "--strict", "-f", "parsable", "-c", ROOT / ".yamllint.yaml", *paths)


@pytest.mark.slow
def test_yamllint_passes_both_manifests() -> None:
    result = _yamllint(*MANIFESTS)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # a duplicate key: kubernetes-validate would silently keep the last one
        (
            '  timeZone: "Etc/UTC"\n',
            '  timeZone: "Etc/UTC"\n  timeZone: "Europe/Berlin"\n',
            "key-duplicates",
        ),
        ('  timeZone: "Etc/UTC"\n', '   timeZone: "Etc/UTC"\n', "syntax"),
        ("readOnlyRootFilesystem: true", "readOnlyRootFilesystem: yes", "truthy"),
    ],
)
def test_yamllint_rejects_a_broken_copy(tmp_path: Path, old: str, new: str, expected: str) -> None:
    text = CRONJOB.read_text(encoding="utf-8")
    assert old in text
    broken = tmp_path / "cronjob.yaml"
    broken.write_text(text.replace(old, new, 1), encoding="utf-8")
    result = _yamllint(broken)
    assert result.returncode != 0
    assert expected in result.stdout


# ------------------------------------------------------------------ kubernetes-validate


def _kubernetes_validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    _need("kubernetes_validate")
    versions = [arg for v in K8S_VERSIONS for arg in ("-k", v)]
    return _run("-m", "kubernetes_validate", "--strict", "--quiet", *versions, *paths)


def test_target_versions_are_bundled() -> None:
    """A version the package lacks would make kubernetes-validate fall back or fail, not validate."""
    _need("kubernetes_validate")
    from kubernetes_validate import utils

    bundled = set(utils.all_versions())
    assert set(K8S_VERSIONS) <= bundled, f"bundled: {sorted(bundled)}"


@pytest.mark.slow
def test_kubernetes_validate_strict_passes_both_manifests() -> None:
    result = _kubernetes_validate(*MANIFESTS)
    # WARN means a kind without a schema, i.e. not validated at all: that counts as a failure too
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("restartPolicy: Never", "restartPolicyy: Never", "ERROR"),  # a typo: unknown field
        ("backoffLimit: 2 ", 'backoffLimit: "2" ', "ERROR"),  # a wrong type
        ("kind: CronJob", "kind: CronJobs", "WARN"),  # a kind with no schema
    ],
)
def test_kubernetes_validate_rejects_a_broken_copy(tmp_path: Path, old: str, new: str, expected: str) -> None:
    text = CRONJOB.read_text(encoding="utf-8")
    assert old in text
    broken = tmp_path / "cronjob.yaml"
    broken.write_text(text.replace(old, new, 1), encoding="utf-8")
    result = _kubernetes_validate(broken)
    assert expected in result.stdout, result.stdout + result.stderr


# ------------------------------------------------------------------ semantic rules


def _docs() -> dict[str, list[dict[str, Any]]]:
    return {path.name: k8s.load(path) for path in MANIFESTS}


def test_semantic_rules_pass_on_the_deployment() -> None:
    problems = k8s.check(_docs())
    assert problems == [], "\n".join(map(str, problems))


def test_plain_cronjob_stands_alone() -> None:
    problems = k8s.check({CRONJOB.name: k8s.load(CRONJOB)})
    assert problems == [], "\n".join(map(str, problems))


def test_indexed_variant_needs_the_objects_of_cronjob_yaml() -> None:
    """It reuses the ConfigMaps and the Secret defined in cronjob.yaml, so alone its references dangle."""
    problems = k8s.check({INDEXED.name: k8s.load(INDEXED)}, only="references")
    missing = {p.message for p in problems}
    assert missing == {
        "ConfigMap 'triage-env' is not defined in namespace 'triage'",
        "ConfigMap 'triage-config' is not defined in namespace 'triage'",
        "Secret 'triage-secrets' is not defined in namespace 'triage'",
    }


def _cron(docs: dict[str, list[dict[str, Any]]], file: str = "cronjob.yaml") -> dict[str, Any]:
    return next(d for d in docs[file] if d["kind"] == "CronJob")


def _job(docs: dict[str, list[dict[str, Any]]], file: str = "cronjob.yaml") -> dict[str, Any]:
    return _cron(docs, file)["spec"]["jobTemplate"]["spec"]


def _pod(docs: dict[str, list[dict[str, Any]]], file: str = "cronjob.yaml") -> dict[str, Any]:
    return _job(docs, file)["template"]["spec"]


def _container(docs: dict[str, list[dict[str, Any]]], file: str = "cronjob.yaml") -> dict[str, Any]:
    return _pod(docs, file)["containers"][0]


def _env(docs: dict[str, list[dict[str, Any]]], name: str, file: str = "cronjob.yaml") -> dict[str, Any]:
    return next(e for e in _container(docs, file)["env"] if e["name"] == name)


def _doc(docs: dict[str, list[dict[str, Any]]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs["cronjob.yaml"] if d["kind"] == kind and d["metadata"]["name"] == name)


def _rules(docs: dict[str, list[dict[str, Any]]], file: str = "cronjob.yaml") -> list[dict[str, Any]]:
    return _job(docs, file)["podFailurePolicy"]["rules"]


IX = "cronjob-indexed.yaml"
Mutation = Callable[[dict[str, list[dict[str, Any]]]], None]

# (rule that must fire, what is broken, the change) - every rule of k8s_check appears at least once
BROKEN: list[tuple[str, str, Mutation]] = [
    ("cron-schedule", "hour 27", lambda d: _cron(d)["spec"].update(schedule="0 27 * * *")),
    ("cron-schedule", "6 fields", lambda d: _cron(d)["spec"].update(schedule="0 0 3 * * *")),
    ("cron-schedule", "CRON_TZ prefix", lambda d: _cron(d)["spec"].update(schedule="CRON_TZ=UTC 0 3 * * *")),
    ("cron-schedule", "day of week 8", lambda d: _cron(d)["spec"].update(schedule="0 3 * * 8")),
    ("cron-schedule", "backwards range", lambda d: _cron(d)["spec"].update(schedule="0 3 20-10 * *")),
    ("cron-schedule", "not at 03:00", lambda d: _cron(d)["spec"].update(schedule="*/5 3 * * *")),
    ("cron-schedule", "macro", lambda d: _cron(d)["spec"].update(schedule="@daily")),
    ("time-zone", "unknown zone", lambda d: _cron(d)["spec"].update(timeZone="Europe/Atlantis")),
    ("time-zone", "no zone", lambda d: _cron(d)["spec"].pop("timeZone")),
    ("concurrency-policy", "enum typo", lambda d: _cron(d)["spec"].update(concurrencyPolicy="Forbidden")),
    ("concurrency-policy", "overlapping runs", lambda d: _cron(d)["spec"].update(concurrencyPolicy="Allow")),
    ("starting-deadline", "below 10 s", lambda d: _cron(d)["spec"].update(startingDeadlineSeconds=5)),
    ("starting-deadline", "unset", lambda d: _cron(d)["spec"].pop("startingDeadlineSeconds")),
    ("history-limits", "no failed history", lambda d: _cron(d)["spec"].update(failedJobsHistoryLimit=0)),
    ("job-limits", "no backoffLimit", lambda d: _job(d).pop("backoffLimit")),
    ("job-limits", "no deadline", lambda d: _job(d).pop("activeDeadlineSeconds")),
    ("job-limits", "global limit on shards", lambda d: _job(d, IX).update(backoffLimit=2)),
    ("job-limits", "no grace period", lambda d: _pod(d).pop("terminationGracePeriodSeconds")),
    ("ttl", "TTL of one day", lambda d: _job(d).update(ttlSecondsAfterFinished=86400)),
    ("ttl", "TTL unset", lambda d: _job(d).pop("ttlSecondsAfterFinished")),
    ("pod-failure-policy", "OnFailure", lambda d: _pod(d).update(restartPolicy="OnFailure")),
    ("pod-failure-policy", "no policy", lambda d: _job(d).pop("podFailurePolicy")),
    ("pod-failure-policy", "3 retried", lambda d: _rules(d)[0]["onExitCodes"].update(values=[2])),
    ("pod-failure-policy", "4 fails the Job", lambda d: _rules(d)[0]["onExitCodes"].update(values=[2, 3, 4])),
    (
        "pod-failure-policy",
        "5 fails the index",
        lambda d: _rules(d, IX)[2]["onExitCodes"].update(values=[5, 137]),
    ),
    ("pod-failure-policy", "unsorted codes", lambda d: _rules(d)[0]["onExitCodes"].update(values=[3, 2])),
    ("pod-failure-policy", "In 0", lambda d: _rules(d)[2]["onExitCodes"].update(values=[0, 1, 4, 5])),
    (
        "pod-failure-policy",
        "wrong container",
        lambda d: _rules(d)[0]["onExitCodes"].update(containerName="app"),
    ),
    ("pod-failure-policy", "evictions counted", lambda d: _rules(d).pop(1)),
    ("indexed", "FailIndex not Indexed", lambda d: _job(d, IX).pop("completionMode")),
    ("indexed", "FailIndex without per-index limit", lambda d: _job(d, IX).pop("backoffLimitPerIndex")),
    ("indexed", "shard count != completions", lambda d: _env(d, "TRIAGE_SHARD_COUNT", IX).update(value="8")),
    ("indexed", "shard count missing", lambda d: _container(d, IX)["env"].pop(0)),
    (
        "indexed",
        "shard count on a plain Job",
        lambda d: _container(d)["env"].append({"name": "TRIAGE_SHARD_COUNT", "value": "4"}),
    ),
    ("indexed", "maxFailedIndexes > completions", lambda d: _job(d, IX).update(maxFailedIndexes=9)),
    ("indexed", "parallelism > completions", lambda d: _job(d, IX).update(parallelism=9)),
    (
        "image-digest",
        "tag",
        lambda d: _container(d).update(image="registry.example.com/kubeflow/triage:0.1.0"),
    ),
    ("image-digest", "short digest", lambda d: _container(d, IX).update(image="r.example.com/t@sha256:abc")),
    ("command", "other args", lambda d: _container(d).update(args=["feedback", "--since-hours", "24"])),
    ("command", "other command", lambda d: _container(d, IX).update(command=["python", "-m", "triage"])),
    (
        "references",
        "Secret misspelt",
        lambda d: _env(d, "OPENAI_API_KEY")["valueFrom"]["secretKeyRef"].update(name="triage-secret"),
    ),
    (
        "references",
        "key missing",
        lambda d: _env(d, "OPENAI_API_KEY")["valueFrom"]["secretKeyRef"].update(key="openai-key"),
    ),
    ("references", "ConfigMap gone", lambda d: d["cronjob.yaml"].remove(_doc(d, "ConfigMap", "triage-env"))),
    (
        "references",
        "other namespace",
        lambda d: _doc(d, "ConfigMap", "triage-config")["metadata"].update(namespace="default"),
    ),
    (
        "example-secret",
        "real-looking value",
        lambda d: _doc(d, "Secret", "triage-secrets")["stringData"].update({"openai-api-key": "sk-live-123"}),
    ),
    (
        "example-secret",
        "no selector label",
        lambda d: _doc(d, "Secret", "triage-secrets")["metadata"].pop("labels"),
    ),
    ("security-context", "root", lambda d: _pod(d)["securityContext"].update(runAsUser=0)),
    ("security-context", "non-root off", lambda d: _pod(d)["securityContext"].pop("runAsNonRoot")),
    (
        "security-context",
        "writable root",
        lambda d: _container(d)["securityContext"].update(readOnlyRootFilesystem=False),
    ),
    (
        "security-context",
        "escalation",
        lambda d: _container(d, IX)["securityContext"].pop("allowPrivilegeEscalation"),
    ),
    (
        "security-context",
        "capability added",
        lambda d: _container(d)["securityContext"]["capabilities"].update(add=["NET_ADMIN"]),
    ),
    ("security-context", "seccomp off", lambda d: _pod(d)["securityContext"].pop("seccompProfile")),
    (
        "security-context",
        "service account token",
        lambda d: _pod(d).update(automountServiceAccountToken=True),
    ),
    ("security-context", "TMPDIR not on the emptyDir", lambda d: _env(d, "TMPDIR").update(value="/tmp")),
    ("security-context", "no memory limit", lambda d: _container(d)["resources"]["limits"].pop("memory")),
    (
        "window-coverage",
        "late start past the overlap",
        lambda d: _cron(d)["spec"].update(startingDeadlineSeconds=3600),
    ),
    (
        "window-coverage",
        "config TOML broken",
        lambda d: _doc(d, "ConfigMap", "triage-config")["data"].update(
            {"triage.toml": "[window]\nlag_minutes = -1\n"}
        ),
    ),
    ("window-coverage", "config file not mounted", lambda d: _container(d)["volumeMounts"].pop(1)),
    ("one-cronjob", "two CronJob names", lambda d: _cron(d, IX)["metadata"].update(name="triage-sharded")),
    (
        "side-jobs",
        "issues sync on by default",
        lambda d: _doc(d, "CronJob", "triage-issues-sync")["spec"].pop("suspend"),
    ),
    (
        "side-jobs",
        "issues sync runs the night",
        lambda d: _doc(d, "CronJob", "triage-issues-sync")["spec"]["jobTemplate"]["spec"]["template"]["spec"][
            "containers"
        ][0].update(args=["feedback", "--write"]),
    ),
]


def test_every_rule_has_a_broken_copy() -> None:
    assert {rule for rule, _, _ in BROKEN} == set(k8s.RULES)


@pytest.mark.parametrize(
    ("rule", "mutate"), [(r, m) for r, _, m in BROKEN], ids=[f"{r}:{w}" for r, w, _ in BROKEN]
)
def test_semantic_rule_fails_on_a_broken_copy(rule: str, mutate: Mutation) -> None:
    docs = copy.deepcopy(_docs())
    assert k8s.check(docs, only=rule) == []  # the rule passes before the change ...
    mutate(docs)
    assert k8s.check(docs, only=rule), f"rule {rule} did not notice"  # ... and fails after it


@pytest.mark.parametrize(
    ("text", "low", "high", "expected"),
    [
        ("*/15", 0, 59, {0, 15, 30, 45}),
        ("1-5", 0, 7, {1, 2, 3, 4, 5}),
        ("mon-fri", 0, 7, {1, 2, 3, 4, 5}),
        ("10-20/5,3", 0, 59, {3, 10, 15, 20}),
        ("5/20", 0, 59, {5, 25, 45}),
    ],
)
def test_cron_field_values(text: str, low: int, high: int, expected: set[int]) -> None:
    names = dict(k8s._CRON_FIELDS[4][3]) if "mon" in text else {}
    assert k8s.cron_field(text, low, high, names) == expected


# ------------------------------------------------------------------ Dockerfile

BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|cc|clang|make|build-essential|python3?-dev|libc6?-dev|cargo|rustc|git|hatchling)\b"
)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    lines: list[str] = []
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        lines.append(raw)
    joined = "\n".join(lines).replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        word, _, rest = line.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _stages(text: str) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions(text):
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def _dockerignored(name: str) -> bool:
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if p.strip() and not p.startswith("#")
    ]
    return any(fnmatch.fnmatch(name, p.removeprefix("**/")) for p in patterns)


def dockerfile_problems(text: str) -> list[str]:
    """What breaks the image's invariants: one message per broken invariant."""
    problems: list[str] = []
    args = {}
    for word, rest in _instructions(text):
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
        if word == "FROM":
            break
    stages = _stages(text)
    if len(stages) < 2:
        return ["not multi-stage"]
    builder, final = stages[0], stages[-1]
    for stage in stages:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), stage[0][1].split()[0])
        version = re.match(r"python:3\.(\d+)[.\d]*-slim", image)
        if not version or int(version.group(1)) < 11:
            problems.append(f"base {image!r} is not a slim Python 3.11+ image")
    if not any(w == "RUN" and re.search(r"pip wheel|-m build", r) for w, r in builder):
        problems.append("the builder stage builds no wheel")
    # every input of the wheel (pyproject: readme, packages, force-include) is copied in, none ignored
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    inputs = {"pyproject.toml", project["project"]["readme"], *wheel["packages"], *wheel["force-include"]}
    copied = {
        src for w, r in builder if w == "COPY" for src in shlex.split(r)[:-1] if not src.startswith("--")
    }
    for name in sorted(inputs):
        if name not in copied:
            problems.append(f"the builder does not copy {name}")
        elif _dockerignored(name) or not (ROOT / name).exists():
            problems.append(f"{name} is missing or excluded by .dockerignore")
    final_runs = " ".join(r for w, r in final if w == "RUN")
    if m := BUILD_TOOLS.search(final_runs):
        problems.append(f"the final stage installs or runs a build tool: {m.group(0)}")
    if any(w == "COPY" and "--from" not in r for w, r in final) or "pip wheel" in final_runs:
        problems.append("the final stage copies sources or builds: it must only install the built wheels")
    if "--no-index" not in final_runs:
        problems.append("the final stage must install from the built wheels only (--no-index)")
    if "ca-certificates" not in final_runs:
        problems.append("the final stage must install ca-certificates")
    users = [(i, r) for i, (w, r) in enumerate(final) if w == "USER"]
    if not users or users[-1][1].split(":")[0] != "10001":
        problems.append("the final stage must end as USER 10001 (numeric, for runAsNonRoot)")
    help_runs = [i for i, (w, r) in enumerate(final) if w == "RUN" and re.search(r"(^|&& )triage --help", r)]
    if not help_runs:
        problems.append("no `RUN triage --help` build check")
    elif users and help_runs[-1] < users[-1][0]:
        problems.append("`triage --help` runs before USER: check it as the runtime user")
    entry = [r for w, r in final if w == "ENTRYPOINT"]
    if entry != ['["triage"]']:
        problems.append(f'ENTRYPOINT {entry} must be the exec form ["triage"]')
    return problems


def test_dockerfile_invariants() -> None:
    assert dockerfile_problems((ROOT / "Dockerfile").read_text(encoding="utf-8")) == []


DOCKER_BROKEN = [
    (
        "FROM ${PYTHON_IMAGE}\n",
        "FROM ${PYTHON_IMAGE}\nRUN apt-get update && apt-get install -y gcc\n",
        "build tool",
    ),
    ("USER 10001:10001", "USER root", "USER 10001"),
    ("RUN triage --help \\\n && ", "RUN ", "triage --help"),
    ("COPY prompts ./prompts\n", "", "does not copy prompts"),
    ("ARG PYTHON_IMAGE=python:3.11-slim-bookworm", "ARG PYTHON_IMAGE=python:3.11-bookworm", "slim"),
    ("ARG PYTHON_IMAGE=python:3.11-slim-bookworm", "ARG PYTHON_IMAGE=python:3.10-slim-bookworm", "3.11+"),
    ('ENTRYPOINT ["triage"]', "ENTRYPOINT triage", "ENTRYPOINT"),
    ("--no-index ", "", "--no-index"),
    ("--no-install-recommends ca-certificates", "--no-install-recommends tini", "ca-certificates"),
    ("USER 10001:10001\n", "", "USER 10001"),
]


@pytest.mark.parametrize(("old", "new", "expected"), DOCKER_BROKEN, ids=[e for _, _, e in DOCKER_BROKEN])
def test_dockerfile_invariant_fails_on_a_broken_copy(old: str, new: str, expected: str) -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert old in text
    problems = dockerfile_problems(text.replace(old, new, 1))
    assert any(expected in p for p in problems), problems


def test_dockerfile_help_check_after_user_is_enforced() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    moved = text.replace("USER 10001:10001\n", "").replace(
        'ENTRYPOINT ["triage"]', 'USER 10001\nENTRYPOINT ["triage"]'
    )
    assert any("before USER" in p for p in dockerfile_problems(moved))


@pytest.mark.slow
def test_wheel_the_image_installs_holds_prompts_defaults_and_demo(tmp_path: Path) -> None:
    """The builder stage's `pip wheel` of this repo: package data must land inside the wheel."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = tmp_path.glob("feedback_triage-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "triage/defaults.toml" in names
    assert "triage/cli.py" in names or not (ROOT / "triage" / "cli.py").exists()
    prompts = {f"triage/prompts/{p.name}" for p in (ROOT / "prompts").glob("*.j2")}
    assert prompts <= names, f"missing from the wheel: {sorted(prompts - names)}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "triage = triage.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    demo = ROOT / "triage" / "demo"
    if demo.is_dir():
        files = {
            f"triage/{p.relative_to(ROOT / 'triage').as_posix()}" for p in demo.rglob("*") if p.is_file()
        }
        files = {f for f in files if "__pycache__" not in f}
        assert files and files <= names, f"demo data missing from the wheel: {sorted(files - names)}"
    if not prompts:
        pytest.skip("prompts/ has no *.j2 templates yet: checked defaults.toml and the entry point only")
