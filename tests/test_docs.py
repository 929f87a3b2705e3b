"""The user's guide holds: every relative link in README.md and docs/ resolves (anchors included), every sweep file
named anywhere parses, and every command on docs/questions.md runs and prints what the page shows (its shape: the
first word of every line and every table's header, never timings)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import strategies
from experiments.cli.main import main
from experiments.config import sweep as sweep_mod
from strategies.transport.simgrid import simgrid_available

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "workloads" / "profiles" / "README.md"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
SWEEP_NAME = re.compile(r"experiments/config/sweeps/[A-Za-z0-9_.-]+\.toml")
# The 1,024-rank commands of question 4 run at 64 ranks here: the same table, in seconds instead of a minute.
SHORT_FORMS = {"--workers 1024": "--workers 64"}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold commands, not links
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link} (no {target})")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link} (no heading #{anchor} in {target.name})")
    assert not broken, f"{page.name}: {broken}"


def _named_sweeps() -> set[str]:
    places = [*PAGES, ROOT / "Makefile", *(ROOT / "experiments").rglob("*.py"), *(ROOT / "reports").rglob("*.py")]
    return {name for place in places for name in SWEEP_NAME.findall(place.read_text())}


def test_every_sweep_file_named_anywhere_exists_and_parses():
    named = _named_sweeps()
    assert "experiments/config/sweeps/quick.toml" in named  # the search finds what it should
    committed = {str(p.relative_to(ROOT)) for p in (ROOT / "experiments" / "config" / "sweeps").glob("*.toml")}
    missing = sorted(named - committed)
    assert not missing, f"named but not committed: {missing}"
    for name in sorted(named | committed):
        if "[simulate]" in (ROOT / name).read_text():  # a simulation sweep: `syncbench simulate` reads it
            from experiments.simulate.substrate import load as load_simulated

            assert load_simulated(ROOT / name)[1], name
        else:
            assert sweep_mod.load(ROOT / name).runs, name


# -- docs/questions.md -------------------------------------------------------------------------------------------

def _console_blocks(page: Path) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) for every `$ syncbench ...` line of the page's console blocks."""
    commands = []
    for block in re.findall(r"```console\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif commands:
                commands[-1][1].append(line)
    return commands


def _shape(lines: list[str], unshown: set[str]) -> list[list[str] | str]:
    """Each line's first word; a table's header line whole (its column names). Rows of strategies the page does
    not show are left out (plug-ins the tests register, strategies added since the page was made)."""
    shape = []
    for line in lines:
        words = line.split()
        if not words or words[0] in unshown:
            continue
        shape.append(words if words[0] == "strategy" else words[0])
    return shape


def test_questions_page_commands_run_and_print_what_the_page_shows(capsys, tmp_path, monkeypatch):
    commands = _console_blocks(ROOT / "docs" / "questions.md")
    assert len(commands) >= 6 and all(c.startswith("syncbench ") for c, _ in commands), commands
    (tmp_path / "experiments").symlink_to(ROOT / "experiments")  # the page's relative paths, outputs in tmp_path
    monkeypatch.chdir(tmp_path)
    ran = 0
    for command, shown in commands:
        if " simulate " in f" {command} " and simgrid_available():
            continue  # SimGrid's Python module is missing here (checked in CI, where .ci/run installs it)
        for long, short in SHORT_FORMS.items():
            command = command.replace(long, short)
        status = main(shlex.split(command)[1:])
        out, err = capsys.readouterr()
        assert status == 0, (command, err)
        unshown = set(strategies.names()) - {line.split()[0] for line in shown if line.split()}
        assert _shape(out.splitlines(), unshown) == _shape(shown, unshown), f"{command}\n--- printed\n{out}"
        ran += 1
    assert ran >= 4
