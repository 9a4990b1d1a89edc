"""pyproject.toml's extras cover every package the code imports: `pip install .` brings what
`import hot` needs, and each optional import is in the extra docs/cli.md names for it."""

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Import name -> (distribution, where it must be listed: "base" or the extra's name).
WHERE = {"torch": ("torch", "base"), "numpy": ("numpy", "base"),
         "tqdm": ("tqdm", "cli"), "matplotlib": ("matplotlib", "cli"), "PIL": ("pillow", "cli"),
         "timm": ("timm", "models"), "transformers": ("transformers", "models"),
         "peft": ("peft", "models"), "torchvision": ("torchvision", "models"),
         "triton": ("triton", "fast"), "torchao": ("torchao", "bench"),
         "pytest": ("pytest", "dev"), "hypothesis": ("hypothesis", "dev"),
         "safetensors": ("safetensors", "dev")}  # the HF tests read saved checkpoints


def third_party_imports(folder: Path) -> set:
    local = {p.stem for p in folder.rglob("*.py")} | {"hot"}
    names = set()
    for f in folder.rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Import):
                names |= {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                names.add(n.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in local}


def dist_names(reqs) -> set:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in reqs}


def listed(where: str) -> set:
    if where == "base":
        return dist_names(PROJECT["dependencies"])
    return dist_names(PROJECT["optional-dependencies"][where])


def test_every_import_of_the_package_is_a_dependency_or_in_its_extra():
    for name in third_party_imports(ROOT / "hot"):
        assert name in WHERE, f"hot imports {name}: add it to WHERE and to pyproject.toml"
        dist, where = WHERE[name]
        assert dist in listed(where), f"{dist} (imported as {name}) missing from {where}"


def test_dev_installs_everything_the_tests_import():
    dev = PROJECT["optional-dependencies"]["dev"]
    (self_ref,) = [r for r in dev if r.startswith(PROJECT["name"] + "[")]
    extras = set(self_ref.split("[", 1)[1].rstrip("]").split(","))
    have = listed("base") | listed("dev") | set().union(*(listed(e) for e in extras))
    for name in third_party_imports(ROOT / "tests") | third_party_imports(ROOT / "hot"):
        assert WHERE[name][0] in have, name
    assert {"pytest-xdist", "pytest-timeout"} <= listed("dev")  # -n 2, @pytest.mark.timeout


def test_the_console_script_is_the_cli_main():
    assert PROJECT["scripts"] == {"hot": "hot.cli.main:main"}
