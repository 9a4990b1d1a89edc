"""The documents against the code: the recipes table of docs/api.md is the registry's, and every
relative link in README.md and docs/*.md, and every path under benchmarks/ or scripts/ they name
(a script to run, a record a figure comes from), points to a file of the repository."""

import pathlib
import re

from hot import recipes

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A repository path in running text or backticks: it starts a word and ends before punctuation
# that closes a sentence; "*" is a glob over a record's files. A path after "COMMIT:" names a file
# that git keeps at that commit (a record or probe no longer in the tree), not one to check here.
NAMED = re.compile(r"(?<![\w./:-])((?:benchmarks|scripts)/[\w./*-]*[\w*/])")


def relative_links(text: str) -> list[str]:
    """The targets of markdown links that are paths in the repository (no scheme, no anchor
    only), without their #anchor."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#")[0])
    return out


def named_paths(text: str) -> list[str]:
    """The paths under benchmarks/ or scripts/ that a document names, links or not."""
    return NAMED.findall(text)


def exists(path: str) -> bool:
    """A named path exists; one with "*" matches at least one file."""
    return any(REPO.glob(path)) if "*" in path else (REPO / path).exists()


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


def test_every_named_benchmark_or_script_path_exists():
    missing = [f"{doc.relative_to(REPO)} -> {p}" for doc in DOCS
               for p in named_paths(doc.read_text()) if not exists(p)]
    assert missing == []


def test_named_paths_are_found_and_checked():
    text = ("Run `python benchmarks/step_floor.py R.json` (benchmarks/results/current_h100/). "
            "See benchmarks/results/x_*.log, scripts/gpu_run.sh; not mybenchmarks/a.py, "
            "nor the record 1a2b3c4:benchmarks/results/old.log.")
    assert named_paths(text) == ["benchmarks/step_floor.py", "benchmarks/results/current_h100/",
                                 "benchmarks/results/x_*.log", "scripts/gpu_run.sh"]
    assert exists("benchmarks/step_floor.py") and exists("benchmarks/results/current_h100/*.txt")
    assert not exists("benchmarks/no_such_probe.py") and not exists("benchmarks/results/*.none")
