"""The relay's objects in cronjob.yaml (Deployment, Service, PodDisruptionBudget, the database
URL's Secret): locked down like the CronJob, its probes on the relay's own endpoints, and one of
two variants: replicas sharing a PostgreSQL ledger (the file's: two or more, rolled one at a time,
a budget that keeps one up, the URL from a Secret, Langfuse as the sink), or one replica with its
SQLite ledger on a volume (documented in the file, built here by `single_replica` and checked by
the same rules). yamllint and `kubernetes-validate --strict` run on the whole file in
tests/deploy/test_manifests.py; these are the rules those tools cannot know."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest

from tests.deploy.test_manifests import _load_checker
from triage.cli import relay

ROOT = Path(__file__).resolve().parents[2]
Docs = list[dict[str, Any]]


def _docs() -> Docs:
    return list(_load_checker().load(ROOT / "cronjob.yaml"))


def _one(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def problems(docs: Docs) -> list[str]:
    found: list[str] = []
    deployment = _one(docs, "Deployment", "triage-relay")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    [container] = pod["containers"]
    env = {e["name"]: e for e in container.get("env", [])}
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    budget = _one(docs, "PodDisruptionBudget", "triage-relay")
    shared = "TRIAGE_RELAY_DATABASE_URL" in env
    if shared:
        # replicas sharing the PostgreSQL ledger (the relay refuses to start otherwise: exit 3)
        if not isinstance(spec.get("replicas"), int) or spec["replicas"] < 2:
            found.append("two or more replicas: the ledger is shared")
        strategy = spec.get("strategy", {})
        if strategy.get("type") != "RollingUpdate" or strategy.get("rollingUpdate", {}).get("maxUnavailable") != 0:
            found.append("RollingUpdate with maxUnavailable 0: a new replica is ready before an old one goes")
        if budget["spec"].get("minAvailable", 0) < 1:
            found.append("a PodDisruptionBudget that keeps one up (minAvailable >= 1)")
        if "secretKeyRef" not in env["TRIAGE_RELAY_DATABASE_URL"].get("valueFrom", {}):
            found.append("TRIAGE_RELAY_DATABASE_URL holds a password: from a Secret")
        if not {"LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"} <= env.keys():
            found.append("a PostgreSQL ledger needs Langfuse as the sink (LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY)")
        if "TRIAGE_RELAY_OUTBOX" in env:
            found.append("TRIAGE_RELAY_OUTBOX beside TRIAGE_RELAY_DATABASE_URL: one ledger")
    elif spec.get("replicas") != 1 or spec.get("strategy", {}).get("type") != "Recreate":
        found.append("one replica, Recreate: one writer of the outbox volume")
    if spec["selector"]["matchLabels"].items() - labels.items():
        found.append("the selector does not match the Pod's labels")
    psc, csc = pod.get("securityContext", {}), container.get("securityContext", {})
    if pod.get("automountServiceAccountToken") is not False:
        found.append("automountServiceAccountToken must be false")
    if psc.get("runAsNonRoot") is not True or psc.get("runAsUser") != 10001:
        found.append("non-root user 10001")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        found.append("seccomp RuntimeDefault")
    if csc.get("readOnlyRootFilesystem") is not True or csc.get("allowPrivilegeEscalation") is not False:
        found.append("read-only root filesystem, no privilege escalation")
    if csc.get("capabilities", {}).get("drop") != ["ALL"]:
        found.append("capabilities drop ALL")
    for kind in ("requests", "limits"):
        for resource in ("cpu", "memory"):
            if resource not in container.get("resources", {}).get(kind, {}):
                found.append(f"resources.{kind}.{resource} unset")
    outbox = env.get("TRIAGE_RELAY_OUTBOX", {}).get("value", "")
    folder = str(Path(outbox).parent)
    if shared:
        pass  # no volume: the ledger is in PostgreSQL
    elif "persistentVolumeClaim" not in volumes.get(mounts.get(folder, ""), {}):
        found.append(f"TRIAGE_RELAY_OUTBOX {outbox!r} must be on the PersistentVolumeClaim")
    else:
        claim = volumes[mounts[folder]]["persistentVolumeClaim"]["claimName"]
        if not any(d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim for d in docs):
            found.append(f"PersistentVolumeClaim {claim!r} is not defined")
    if "emptyDir" not in volumes.get(mounts.get(env.get("TMPDIR", {}).get("value", ""), ""), {}):
        found.append("TMPDIR must be an emptyDir mount")
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ports:
            found.append(f"{probe} must GET {path} on a container port")
    cron = next(d for d in docs if d["kind"] == "CronJob")
    cron_image = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"]
    if "@sha256:" not in container["image"] or container["image"] != cron_image:
        found.append("the image must be the CronJob's, pinned by digest")
    # the command must parse, and off loopback the relay refuses to start without credentials
    args = container.get("args", [])
    if container.get("command") != ["triage"] or not args or args[0] != "relay":
        found.append("command triage, args relay ...")
    else:
        try:
            context = relay.make_context("relay", list(args[1:]))
            host = context.params["host"]
        except click.ClickException as ex:
            found.append(f"the relay's args do not parse: {ex}")
            host = "127.0.0.1"
        credentials = {"TRIAGE_RELAY_TOKEN", "TRIAGE_RELAY_SIGNING_KEY"} & env.keys()
        if host not in ("127.0.0.1", "localhost") and not credentials:
            found.append(f"serving on {host} needs TRIAGE_RELAY_TOKEN or TRIAGE_RELAY_SIGNING_KEY")
    secrets = {d["metadata"]["name"]: d.get("stringData", {}) for d in docs if d["kind"] == "Secret"}
    for name, item in env.items():
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["key"] not in secrets.get(ref["name"], {}):
            found.append(f"{name}: Secret key {ref['key']!r} is not in {ref['name']!r}")
    service = _one(docs, "Service", "triage-relay")
    if service["spec"]["selector"].items() - labels.items():
        found.append("the Service selects no relay Pod")
    if any(p["targetPort"] not in ports and p["targetPort"] not in ports.values() for p in service["spec"]["ports"]):
        found.append("the Service's targetPort is not a container port")
    if budget["spec"]["selector"]["matchLabels"].items() - labels.items():
        found.append("the PodDisruptionBudget selects no relay Pod")
    return found


def single_replica(docs: Docs) -> Docs:
    """The single-replica variant cronjob.yaml documents beside its Deployment: the ledger in a
    SQLite file on a PersistentVolumeClaim, one replica, Recreate, a budget of one Pod."""
    docs = copy.deepcopy(docs)
    deployment = _one(docs, "Deployment", "triage-relay")
    deployment["spec"].update(replicas=1, strategy={"type": "Recreate"})
    pod = deployment["spec"]["template"]["spec"]
    pod["securityContext"]["fsGroup"] = 10001
    pod["volumes"].append({"name": "outbox", "persistentVolumeClaim": {"claimName": "triage-relay-outbox"}})
    container = pod["containers"][0]
    container["volumeMounts"].append({"name": "outbox", "mountPath": "/var/lib/triage-relay"})
    container["env"] = [
        {"name": "TRIAGE_RELAY_OUTBOX", "value": "/var/lib/triage-relay/relay.sqlite"}
        if e["name"] == "TRIAGE_RELAY_DATABASE_URL" else e
        for e in container["env"]
    ]  # fmt: skip
    _one(docs, "PodDisruptionBudget", "triage-relay")["spec"] = {
        "maxUnavailable": 1, "selector": _one(docs, "PodDisruptionBudget", "triage-relay")["spec"]["selector"],
    }  # fmt: skip
    labels = deployment["metadata"]["labels"]
    docs.append({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "triage-relay-outbox", "namespace": "triage", "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    return docs


def test_the_relay_objects_pass() -> None:
    assert problems(_docs()) == []


def test_the_documented_single_replica_variant_passes_and_is_valid(tmp_path: Path) -> None:
    """What the comment in cronjob.yaml describes, built: the same rules, and the schema."""
    import subprocess
    import sys

    import yaml

    docs = single_replica(_docs())
    assert problems(docs) == []
    twice = copy.deepcopy(docs)
    _one(twice, "Deployment", "triage-relay")["spec"]["replicas"] = 2
    assert any("one replica" in p for p in problems(twice))
    path = tmp_path / "single.yaml"
    path.write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    pytest.importorskip("kubernetes_validate")
    checked = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", "1.33.0", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_relay_manifest_starts_the_relay_it_describes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Deployment's environment is one `triage relay` accepts: with its Secret's values (the
    placeholders), it passes the start-up refusals and fails only on reaching the database."""
    from click.testing import CliRunner

    from triage.cli import cli

    docs = _docs()
    secrets = {d["metadata"]["name"]: d.get("stringData", {}) for d in docs if d["kind"] == "Secret"}
    container = _container(docs)
    monkeypatch.delenv("TRIAGE_RELAY_OUTBOX", raising=False)
    for item in container["env"]:
        if item["name"] in ("TMPDIR", "HOME"):
            continue
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        value = secrets[ref["name"]][ref["key"]] if ref else item["value"]
        # the placeholders made long enough for a secret off loopback; the database on a dead port
        value = value.removeprefix("REPLACE_ME_") + "-" * 40
        if item["name"] == "TRIAGE_RELAY_DATABASE_URL":
            value = "postgresql://relay:x@127.0.0.1:1/relay?connect_timeout=2"
        monkeypatch.setenv(item["name"], value)
    result = CliRunner().invoke(cli, container["args"])
    assert result.exit_code == 3, result.output
    assert "PostgreSQL ledger at 127.0.0.1:1/relay cannot be opened" in result.output


def _container(docs: Docs) -> dict[str, Any]:
    return dict(_one(docs, "Deployment", "triage-relay")["spec"]["template"]["spec"]["containers"][0])


def _set(docs: Docs, **changes: Any) -> None:
    _one(docs, "Deployment", "triage-relay")["spec"]["template"]["spec"]["containers"][0].update(changes)


def _single(mutate: Callable[[Docs], None]) -> Callable[[Docs], None]:
    """A mutation of the single-replica variant (the list is replaced in place by that variant)."""

    def apply(docs: Docs) -> None:
        docs[:] = single_replica(docs)
        mutate(docs)

    return apply


MUTATIONS: list[tuple[str, Callable[[Docs], None]]] = [
    ("two or more replicas", lambda d: _one(d, "Deployment", "triage-relay")["spec"].update(replicas=1)),
    ("RollingUpdate", lambda d: _one(d, "Deployment", "triage-relay")["spec"].update(strategy={"type": "Recreate"})),
    ("keeps one up", lambda d: _one(d, "PodDisruptionBudget", "triage-relay")["spec"].update(minAvailable=0)),
    ("from a Secret", lambda d: _set(d, env=[
        {"name": e["name"], "value": "postgresql://u:p@h/d"} if e["name"] == "TRIAGE_RELAY_DATABASE_URL" else e
        for e in _container(d)["env"]])),
    ("needs Langfuse",
     lambda d: _set(d, env=[e for e in _container(d)["env"] if not e["name"].startswith("LANGFUSE")])),
    ("one ledger", lambda d: _set(d, env=[*_container(d)["env"], {"name": "TRIAGE_RELAY_OUTBOX", "value": "/x"}])),
    ("not in 'triage-relay-database'",
     lambda d: next(s for s in d if s["metadata"]["name"] == "triage-relay-database")["stringData"].pop("url")),
    ("one replica", _single(lambda d: _one(d, "Deployment", "triage-relay")["spec"].update(replicas=2))),
    ("read-only root", lambda d: _set(d, securityContext={**_container(d)["securityContext"],
                                                          "readOnlyRootFilesystem": False})),
    ("PersistentVolumeClaim", _single(lambda d: _set(d, env=[
        {"name": "TRIAGE_RELAY_OUTBOX", "value": "/scratch/relay.sqlite"} if e["name"] == "TRIAGE_RELAY_OUTBOX" else e
        for e in _container(d)["env"]]))),
    ("readinessProbe", lambda d: _set(d, readinessProbe={"httpGet": {"path": "/", "port": "http"}})),
    ("needs TRIAGE_RELAY_TOKEN", lambda d: _set(d, env=[
        e for e in _container(d)["env"] if e["name"] not in ("TRIAGE_RELAY_TOKEN", "TRIAGE_RELAY_SIGNING_KEY")])),
    ("do not parse", lambda d: _set(d, args=["relay", "--port", "http"])),
    ("Service selects no", lambda d: _one(d, "Service", "triage-relay")["spec"].update(selector={"app": "x"})),
    ("not in 'triage-secrets'", lambda d: next(s for s in d if s["kind"] == "Secret")["stringData"].pop("relay-token")),
]  # fmt: skip


@pytest.mark.parametrize(("expected", "mutate"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_broken_copy_fails(expected: str, mutate: Callable[[Docs], None]) -> None:
    docs = copy.deepcopy(_docs())
    mutate(docs)
    assert any(expected in p for p in problems(docs)), problems(docs)
