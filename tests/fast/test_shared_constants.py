"""Facts that C++ (csrc/) and Python (hot/fast/) must state alike, read from both as text: the
scale padding, the fields of a native pass plan, and the fix-up's program count (whose twin is
in docs/kernels.md). Nothing is compiled or imported, so this runs wherever the sources are."""

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]


def _py_constant(path: str, name: str) -> int:
    """The value of the module-level ``name = <int expression>`` in ``path``."""
    for node in ast.parse((REPO / path).read_text()).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets
                                             if isinstance(t, ast.Name)] == [name]:
            return eval(compile(ast.Expression(node.value), path, "eval"), {})  # int literals
    raise AssertionError(f"{path} assigns no {name}")


def _namedtuple_fields(path: str, cls: str) -> list[str]:
    for node in ast.parse((REPO / path).read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)]
    raise AssertionError(f"{path} defines no class {cls}")


def _cpp_enum(path: str, name: str) -> list[str]:
    m = re.search(r"enum\s+" + name + r"\s*\{([^}]*)\}", (REPO / path).read_text())
    assert m, f"{path} defines no enum {name}"
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


def _snake(cpp_name: str) -> str:
    """kHqSPad -> hq_spad: the C++ enumerator's name as the Python field's."""
    words = re.findall(r"[A-Z][a-z0-9]*", cpp_name[1:])
    out = []
    for w in words:  # single capitals run together (kNBlk -> nblk, kLR -> lr, kHqSPad -> spad)
        if out and len(out[-1]) == 1 and out[-1].isupper():
            out[-1] += w
        else:
            out.append(w)
    return "_".join(out).lower()


def test_scale_pad_is_the_same_in_python_and_cpp():
    cpp = re.search(r"constexpr\s+int64_t\s+kScalePad\s*=\s*(\d+)\s*;",
                    (REPO / "csrc/binding.cpp").read_text())
    assert cpp, "csrc/binding.cpp states no kScalePad"
    assert _py_constant("hot/fast/passes.py", "SCALE_PAD") == int(cpp.group(1))


def test_native_plan_fields_follow_the_cpp_pass_field_enum():
    enum = _cpp_enum("csrc/binding.cpp", "PassField")
    assert enum[-1] == "kPassFields"  # the count, not a field
    fields = [f.lower().replace("_", "") for f in _namedtuple_fields("hot/fast/native.py",
                                                                     "NativePlan")]
    assert fields == [_snake(e).replace("_", "") for e in enum[:-1]]


def test_snake_reads_the_enumerators():
    assert [_snake(n) for n in ("kStatsId", "kHqSPad", "kNBlk", "kLR", "kC16")] == \
        ["stats_id", "hq_spad", "nblk", "lr", "c16"]


def test_fixup_program_count_is_the_one_docs_kernels_states():
    n = _py_constant("hot/fast/passes.py", "FIXUP_PROGRAMS")
    doc = re.search(r"G about (\d+) /", (REPO / "docs/kernels.md").read_text())
    assert doc, "docs/kernels.md no longer states the fix-up's program count"
    assert int(doc.group(1)) == n
    assert "-FIXUP_PROGRAMS //" in (REPO / "hot/fast/passes.py").read_text()  # the plan uses it
