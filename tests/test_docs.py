"""The docs hold together: every relative link and `#anchor` in README.md and docs/*.md leads
somewhere, and the README stays a front door (short, with the two commands on its first screen).
No server: these read files only."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
#: The decision pages, linked from docs/decisions/README.md rather than from the README.
DECISIONS = sorted((REPO / "docs" / "decisions").glob("*.md"))

#: CI runs exactly this line (.ci/run: "the README's test command"); it must stay as written.
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/pytest"
#: The main job on embedded defaults, on a fresh machine.
DEV_COMMAND = "worker.py dev --once"
#: A front door, not the whole house: everything else lives in docs/.
README_MAX_LINES = 250
#: What a terminal shows before the reader scrolls.
FIRST_SCREEN = 40

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"`+[^`]*`+")
# Link text may wrap onto the next line; the target may not contain spaces.
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_LINK_TEXT = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def prose(text: str) -> str:
    """`text` without its fenced code blocks (a `# comment` in a shell block is no heading)."""
    kept: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub computes it: its text lowercased, punctuation dropped,
    spaces turned into hyphens."""
    text = _INLINE_LINK_TEXT.sub(r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor the headings of a Markdown text define (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose(text).splitlines():
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> Iterator[str]:
    """The target of every inline link outside code."""
    for match in _LINK.finditer(_CODE_SPAN.sub("", prose(text))):
        yield match.group(1)


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file does not exist, or whose `#anchor` no heading of
    the Markdown file it points to defines, as `target: why`."""
    broken: list[str] = []
    for target in links(page.read_text(encoding="utf-8")):
        if _SCHEME.match(target):
            continue  # http:, https:, mailto: are not ours to check offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text("utf-8")):
            broken.append(f"{target}: no heading in {dest.name} makes #{anchor}")
    return broken


class TestAnchors:
    def test_an_anchor_is_the_heading_lowercased_without_punctuation(self) -> None:
        """Backticks, colons and commas go; spaces become hyphens, hyphens stay."""
        heading = "Issue 11: cases 5 `orchestration`, 9 `backlog` and 10 `fleet`"
        assert slug(heading) == "issue-11-cases-5-orchestration-9-backlog-and-10-fleet"
        assert slug("The pass: `[pass]` limits") == "the-pass-pass-limits"
        assert slug("`python -m bench.run --cases x`") == "python--m-benchrun---cases-x"

    def test_repeated_headings_are_numbered_and_fenced_lines_are_no_headings(self) -> None:
        text = "# Top\n## Measured\n```sh\n# not a heading\n```\n## Measured\n"
        assert anchors(text) == {"top", "measured", "measured-1"}


class TestLinks:
    def test_a_broken_file_or_anchor_is_reported_and_a_good_one_is_not(
        self, tmp_path: Path
    ) -> None:
        """The checker itself: a link to a missing file, or to a heading that is not there,
        is caught, across a line break too; links inside code are not links."""
        (tmp_path / "other.md").write_text("# Other\n## A part\n", encoding="utf-8")
        page = tmp_path / "page.md"
        page.write_text(
            "# Page\n"
            "[fine](other.md#a-part) [self](#page) [web](https://example.com/x#y)\n"
            "[gone](missing.md) [wrong anchor](other.md#no-part) [wrapped\n"
            "text](#nowhere) `[in code](missing-too.md)`\n",
            encoding="utf-8",
        )
        assert [b.split(":")[0] for b in broken_links(page)] == [
            "missing.md",
            "other.md#no-part",
            "#nowhere",
        ]

    @pytest.mark.parametrize("page", [*PAGES, *DECISIONS], ids=lambda p: str(p.relative_to(REPO)))
    def test_every_relative_link_and_anchor_resolves(self, page: Path) -> None:
        assert broken_links(page) == []

    def test_every_docs_page_is_linked_from_the_readme(self) -> None:
        linked = {
            (README.parent / target.partition("#")[0]).resolve()
            for target in links(README.read_text(encoding="utf-8"))
        }
        assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


class TestReadme:
    def test_the_readme_is_a_front_door_of_at_most_250_lines(self) -> None:
        lines = README.read_text(encoding="utf-8").splitlines()
        assert len(lines) <= README_MAX_LINES

    def test_its_first_screen_gives_the_test_command_ci_runs_and_the_dev_command(self) -> None:
        first = README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN]
        assert TEST_COMMAND in (line.strip() for line in first)
        assert any(DEV_COMMAND in line for line in first)


def _map_rows() -> list[tuple[str, str]]:
    """README's map of the house: each row's first cell (its room) and second (what it does)."""
    text = README.read_text(encoding="utf-8")
    table = text.split("## A map of the house", 1)[1].split("\n\n", 2)[1]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    return [(row[0].lstrip("| "), row[1]) for row in rows]


def test_every_module_the_map_names_exists_and_every_module_is_on_the_map() -> None:
    """The map is read as the house: a room it names that is gone misleads, and a module it
    leaves out is one a newcomer never finds."""
    named: set[Path] = set()
    for room, does in _map_rows():
        folders = re.findall(r"`([\w/]+/)`", room)
        base = REPO / (folders[0] if folders else "")
        first = re.findall(r"`([\w/]+\.py)`", room)
        if first and "/" in first[0]:
            base = REPO / Path(first[0]).parent
        for name in re.findall(r"`([\w/.]+\.py)`", room + " " + does):
            path = REPO / name if "/" in name else base / name
            assert path.is_file(), f"README's map names {name} ({path.relative_to(REPO)}): gone"
            named.add(path)
    for package in ("activities", "activities/engine", "workflows", "purge_config", "purge_ops"):
        for module in sorted((REPO / package).glob("*.py")):
            if module.name != "__init__.py":
                assert module in named, f"{module.relative_to(REPO)} is not on README's map"


def test_the_in_process_run_tests_readme_offers_collects_every_module() -> None:
    """tests/README.md: `-p no:xdist` runs tests in this process, under a debugger. Every
    module must collect without xdist's plugin (its `xdist_group` marker, which
    --strict-markers would refuse unregistered, and no `-n` in the ini's options)."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "--collect-only", "-q", "-m", ""],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,  # a hang's bound only: importing the suite beside busy workers is slow
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-1000:]
