"""``docs/results.md`` holds today's figures only (issue 30, item 4): the headline table, then a
short section per topic with its command and date; how figures moved lives in
``docs/history.md`` and in git."""
from __future__ import annotations

import re

from conftest import REPO

#: the most lines docs/results.md may grow to before its narrative must move to docs/history.md
RESULTS_MAX_LINES = 500


def test_results_stay_short():
    lines = (REPO / "docs" / "results.md").read_text().splitlines()
    assert len(lines) <= RESULTS_MAX_LINES, (
        f"docs/results.md has {len(lines)} lines (at most {RESULTS_MAX_LINES}): keep today's "
        "figures with their commands there and move how they moved to docs/history.md")


def test_results_open_with_the_headline_table_and_every_section_has_a_command():
    text = (REPO / "docs" / "results.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert sections[0].startswith("Headline figures\n")
    assert "| figure | value | command | date |" in sections[0]
    for section in sections[1:]:
        title = section.splitlines()[0]
        assert ".venv/bin/python" in section or "scripts/" in section, (
            f"docs/results.md section {title!r} has no command")


def test_results_links_point_at_their_headings():
    text = (REPO / "docs" / "results.md").read_text()
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    for link in re.findall(r"\]\(#([^)]+)\)", text):
        assert link in anchors, f"docs/results.md links to #{link}, which no heading makes"
