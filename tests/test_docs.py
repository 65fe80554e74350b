"""The docs kept in step with the code (#28): the README short, `docs/commands.md` describing every
command and option of the CLI (and no option the CLI lacks), the exit codes, the settings, the
relay's statuses and limits, every relative link resolving, and ARCHITECTURE.md's rooms (a row per
package, a subject in every module's docstring, the modules past 600 lines or under 60) and its layers
(every import contract named).

Built from the click tree, the enums and the models, so a new option, exit code, setting or status
fails here until the docs say what it does."""

from __future__ import annotations

import importlib
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from markdown_it import MarkdownIt
from markdown_it.token import Token
from pydantic import AliasChoices, AliasPath

from tests.rooms import FLOOR, SOFT_CAP, modules, packages, subject
from triage import judges
from triage.cli import cli
from triage.domain.config import RelayConfig
from triage.errors import ExitCode
from triage.relay.openapi import STATUSES
from triage.settings import Settings

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
ARCHITECTURE = REPO / "ARCHITECTURE.md"
COMMANDS = DOCS / "commands.md"
OPERATIONS = DOCS / "operations.md"
RELAY = DOCS / "relay.md"
README_LIMIT = 20_000

#: the README's set-up, verbatim: CI runs the second, people paste both
SETUP_COMMANDS = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install . && triage demo && triage check && triage releases",
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && python -m pytest -q",
)
#: variables the docs may name that `Settings` does not read, and the file that reads each
NOT_SETTINGS = {"TRIAGE_IMAGE_TEST": REPO / "tests" / "deploy" / "test_image.py"}

#: the judges' names by family: where a family is the choice, `--help` lists it (`Family.epilog`)
REGISTRY_NAMES = [judges.JUDGES.names(), judges.CHECK_JUDGES.names()]

OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
#: a variable's name, or a family of them (`TRIAGE_MCP_*`)
ENV = re.compile(r"(?<![\w.])(?:TRIAGE|LANGFUSE|OPENAI|JOB)_[A-Z0-9_]*\*?")
ENV_ASSIGNMENT = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*")
_MD = MarkdownIt("commonmark").enable("table")

CommandPath = tuple[str, ...]


# -- reading the pages ----------------------------------------------------------------------------


def pages() -> list[Path]:
    return [README, ARCHITECTURE, *sorted(DOCS.glob("*.md"))]


def parse(path: Path) -> list[Token]:
    return _MD.parse(path.read_text(encoding="utf-8"))


def heading_text(inline: Token) -> str:
    return "".join(child.content for child in inline.children or [] if child.type in ("text", "code_inline"))


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(tokens: list[Token]) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            base = slug(heading_text(tokens[i + 1]))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def sections(tokens: list[Token], tag: str = "h2") -> Iterator[tuple[str, list[Token]]]:
    """Each `tag` heading's title and the tokens under it, up to the next heading of that level."""
    starts = [i for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == tag]
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(tokens)
        yield heading_text(tokens[start + 1]), tokens[start + 3 : end]


def section(path: Path, title: str) -> list[Token]:
    found = [body for heading, body in sections(parse(path)) if heading == title]
    assert found, f"{path.name} has no section {title!r}"
    return found[0]


def fence_blocks(tokens: list[Token], info: str | None = None) -> list[str]:
    """The fenced blocks' text; with `info`, only the blocks of that info string ("" for none)."""
    return [t.content for t in tokens if t.type == "fence" and (info is None or t.info.strip() == info)]


def prose(tokens: list[Token]) -> str:
    """The text outside code: what a reader reads as sentences and table cells."""
    parts: list[str] = []
    for token in tokens:
        if token.type == "inline":
            parts.extend(c.content for c in token.children or [] if c.type == "text")
    return "\n".join(parts)


def table_rows(tokens: list[Token]) -> list[list[str]]:
    """The body rows of the first table, each cell as its source text (backticks kept)."""
    rows: list[list[str]] = []
    in_body = False
    for token in tokens:
        if token.type == "tbody_open":
            in_body = True
        elif token.type == "tbody_close":
            break
        elif in_body and token.type == "tr_open":
            rows.append([])
        elif in_body and token.type == "inline":
            rows[-1].append(token.content)
    assert rows, "no table"
    return rows


# -- the command line -----------------------------------------------------------------------------


def all_commands() -> list[tuple[CommandPath, click.Command]]:
    found: list[tuple[CommandPath, click.Command]] = []

    def walk(path: CommandPath, command: click.Command) -> None:
        found.append((path, command))
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk((*path, name), sub)

    walk((), cli)
    return found


COMMANDS_BY_PATH = dict(all_commands())


def name(path: CommandPath) -> str:
    return " ".join(("triage", *path))


def real_options(command: click.Command) -> set[str]:
    """Every long option the command takes, `--help` included, both halves of `--x/--no-x`."""
    ctx = click.Context(command, info_name=command.name)
    return {
        opt
        for param in command.get_params(ctx)
        if isinstance(param, click.Option)
        for opt in (*param.opts, *param.secondary_opts)
        if opt.startswith("--")
    }


def options_to_document(command: click.Command) -> set[str]:
    return real_options(command) - {"--help"}


def resolve(words: list[str]) -> tuple[CommandPath, list[str]]:
    """The command a `triage ...` line names, and the words after it."""
    command: click.Command = cli
    path: list[str] = []
    for word in words:
        if isinstance(command, click.Group) and word in command.commands:
            command = command.commands[word]
            path.append(word)
        else:
            break
    return tuple(path), words[len(path) :]


def triage_line(text: str) -> tuple[CommandPath, str] | None:
    """`triage CMD ...` (after a `$ ` prompt and `VAR=value` assignments): the command and the rest."""
    text = ENV_ASSIGNMENT.sub("", text.strip().removeprefix("$ ").strip())
    text = re.sub(r"\s#\s.*$", "", text)
    words = text.split()
    if not words or words[0] != "triage":
        return None
    path, rest = resolve(words[1:])
    return path, " ".join(rest)


def logical_lines(block: str) -> list[str]:
    """A fenced block's lines, a line ending in `\\` or an indented line joined to the one before."""
    lines: list[str] = []
    joining = False
    for line in block.splitlines():
        if lines and (joining or (line[:1].isspace() and line.strip())):
            lines[-1] = lines[-1].rstrip("\\ ") + " " + line.strip()
        else:
            lines.append(line)
        joining = line.rstrip().endswith("\\")
    return lines


def mentions(
    tokens: list[Token], own: CommandPath | None, *, code_blocks: bool = True
) -> list[tuple[CommandPath, str]]:
    """The `--options` the tokens name, each with the command it belongs to: the command a
    `triage CMD --x` code span or code line names, else (in prose and other code spans) `own`; with
    `own` None, only the named ones; without `code_blocks`, none from fenced blocks (a synopsis)."""
    found: list[tuple[CommandPath, str]] = []

    def named(text: str) -> bool:
        line = triage_line(text)
        if line is None:
            return False
        found.extend((line[0], opt) for opt in OPTION.findall(line[1]))
        return True

    for token in tokens:
        if token.type == "fence" and code_blocks:
            for line in logical_lines(token.content):
                named(line)
        elif token.type == "inline":
            for child in token.children or []:
                if child.type == "code_inline" and named(child.content):
                    continue
                if child.type in ("text", "code_inline") and own is not None:
                    found.extend((own, opt) for opt in OPTION.findall(child.content))
    return found


#: the section of docs/commands.md for the options every command takes (`--log-format`), said once
SHARED = "Options of every command"


def command_sections() -> dict[CommandPath, list[Token]]:
    """The sections of docs/commands.md titled `triage CMD`, by the command they name (the first
    of two; `test_every_section_names_one_command` refuses the rest)."""
    found: dict[CommandPath, list[Token]] = {}
    for title, body in sections(parse(COMMANDS)):
        path, rest = resolve(title.split()[1:])
        if title.split()[:1] == ["triage"] and not rest:
            found.setdefault(path, body)
    return found


def test_every_section_names_one_command() -> None:
    titles = [title for title, _ in sections(parse(COMMANDS)) if title.split()[:1] == ["triage"]]
    for title in titles:
        _, rest = resolve(title.split()[1:])
        assert not rest, f"docs/commands.md: section {title!r} names no command of the CLI"
        assert titles.count(title) == 1, f"docs/commands.md: two sections {title!r}"


SECTIONS = command_sections()
LEAVES = [(p, c) for p, c in all_commands() if not isinstance(c, click.Group)]


def described(tokens: list[Token], path: CommandPath | None) -> set[str]:
    """The options the tokens describe for `path` (None: the shared section), in a sentence or a
    table row: a synopsis in a code block lists options, it does not say what they do."""
    own: CommandPath = path if path is not None else ("<shared>",)
    return {opt for owner, opt in mentions(tokens, own, code_blocks=False) if owner == own}


def shared_options() -> set[str]:
    return described(section(COMMANDS, SHARED), None)


def section_text(tokens: list[Token]) -> str:
    return "\n".join(t.content for t in tokens if t.type in ("inline", "fence"))


def needs_section(command: click.Command) -> bool:
    return not isinstance(command, click.Group) or bool(options_to_document(command))


@pytest.mark.parametrize("path", [p for p, c in all_commands() if needs_section(c)], ids=lambda p: name(p))
def test_every_command_is_documented_in_its_own_section(path: CommandPath) -> None:
    assert path in SECTIONS, f"docs/commands.md has no section ## `{name(path)}`"
    command = COMMANDS_BY_PATH[path]
    shared = shared_options() if path in dict(LEAVES) else set()
    missing = sorted(options_to_document(command) - described(SECTIONS[path], path) - shared)
    assert not missing, f"docs/commands.md, `{name(path)}`: {missing} not described (see `{name(path)} --help`)"


def test_the_shared_options_are_options_of_every_command() -> None:
    shared = shared_options()
    assert shared, f"docs/commands.md: the section {SHARED!r} describes no option"
    for path, command in LEAVES:
        lacking = sorted(shared - real_options(command))
        assert not lacking, f"docs/commands.md, {SHARED!r}: `{name(path)}` has no {lacking}"


@pytest.mark.parametrize("path", sorted(SECTIONS), ids=lambda p: name(p))
def test_every_option_a_section_names_is_real(path: CommandPath) -> None:
    for owner, opt in mentions(SECTIONS[path], path):
        assert opt in real_options(COMMANDS_BY_PATH[owner]), (
            f"docs/commands.md, section `{name(path)}`: `{name(owner)}` has no option {opt}"
        )


@pytest.mark.parametrize("path", sorted(SECTIONS), ids=lambda p: name(p))
def test_every_choice_of_an_option_is_named_in_its_section(path: CommandPath) -> None:
    own, shared = section_text(SECTIONS[path]), section_text(section(COMMANDS, SHARED))
    ctx = click.Context(COMMANDS_BY_PATH[path])
    for param in COMMANDS_BY_PATH[path].get_params(ctx):
        if not (isinstance(param, click.Option) and isinstance(param.type, click.Choice)):
            continue
        if list(param.type.choices) in REGISTRY_NAMES:
            continue  # the registry lists its judges in the command's --help (below), not the page
        text = own + (shared if set(param.opts) & shared_options() else "")
        for choice in map(str, param.type.choices):
            said = re.search(rf"(?<![\w-]){re.escape(choice)}(?![\w-])", text) is not None
            assert said, f"docs/commands.md, `{name(path)}`: {param.opts[0]} may be {choice!r}; not said"


@pytest.mark.parametrize(
    "path", sorted(p for p, c in COMMANDS_BY_PATH.items() if "--judge" in real_options(c)), ids=" ".join
)
def test_a_command_that_takes_a_judge_lists_its_family_in_help(path: CommandPath) -> None:
    """The judges are listed once, by the registry: in `--help` (a judge a line, with what it is),
    so a new judge is shown where it is registered and no page lists them by hand."""
    family = judges.CHECK_JUDGES if path == ("check",) else judges.JUDGES
    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for kind in family.kinds:
        assert re.search(rf"^\s+{re.escape(kind.spec)}\s+{re.escape(kind.summary)}$", result.output, re.M), (
            kind.spec
        )


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_triage_command_line_in_the_docs_is_real(page: Path) -> None:
    for owner, opt in mentions(parse(page), None):
        assert opt in real_options(COMMANDS_BY_PATH[owner]), f"{page.name}: `{name(owner)}` has no option {opt}"


# -- exit codes, settings, the relay --------------------------------------------------------------


def test_the_exit_code_table_matches_the_cli() -> None:
    rows = {row[0]: row[1] for row in table_rows(section(OPERATIONS, "Exit codes"))}
    assert sorted(rows) == [f"`{int(code)}`" for code in ExitCode]
    for code in ExitCode:
        assert rows[f"`{int(code)}`"] == code.label, f"exit {int(code)} is labelled {code.label!r} in the code"
    help_text = " ".join(CliRunner().invoke(cli, ["--help"]).output.split())
    for code in ExitCode:
        assert f"{int(code)} {code.label}" in help_text


def settings_variables() -> set[str]:
    """The environment variables `Settings` reads: a field's aliases, else its name (no prefix)."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    found: set[str] = set()
    for field_name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            found.update(c for c in alias.choices if isinstance(c, str))
        elif isinstance(alias, str):
            found.add(alias)
        elif isinstance(alias, AliasPath):
            raise AssertionError(f"Settings.{field_name}: an AliasPath names no variable")
        else:
            found.add(prefix + (field.alias or field_name))
    return {v.upper() for v in found}


def test_every_setting_is_in_the_settings_table() -> None:
    table = " ".join(" ".join(row) for row in table_rows(section(OPERATIONS, "Settings")))
    missing = sorted(v for v in settings_variables() if f"`{v}`" not in table)
    assert not missing, f"docs/operations.md, Settings: {missing} not described"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_variable_the_docs_name_is_read(page: Path) -> None:
    known = settings_variables()
    for match in ENV.finditer(page.read_text(encoding="utf-8")):
        variable = match.group(0)
        if variable.endswith("*"):
            assert any(k.startswith(variable[:-1]) for k in known), f"{page.name}: no setting is {variable}"
        elif variable in NOT_SETTINGS:
            assert variable in NOT_SETTINGS[variable].read_text(encoding="utf-8")
        else:
            assert variable in known, f"{page.name}: {variable} is no setting (triage/settings.py)"


def test_the_relay_status_table_is_the_statuses_it_declares() -> None:
    documented = [row[0] for row in table_rows(section(RELAY, "HTTP statuses"))]
    declared = [f"`{code}`" for code in sorted(STATUSES)]
    assert sorted(documented) == declared, f"docs/relay.md, HTTP statuses: {sorted(documented)}, declared {declared}"


def test_every_relay_key_is_documented() -> None:
    text = RELAY.read_text(encoding="utf-8")
    missing = sorted(key for key in RelayConfig.model_fields if f"`{key}`" not in text and f"{key} =" not in text)
    assert not missing, f"docs/relay.md: [relay] keys {missing} not described"
    for row in table_rows(section(RELAY, "Limits")):
        for key in re.findall(r"`(\w+)`", row[0]):
            assert key in RelayConfig.model_fields, f"docs/relay.md, Limits: [relay] has no key {key}"


# -- the README and the links ---------------------------------------------------------------------


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    size = len(README.read_bytes())
    assert size < README_LIMIT, f"README.md is {size} bytes: move detail to docs/"
    blocks = fence_blocks(parse(README), "sh")
    assert [b.strip() for b in blocks[:2]] == list(SETUP_COMMANDS)


def links(tokens: list[Token]) -> Iterator[str]:
    for token in tokens:
        for child in token.children or []:
            if child.type == "link_open":
                yield str(child.attrGet("href"))


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    for href in links(parse(page)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", href):
            continue
        target, _, fragment = href.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.name}: {href} points at nothing"
        if fragment and path.suffix == ".md":
            assert fragment in anchors(parse(path)), f"{page.name}: {href}: no such heading"


def code_spans(tokens: list[Token]) -> Iterator[str]:
    for token in tokens:
        for child in token.children or []:
            if child.type == "code_inline":
                yield child.content


REPO_PATH = re.compile(r"^(?:triage|tests|bench|scripts|evals|prompts|docs)/[\w./*-]*$")
#: a module or a name in one (`triage.relay.issue_token`), not a file (`triage.toml`)
DOTTED = re.compile(r"^triage(?:\.\w+)+$(?<!\.toml)(?<!\.sqlite)")


def importable(dotted: str) -> bool:
    """`triage.a.b.C`: the longest module prefix imports and holds the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_file_and_name_the_docs_cite_exists(page: Path) -> None:
    """A file moved or a class renamed leaves no `triage/old/path.py` or `triage.old.Name` behind."""
    for span in code_spans(parse(page)):
        if REPO_PATH.match(span):
            assert list(REPO.glob(span.rstrip("/"))), f"{page.name}: `{span}` is no file of the repository"
        elif DOTTED.match(span):
            assert importable(span), f"{page.name}: `{span}` cannot be imported"


# -- ARCHITECTURE.md: the rooms as the tree holds them ---------------------------------------------

MODULE = re.compile(r"^triage/[\w/]+\.py$")


def rooms(title: str) -> list[Token]:
    """The `### title` part of ARCHITECTURE.md's "The rooms"."""
    found = [body for heading, body in sections(section(ARCHITECTURE, "The rooms"), "h3") if heading == title]
    assert found, f"ARCHITECTURE.md, The rooms: no part {title!r}"
    return found[0]


def listed_modules(tokens: list[Token]) -> list[str]:
    """The module each list item names first (`triage/x.py`, its first code span)."""
    found: list[str] = []
    for i, token in enumerate(tokens):
        if token.type == "list_item_open":
            inline = next(t for t in tokens[i:] if t.type == "inline")
            spans = [c.content for c in inline.children or [] if c.type == "code_inline"]
            found.extend(spans[:1] if spans and MODULE.match(spans[0]) else [])
    return found


def test_every_package_has_its_row() -> None:
    listed = [re.sub(r"^`|`$", "", row[0]) for row in table_rows(rooms("Packages"))]
    assert sorted(listed) == sorted(set(listed)), "ARCHITECTURE.md: a package is listed twice"
    assert sorted(listed) == packages(), "ARCHITECTURE.md, Packages: one row per package of triage/, no other"


@pytest.mark.parametrize("module", sorted(modules()))
def test_every_module_names_its_subject_in_its_docstring(module: str) -> None:
    """The per-module table is `python -m tests.rooms`, read from the docstrings: each says its subject."""
    said = subject(module)
    assert said and len(said.split()) >= 3, f"{module}: the docstring's first sentence names no subject"


def test_every_module_past_the_soft_cap_is_argued_or_listed_to_split() -> None:
    over = sorted(m for m, n in modules().items() if n > SOFT_CAP)
    assert sorted(listed_modules(rooms(f"Over {SOFT_CAP} lines"))) == over


def test_every_module_under_the_floor_says_what_it_holds() -> None:
    under = sorted(m for m, n in modules().items() if n < FLOOR)
    assert sorted(listed_modules(rooms(f"Under {FLOOR} lines"))) == under


def test_every_import_contract_is_named_in_the_layers() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    text = " ".join(prose(section(ARCHITECTURE, "The layers")).split())
    for contract in contracts:
        name = " ".join(contract["name"].split())
        assert name in text, f"ARCHITECTURE.md, The layers: the contract {name!r} is not named"
