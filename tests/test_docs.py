"""The project's docs stand on their own: nothing points outside the repository."""
from __future__ import annotations

import re

from tests.conftest import REPO

# Files a reader of this repository does not have: the team's design brief and notes.
OUTSIDE = re.compile(r"DESIGN\.md|NOTES-[a-z]+\.md|\bshared/|\.\./|design brief")
TEXT = ("*.md", "*.py", "*.yaml", "*.toml", "*.c", "Makefile", "*.sh", "*.html")


def _files():
    for pattern in TEXT:
        for path in REPO.rglob(pattern):
            parts = path.relative_to(REPO).parts
            if parts[0].startswith(".") or parts[0] in ("results", "build") or "egg-info" in str(path):
                continue
            if path.name == "test_docs.py":
                continue
            yield path


def test_nothing_points_outside_the_repository():
    found = []
    for path in _files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_every_doc_the_readme_links_exists():
    readme = (REPO / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)", readme):
        assert (REPO / target).exists(), target
