"""The documents against the code: the recipes table of docs/api.md is the registry's, and every
relative link in README.md and docs/*.md points to a file of the repository."""

import pathlib
import re

from hot import recipes

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(text: str) -> list[str]:
    """The targets of markdown links that are paths in the repository (no scheme, no anchor
    only), without their #anchor."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#")[0])
    return out


def test_recipes_table_is_the_registry():
    text = (REPO / "docs/api.md").read_text()
    m = re.search(r"<!-- recipes table:[^>]*-->\n(.*?)\n<!-- end of recipes table -->", text,
                  re.S)
    assert m, "docs/api.md has no recipes table between its markers"
    assert m.group(1) == recipes.markdown(), "regenerate it with hot.recipes.markdown()"


def test_every_relative_link_points_to_a_file():
    missing = [f"{doc.relative_to(REPO)} -> {t}" for doc in DOCS
               for t in relative_links(doc.read_text()) if not (doc.parent / t).exists()]
    assert missing == []


def test_links_are_found_and_external_ones_skipped():
    text = "[a](docs/api.md) [b](https://x.org/y.md) [c](#top) [d](../x.md#part)"
    assert relative_links(text) == ["docs/api.md", "../x.md"]
