"""The component catalogue of `triage/defaults.toml` is data with a check.

Against the real Kubeflow docs in ../shared/corpus (skipped where the corpus is absent): every
`sources` pattern matches a page (its URL or path) or a link in one (or, for a repository the docs
no longer link under its old name, an issue thread of the evaluation set), no two components claim
the same page or link, and every docs section (`components/<x>/`, `ecosystem/<x>/`) has its component.
Without the corpus: no two components claim a URL of the demo index or of the evaluation set's
issue threads, and the keyword rule (phrase weight, each word counted once, ties to the first listed).
"""

from __future__ import annotations

import json
import re
import threading
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO
from triage.domain.config import TriageConfig
from triage.domain.rule import choose_component, component_from_sources, component_from_text
from triage.settings import load_config

CONFIG = load_config()
# absolute links in a page's text (Markdown, HTML attributes, shortcodes)
_LINK = re.compile(r"https?://[^\s)\"'<>\]`]+")
COLLECTIONS = {"kubeflow-docs": "https://www.kubeflow.org/docs/", "katib-examples": None}


def claims(url: str, config: TriageConfig = CONFIG) -> list[str]:
    """Every component one of whose patterns the URL (or path) holds."""
    return [
        name
        for name, component in config.components.items()
        if any(pattern and pattern in url for pattern in component.sources)
    ]


def pages(corpus: Path) -> list[dict[str, str]]:
    """Every page of the corpus: its URL, its path (as the collection folder holds it) and its text."""
    out = []
    for folder in COLLECTIONS:
        base = corpus / folder
        for line in (base / "INDEX.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                text = (base / row["path"]).read_text(encoding="utf-8")
                out.append({"url": row["url"], "path": f"{folder}/{row['path']}", "text": text})
    return out


def links(corpus: Path) -> set[str]:
    return {found.rstrip(".,;:") for page in pages(corpus) for found in _LINK.findall(page["text"])}


def shipped_urls() -> list[str]:
    """The URLs of the demo index and of the evaluation set's issue threads."""
    urls = []
    demo = REPO / "triage" / "demo" / "index"
    for path in [*demo.rglob("*.md"), *(REPO / "evals" / "kubeflow" / "issues").glob("*.md")]:
        text = path.read_text(encoding="utf-8")
        front = text.split("+++")[1] if text.startswith("+++") else ""
        if "url" in (meta := tomllib.loads(front)):
            urls.append(meta["url"])
    urls += [json.loads(line)["url"] for line in (demo / "code" / "INDEX.jsonl").open(encoding="utf-8")]
    return urls


def test_every_pattern_matches_a_page_or_a_link_of_the_docs(corpus: Path) -> None:
    found = pages(corpus)
    targets = [p["url"] for p in found] + [p["path"] for p in found] + sorted(links(corpus))
    # kubeflow/model-registry (now kubeflow/hub) is in no link of the docs, but in issue URLs
    targets += [url for url in shipped_urls() if "/issues/" in url]
    unmatched = [
        f"{name}: {pattern!r}"
        for name, component in CONFIG.components.items()
        for pattern in component.sources
        if not any(pattern in target for target in targets)
    ]
    assert not unmatched, "patterns that match no page, path or link of the corpus: " + ", ".join(unmatched)


def test_no_two_components_claim_the_same_page_or_link(corpus: Path) -> None:
    found = pages(corpus)
    targets = [p["url"] for p in found] + [p["path"] for p in found] + sorted(links(corpus))
    shared = {t: names for t in targets if len(names := claims(t)) > 1}
    assert not shared, f"claimed by more than one component: {shared}"


def test_every_docs_section_has_exactly_its_component(corpus: Path) -> None:
    """Each `components/<x>/` and `ecosystem/<x>/` folder of the docs: all its pages, by URL and
    by path, go to one and the same catalogue component (not the default by absence)."""
    by_section: dict[str, set[str | None]] = defaultdict(set)
    for page in pages(corpus):
        parts = page["path"].split("/")  # kubeflow-docs/components/<x>/...
        if parts[0] == "kubeflow-docs" and parts[1] in ("components", "ecosystem") and len(parts) > 3:
            for where in (page["url"], page["path"]):
                by_section[f"{parts[1]}/{parts[2]}"].add(component_from_sources([where], CONFIG))
    assert len(by_section) >= 15, sorted(by_section)  # 11 components/ sections, 4 ecosystem/ ones
    wrong = {section: names for section, names in by_section.items() if len(names) != 1 or None in names}
    assert not wrong, f"sections without exactly one component: {wrong}"
    assert len({next(iter(names)) for names in by_section.values()}) == len(by_section)


def test_release_and_installation_pages_go_to_the_distribution(corpus: Path) -> None:
    for page in pages(corpus):
        if page["path"].startswith(("kubeflow-docs/kubeflow-distribution/", "kubeflow-docs/started/installing")):
            assert component_from_sources([page["url"]], CONFIG) == "manifests", page["url"]


def test_no_two_components_claim_a_demo_or_evaluation_set_url() -> None:
    """The URLs that ship with the project (no corpus needed)."""
    urls = shipped_urls()
    assert len(urls) > 30
    shared = {u: names for u in urls if len(names := claims(u)) > 1}
    assert not shared
    assert all(claims(u) for u in urls), [u for u in urls if not claims(u)]


def test_every_owner_is_a_repository() -> None:
    for name, component in CONFIG.components.items():
        assert re.fullmatch(r"[a-z0-9-]+/[a-z0-9-]+", component.owner), (name, component.owner)


# --------------------------------------------------------------------------- the keyword rule


def _config(components: dict[str, list[str]]) -> TriageConfig:
    return TriageConfig.model_validate(
        {
            "agent": {"team": "team", "default_component": "general"},
            "tools": {"search": "docs"},
            "components": {
                **{name: {"owner": f"o/{name}", "keywords": kws} for name, kws in components.items()},
                "general": {"owner": "o/general"},
            },
        }
    )


def test_a_phrase_outweighs_a_word_and_a_word_counts_once() -> None:
    config = _config({"a": ["notebook"], "b": ["model registry"], "c": ["pipeline"], "d": ["pipeline editor"]})
    assert component_from_text("Reach the model registry from a notebook", config) == "b"
    # "pipeline" inside "pipeline editor" is not also a hit for c
    assert component_from_text("the pipeline editor", config) == "d"
    assert component_from_text("a pipeline, a pipeline and the pipeline editor", config) == "c"


def test_a_keyword_tie_goes_to_the_component_listed_first() -> None:
    assert component_from_text("notebook pipeline", _config({"a": ["pipeline"], "b": ["notebook"]})) == "a"
    assert component_from_text("notebook pipeline", _config({"b": ["notebook"], "a": ["pipeline"]})) == "b"
    assert component_from_text("nothing here", _config({"a": ["pipeline"]})) is None


def test_a_package_managers_install_is_no_installation_of_kubeflow() -> None:
    config = _config({"notebooks": ["jupyter"], "manifests": ["install"]})
    text = "apt-get install fails in my image based on the jupyter image; the pip install works"
    assert component_from_text(text, config) == "notebooks"
    assert component_from_text("pip install -U --user kfp", config) is None
    assert component_from_text("How do I install it on kind?", config) == "manifests"
    assert component_from_text("the apt-get command failed, so I install it by hand", config) == "manifests"


def test_a_command_with_many_options_is_read_in_linear_time() -> None:
    # `(?:\s+-{1,2}[\w-]+)*` split each `--x` two ways: 2^n tries on a line that does not match
    config = _config({"notebooks": ["notebook"], "manifests": ["install"]})
    text = "my notebook: pip" + " --x" * 40 + "=1 and a notebook"
    done = threading.Event()
    worker = threading.Thread(target=lambda: (component_from_text(text, config), done.set()), daemon=True)
    worker.start()
    assert done.wait(10), "component_from_text backtracks: a guard against a catastrophic regex, not a speed target"


@pytest.mark.parametrize(
    ("text", "component"),
    [
        ("How do I tag cells so that Kale turns my notebook into a pipeline?", "kale"),
        ("Which WorkspaceKind fields set the image of my workspaces?", "workspaces"),
        ("Can Claude submit a TrainJob through the MCP server?", "mcp-server"),
        ("Does the Kubeflow SDK have an OptimizerClient?", "sdk"),
        ("How do I run a pipeline built in the Elyra visual pipeline editor?", "elyra"),
        ("Where do I define a feature view in Feast?", "feast"),
        ("How can I use Feast with Kubeflow Pipelines?", "feast"),  # a tie: the narrower one is first
        ("How do I fine-tune an LLM with Kubeflow?", "trainer"),
        ("Does OGX, formerly Llama Stack, serve the Responses API?", "ogx"),
        ("How do I install the Model Registry Python client in a notebook?", "hub"),
        ("As which user must a custom notebook image run?", "notebooks"),
        ("Which release of the Kubeflow Community Distribution is the latest?", "manifests"),
        ("Is there a Helm chart that installs the whole platform?", "manifests"),
        ("When is the next Kubeflow Summit?", None),
    ],
)
def test_the_default_keywords_place_questions_about_each_component(text: str, component: str | None) -> None:
    assert component_from_text(text, CONFIG) == component


@pytest.mark.parametrize(
    ("url", "component"),
    [
        ("https://www.kubeflow.org/docs/components/kale/overview/", "kale"),
        ("https://github.com/kubeflow/kale/issues/12", "kale"),
        ("https://www.kubeflow.org/docs/components/workspaces/operator-guides/deployment-guide/", "workspaces"),
        ("https://github.com/kubeflow/notebooks/issues/1336", "notebooks"),  # one repository for both
        ("https://www.kubeflow.org/docs/components/mcp-server/overview/", "mcp-server"),
        ("https://sdk.kubeflow.org/en/latest/mcp-server/index.html", "mcp-server"),
        ("https://github.com/kubeflow/sdk/issues/3", "sdk"),
        ("https://github.com/kubeflow/community-distribution/issues/3", "manifests"),
        ("https://www.kubeflow.org/docs/about/community/", "general"),
        ("https://www.kubeflow.org/docs/started/introduction/", "general"),
    ],
)
def test_sources_decide_first(url: str, component: str) -> None:
    assert choose_component([url], "katib", "a Katib question", None, CONFIG) == (component, "sources")
