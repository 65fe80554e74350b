"""The synopses of docs/commands.md (`tests/docs_synopses.py`): every command of the click tree has
its generated block in its own section, each block is what the generator renders from the tree now,
no section or block names a command the tree lacks, and the rendering shows what click knows
(flags, value, default as click shows it, help) and nothing the terminal or the environment adds."""

from __future__ import annotations

import copy
from pathlib import Path

import click
import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from tests import docs_synopses as synopses
from triage.cli import cli

PAGE = synopses.COMMANDS_PAGE
ENTRIES = synopses.walk(cli)
STALE = f"docs/commands.md is stale: run `{synopses.WRITE_COMMAND}`"
_MD = MarkdownIt("commonmark").enable("table")


def page_text() -> str:
    return PAGE.read_text(encoding="utf-8")


def tree(**changes: click.Command | None) -> click.Group:
    """The root group with some commands replaced, added, or (None) removed."""
    commands = dict(cli.commands)
    for name, command in changes.items():
        if command is None:
            del commands[name]
        else:
            commands[name] = command
    return click.Group(
        "triage", commands=commands, params=list(cli.params), context_settings=dict(cli.context_settings)
    )


def with_options(command: click.Command, *options: click.Option) -> click.Command:
    changed = copy.copy(command)
    changed.params = [*command.params, *options]
    return changed


def entry_for(command: click.Command, name: str = "triage probe") -> synopses.Entry:
    """`command` as the tree would hold it under the root, `name` its full name."""
    group = tree(**{name.split()[-1]: command})
    return next(e for e in synopses.walk(group) if e.name == name)


# -- the page is current --------------------------------------------------------------------------


def test_the_page_is_what_the_generator_renders() -> None:
    text = page_text()
    result = synopses.update(text)
    assert not result.problems, result.problems
    assert result.text == text, STALE


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_command_has_its_current_block_in_its_own_section(entry: synopses.Entry) -> None:
    text = page_text()
    page = synopses.read_page(text)
    found = [b for b in page.blocks if b.name == entry.name]
    assert len(found) == 1, f"docs/commands.md: {len(found)} blocks for `{entry.name}`; {STALE}"
    home = page.section_at(found[0].start)
    assert home is not None and home.command == entry.name, (
        f"the block for `{entry.name}` is outside ## `{entry.name}`"
    )
    assert text.splitlines()[found[0].start : found[0].end] == synopses.render_block(entry), STALE


def test_no_section_or_block_names_an_unknown_command() -> None:
    page = synopses.read_page(page_text())
    known = {e.name for e in ENTRIES}
    assert [s.title for s in page.sections if s.command is not None and s.command not in known] == []
    assert [b.name for b in page.blocks if b.name not in known] == []


# -- the check can fail ---------------------------------------------------------------------------


def test_an_option_added_to_a_command_makes_its_block_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = click.Option(
        ["--extra-knob"], type=click.IntRange(1, 9), default=2, show_default=True, help="A knob."
    )
    root = tree(feedback=with_options(cli.commands["feedback"], extra))
    text = page_text()
    result = synopses.update(text, root)
    assert result.text != text
    row = "| `--extra-knob` | `INTEGER RANGE` (`1<=x<=9`) | `2` | A knob. |"
    assert row in synopses.blocks_by_name(result.text)["triage feedback"]
    old, new = text.splitlines(), result.text.splitlines()
    assert [line for line in new if line not in old] == [row], "only the block changes"
    # the command: the check prints the diff and exits 1, --write fixes the page, the check passes
    copy_ = tmp_path / "commands.md"
    copy_.write_text(text, encoding="utf-8")
    assert synopses.main([], root=root, page=copy_) == 1
    assert "+| `--extra-knob`" in capsys.readouterr().out
    assert copy_.read_text(encoding="utf-8") == text, "the check must not write"
    assert synopses.main(["--write"], root=root, page=copy_) == 0
    assert copy_.read_text(encoding="utf-8") == result.text
    assert synopses.main([], root=root, page=copy_) == 0


def test_a_changed_help_or_default_makes_the_block_stale() -> None:
    since = next(p for p in cli.commands["votes"].params if p.name == "since_hours")
    changed = copy.copy(since)
    changed.default = 24.0
    command = copy.copy(cli.commands["votes"])
    command.params = [changed if p is since else p for p in command.params]
    assert synopses.update(page_text(), tree(votes=command)).text != page_text()


def test_a_removed_command_leaves_a_section_that_fails() -> None:
    result = synopses.update(page_text(), tree(votes=None))
    assert any("'triage votes' is no command of the CLI" in p for p in result.problems), result.problems
    assert any("'triage votes', no command of the CLI" in p for p in result.problems), result.problems
    assert synopses.main([], root=tree(votes=None)) == 1


def test_a_block_outside_its_section_or_twice_fails() -> None:
    text = page_text()
    demo = "\n".join(synopses.blocks_by_name(text)["triage demo"])
    moved = text.replace("## `triage import`\n", f"## `triage import`\n\n{demo}\n", 1)
    assert any("outside its section" in p or "second block" in p for p in synopses.update(moved).problems)
    unterminated = text.replace(synopses.END_MARKER, "", 1)
    assert any("no end marker" in p for p in synopses.update(unterminated).problems)


def test_a_command_without_a_section_gets_one_where_the_tree_puts_it() -> None:
    build = click.Command("build", help="Build the index.", params=[click.Option(["--out"], help="Where.")])
    index = copy.copy(cli.commands["index"])
    assert isinstance(index, click.Group)
    index.commands = {**index.commands, "build": build}
    extra = click.Command("zzz", help="Last.")
    root = tree(index=index, zzz=extra)
    text = page_text()
    first = synopses.update(text, root)
    assert not first.problems
    lines = first.text.splitlines()
    # a new subcommand of `index` goes before the next command's section; a new last command at the end
    at = lines.index("## `triage index build`")
    assert lines[at + 2] == synopses.start_marker("triage index build")
    assert lines.index("## `triage index serve`") < at < lines.index("## `triage calibrate`")
    assert lines[-1] == synopses.END_MARKER and "## `triage zzz`" in lines
    assert synopses.update(first.text, root).text == first.text, "writing twice changes nothing more"


def test_a_section_without_its_block_gets_it_after_its_heading() -> None:
    text = page_text()
    block = "\n".join(synopses.blocks_by_name(text)["triage relay"])
    bare = text.replace(f"\n{block}\n", "", 1)
    assert bare != text
    assert synopses.update(bare).text == text


# -- what a block shows ---------------------------------------------------------------------------


def cell_text(inline: Token) -> str:
    """What a reader sees in a cell: its text and code, any other Markdown refused."""
    parts: list[str] = []
    for child in inline.children or []:
        assert child.type in ("text", "code_inline", "softbreak"), f"{child.type} in {inline.content!r}"
        parts.append(" " if child.type == "softbreak" else child.content)
    return "".join(parts)


def option_tables(block: list[str]) -> list[list[str]]:
    """The rows of the block's options table, each cell as a reader sees it."""
    tokens = _MD.parse("\n".join(block))
    header = [t.content for t in tokens if t.type == "inline"][: len(synopses.OPTION_COLUMNS)]
    if header != list(synopses.OPTION_COLUMNS):
        return []
    rows: list[list[str]] = []
    for token in tokens[tokens.index(next(t for t in tokens if t.type == "tbody_open")) :]:
        if token.type == "tbody_close":
            break
        if token.type == "tr_open":
            rows.append([])
        elif token.type == "inline":
            rows[-1].append(cell_text(token))
    return rows


def expected_rows(entry: synopses.Entry) -> list[list[str]]:
    """What click knows of each option, read straight off the objects (as `--help` would say it)."""
    rows = []
    help_option = entry.command.get_help_option(entry.ctx)
    for param in entry.command.get_params(entry.ctx):
        if not isinstance(param, click.Option) or param.hidden:
            continue
        extra = param.get_help_extra(entry.ctx)
        opts = entry.ctx.help_option_names if param is help_option else param.opts
        flags = " / ".join(", ".join(sorted(o, key=len)) for o in (opts, param.secondary_opts) if o)
        value = "" if param.is_flag else param.make_metavar(entry.ctx)
        if "range" in extra:
            value += f" ({extra['range']})"
        default = extra["default"] if "default" in extra else ""
        rows.append([flags, value, default, " ".join((param.help or "").split())])
    return rows


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_each_table_reads_back_as_click_knows_the_options(entry: synopses.Entry) -> None:
    assert option_tables(synopses.render_block(entry)) == expected_rows(entry)


def test_markdown_in_help_metavar_and_default_is_shown_as_it_is() -> None:
    nasty = "a | b `c` *d* _e_ [f](g) <UTC time> &amp; ~h~ \\i TRIAGE_X_* snake_case"
    command = click.Command(
        "probe",
        params=[
            click.Option(["--nasty"], metavar="A|B`C`", default="x|`y`", show_default=True, help=nasty),
            click.Option(["-n", "--name"], help="Line one\nline two.\n\n\b\nkept"),
        ],
    )
    entry = entry_for(command)
    rows = option_tables(synopses.render_block(entry))
    assert rows[0] == ["--nasty", "A|B`C`", "x|`y`", nasty]
    assert rows[1] == ["-n, --name", "TEXT", "", "Line one line two. kept"]


def test_defaults_are_shown_as_click_shows_them() -> None:
    command = click.Command(
        "probe",
        params=[
            click.Option(["--shown"], default=5, show_default=True),
            click.Option(["--hidden"], default="secret", show_default=False),
            click.Option(["--unsaid"], default="quiet"),
            click.Option(["--described"], default=1, show_default="one a day"),
            click.Option(["--on/--off"], default=False, show_default=True),
            click.Option(["--flag"], is_flag=True, default=False, show_default=True),
            click.Option(["--many"], multiple=True, default=("a", "b"), show_default=True),
            click.Option(["--need"], required=True, envvar="PROBE_NEED", show_envvar=True),
        ],
    )
    rows = {row[0]: row for row in option_tables(synopses.render_block(entry_for(command)))}
    assert rows["--shown"][2] == "5"
    assert rows["--hidden"][2] == "" and rows["--unsaid"][2] == ""
    assert rows["--described"][2] == "(one a day)"
    assert rows["--on / --off"][2] == "off"
    assert rows["--flag"][2] == ""
    assert rows["--many"][2] == "a, b"
    assert rows["--need"][3] == "[env var: PROBE_NEED; required]"


def test_the_terminal_and_the_environment_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    command = click.Command(
        "probe",
        params=[
            click.Option(
                ["--knob"], envvar="PROBE_KNOB", default="factory", show_default=True, help="x " * 60
            )
        ],
    )
    before = [synopses.render_block(e) for e in [*ENTRIES, entry_for(command)]]
    monkeypatch.setenv("COLUMNS", "20")
    monkeypatch.setenv("PROBE_KNOB", "from-the-environment")
    monkeypatch.setenv("TRIAGE_LOG_FORMAT", "json")
    monkeypatch.setenv("TRIAGE_CONFIG", "/nowhere.toml")
    after = [synopses.render_block(e) for e in [*ENTRIES, entry_for(command)]]
    assert after == before
    assert "from-the-environment" not in "\n".join(after[-1])


def test_the_help_option_is_named_as_its_context_names_it() -> None:
    """Click caches a command's help option with the names of the first context that asked: a bare
    context (as tests/test_docs.py builds one) must not turn `-h`, `--help` into `--help`."""
    command = click.Command("probe", params=[click.Option(["--knob"])])
    bare = click.Context(command, info_name="probe")
    assert [p.opts for p in command.get_params(bare)][-1] == ["--help"]
    rows = option_tables(synopses.render_block(entry_for(command)))
    assert rows[-1][:1] == ["-h, --help"]
