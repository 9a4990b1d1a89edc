"""The import structure of hot/, read from the source (AST, nothing imported): no module imports
another package's private name, and the packages import each other without a cycle.

A package is a directory under hot/ (hot.cli, hot.bench with its sub-packages, ...); the
modules directly in hot/ (its __init__, hot.recipes) form the package "hot". Imports inside
functions count: a lazy import is still a dependency.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "hot"


def _module(path: pathlib.Path) -> str:
    parts = ["hot", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return "hot" if len(parts) < 2 or (ROOT / parts[1]).is_file() or \
        (ROOT / f"{parts[1]}.py").is_file() else f"hot.{parts[1]}"


def _imports(path: pathlib.Path):
    """(imported module, names taken from it, line) for every import of a hot module."""
    mod = _module(path)
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "hot":
                    yield a.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "hot":
                continue
            names = tuple(a.name for a in node.names)
            yield target, names, node.lineno
            for n in names:  # "from . import reference": the sub-package is the dependency
                sub = ROOT.joinpath(*target.split(".")[1:], n)
                if sub.is_dir() or sub.with_suffix(".py").is_file():
                    yield f"{target}.{n}", (), node.lineno


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _scan():
    for path in sorted(ROOT.rglob("*.py")):
        yield path, _module(path), list(_imports(path))


def _module_aliases(path: pathlib.Path, imports) -> dict[str, str]:
    """Local names bound to hot modules: "from ..bench import study" binds study."""
    out = {}
    for target, names, _ in imports:
        for n in names:
            sub = ROOT.joinpath(*target.split(".")[1:], n)
            if sub.is_dir() or sub.with_suffix(".py").is_file():
                out[n] = f"{target}.{n}"
    return out


def private_imports() -> list[str]:
    """'file:line imports X' for each name or module with a leading underscore that a module
    takes from another package, by import or as an attribute of an imported module
    (``study._names``)."""
    out = set()
    for path, mod, imports in _scan():
        pkg = _package(mod)
        where = path.relative_to(ROOT.parent)
        for target, names, line in imports:
            for full in [target] + [f"{target}.{n}" for n in names]:
                parts = full.split(".")
                owner = _package(".".join(parts[:-1]) if full != target else full)
                if owner != pkg and any(_private(p) for p in parts[1:]):
                    out.add(f"{where}:{line} imports {full}")
        aliases = _module_aliases(path, imports)
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and _private(node.attr)
                    and _package(aliases[node.value.id]) != pkg):
                out.add(f"{where}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    return sorted(out)


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for _, mod, imports in _scan():
        pkg = _package(mod)
        graph.setdefault(pkg, set())
        for target, names, _ in imports:
            # "from hot import recipes" depends on the module hot.recipes, i.e. package "hot"
            dep = _package(target)
            if dep != pkg:
                graph[pkg].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every package that can reach itself, with one path back to it."""
    out = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    out.append(path + [start])
                    stack = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return out


def test_no_module_imports_another_packages_private_name():
    assert private_imports() == []


def test_packages_import_each_other_without_a_cycle():
    assert cycles(package_graph()) == []


def test_the_scan_finds_what_it_looks_for(tmp_path, monkeypatch):
    """The checks can fail: private names across packages, by import and by attribute, and a
    cycle between two packages."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b", "a"], ["b", "a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = package_graph()
    assert "hot.nn" in graph["hot.cli"] and "hot.common" in graph["hot.nn"]
    assert "hot.reference" in graph["hot"]  # from . import reference
    fake = tmp_path / "hot"
    for d in ("cli", "bench"):
        (fake / d).mkdir(parents=True)
        (fake / d / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "bench" / "study.py").write_text("def _names():\n    from ..cli.plots import _plt\n")
    (fake / "cli" / "plots.py").write_text("def _plt():\n    pass\n")
    (fake / "cli" / "compare.py").write_text("from ..bench import study\nstudy._names()\n")
    monkeypatch.setitem(globals(), "ROOT", fake)  # the scan reads the module's ROOT
    assert private_imports() == ["hot/bench/study.py:2 imports hot.cli.plots._plt",
                                 "hot/cli/compare.py:2 uses hot.bench.study._names"]
    assert cycles(package_graph()) == [["hot.bench", "hot.cli", "hot.bench"],
                                       ["hot.cli", "hot.bench", "hot.cli"]]
