"""The relay's objects in cronjob.yaml (PVC, Deployment, Service, PodDisruptionBudget): locked down
like the CronJob, its probes on the relay's own endpoints, its outbox on the volume. yamllint and
`kubernetes-validate --strict` run on the whole file in tests/test_manifests.py; these are the
rules those tools cannot know."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest

from tests.test_manifests import _load_checker
from triage.cli.relay import relay

ROOT = Path(__file__).resolve().parents[1]
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
    if spec.get("replicas") != 1 or spec.get("strategy", {}).get("type") != "Recreate":
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
    if "persistentVolumeClaim" not in volumes.get(mounts.get(folder, ""), {}):
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
    secret = next(d for d in docs if d["kind"] == "Secret")
    for name, item in env.items():
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref and (ref["name"] != secret["metadata"]["name"] or ref["key"] not in secret.get("stringData", {})):
            found.append(f"{name}: Secret key {ref['key']!r} is not in {secret['metadata']['name']!r}")
    service = _one(docs, "Service", "triage-relay")
    if service["spec"]["selector"].items() - labels.items():
        found.append("the Service selects no relay Pod")
    if any(p["targetPort"] not in ports and p["targetPort"] not in ports.values() for p in service["spec"]["ports"]):
        found.append("the Service's targetPort is not a container port")
    budget = _one(docs, "PodDisruptionBudget", "triage-relay")
    if budget["spec"]["selector"]["matchLabels"].items() - labels.items():
        found.append("the PodDisruptionBudget selects no relay Pod")
    return found


def test_the_relay_objects_pass() -> None:
    assert problems(_docs()) == []


def _container(docs: Docs) -> dict[str, Any]:
    return dict(_one(docs, "Deployment", "triage-relay")["spec"]["template"]["spec"]["containers"][0])


def _set(docs: Docs, **changes: Any) -> None:
    _one(docs, "Deployment", "triage-relay")["spec"]["template"]["spec"]["containers"][0].update(changes)


MUTATIONS: list[tuple[str, Callable[[Docs], None]]] = [
    ("one replica", lambda d: _one(d, "Deployment", "triage-relay")["spec"].update(replicas=2)),
    ("read-only root", lambda d: _set(d, securityContext={**_container(d)["securityContext"],
                                                          "readOnlyRootFilesystem": False})),
    ("PersistentVolumeClaim", lambda d: _set(d, env=[
        {"name": "TRIAGE_RELAY_OUTBOX", "value": "/scratch/relay.sqlite"} if e["name"] == "TRIAGE_RELAY_OUTBOX" else e
        for e in _container(d)["env"]])),
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
