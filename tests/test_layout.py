"""The layout keeps its promises: no import cycles, and the library core never imports
its tools, its test support or the Keras-facing adapter."""

from __future__ import annotations

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parents[1] / "dali_loader"
APART = ("dali_loader.tools",)
# The test support's import names (tests/ on sys.path): never imported by what ships.
TEST_SUPPORT = ("support", "helpers", "conftest", "tests")


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the dali_loader/tf_adapter modules it imports (anywhere in the file)."""
    modules = {_module(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules or t.startswith("tf_adapter")}
        graph[name] = deps - {name}
    return graph


def _top_level_imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_shipped_packages_never_import_test_support():
    """Nothing in the wheel (dali_loader/, tf_adapter/) imports tests/support or the tests'
    helpers, and no test fixture lives in the package (it moved to tests/support/)."""
    shipped = [*PKG.rglob("*.py"), *(PKG.parent / "tf_adapter").rglob("*.py")]
    bad = {str(p.relative_to(PKG.parent)): sorted(_top_level_imports(p) & set(TEST_SUPPORT))
           for p in shipped}
    assert {p: d for p, d in bad.items() if d} == {}
    assert not (PKG / "testing").exists()
    assert {"fakegcs.py", "slowfuse.py", "png_corpus.py"} <= {
        p.name for p in (PKG.parent / "tests" / "support").glob("*.py")}


def test_core_never_imports_tools_testing_or_the_adapter():
    bad = {m: sorted(d for d in deps if d.startswith(APART + ("tf_adapter",)))
           for m, deps in import_graph().items() if not m.startswith(APART)}
    assert {m: d for m, d in bad.items() if d} == {}


def test_no_import_cycles():
    graph = import_graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if d not in graph:
                continue
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_formats_import_nothing_above_them():
    """formats/ is the bottom layer: it reads bytes for storage, feed and decode, and
    imports nothing of theirs (nor of the plan, tfdata or the tools)."""
    up = {m: sorted(d for d in deps if not d.startswith("dali_loader.formats"))
          for m, deps in import_graph().items() if m.startswith("dali_loader.formats")}
    assert len(up) >= 6 and {m: d for m, d in up.items() if d} == {}
