"""The house rules of docs/architecture.md, checked on the source: no import cycle (imports inside functions
count), arrows one way between the layers, the model never imports the code that executes on hardware, and
modules a reader can hold."""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "iosim"

# lowest first; a module may import its own layer and the layers above it in this list, never one below
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", ["iosim._version", "iosim._resources", "iosim.units", "iosim.problem", "iosim.hardware",
                    "iosim.hardware.*", "iosim.blocks", "iosim.counts", "iosim.yaml_io"]),
    ("schedules", ["iosim.schedules", "iosim.schedules.*"]),
    ("interpreters", ["iosim.numeric", "iosim.numeric.*", "iosim.l2._common", "iosim.l2.trace"]),
    ("launch geometry", ["iosim.launch", "iosim.launch.*"]),
    ("cache model", ["iosim.l2", "iosim.l2.*"]),
    ("time", ["iosim.timing", "iosim.timing.*"]),
    ("simulate", ["iosim.result", "iosim.simulate", "iosim.simulate_cpu", "iosim.sweep", "iosim.validation"]),
    ("presentation", ["iosim.scenario", "iosim.scenario.*", "iosim.plots", "iosim.plots.*", "iosim.report",
                      "iosim.report.*"]),
    ("api", ["iosim"]),
    ("execute", ["iosim.gpu", "iosim.gpu.*", "iosim.measure", "iosim.measure.*", "iosim.cpu", "iosim.cpu.*",
                 "iosim.calibrate", "iosim.calibrate.*"]),
    ("cli", ["iosim.cli", "iosim.cli.*", "iosim.__main__"]),
]
MAX_MODULE_LINES = 400


def _modules() -> dict[str, Path]:
    return {".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): f
            for f in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """iosim modules that ``name`` imports anywhere in its source, inside functions too."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
            targets = subs if len(subs) == len(node.names) else [mod, *subs]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, f, modules) for m, f in modules.items()}


def _layer(module: str) -> int:
    for rank, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS here and to docs/architecture.md")


def test_the_package_has_no_import_cycle():
    graph = _graph()

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    in_cycle = sorted(m for m in graph if m in reaches(m))
    assert not in_cycle, f"modules in an import cycle: {in_cycle}"


def test_every_import_points_down_the_layers():
    wrong = [f"{m} ({LAYERS[_layer(m)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
             for m, targets in sorted(_graph().items()) for t in sorted(targets) if _layer(t) > _layer(m)]
    assert not wrong, "imports against the arrows:\n" + "\n".join(wrong)


def test_the_model_never_imports_what_executes_on_hardware():
    execute = next(i for i, (name, _) in enumerate(LAYERS) if name == "execute")
    for m, targets in _graph().items():
        if _layer(m) < execute:
            assert all(_layer(t) != execute for t in targets), f"{m} imports {targets}"


@pytest.mark.parametrize("module", sorted(_modules()))
def test_a_module_fits_in_one_sitting_or_says_why(module):
    path = _modules()[module]
    lines = path.read_text().count("\n")
    if lines > MAX_MODULE_LINES:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "longer" in doc.splitlines()[0] if doc else False, (
            f"{path.relative_to(PACKAGE.parent)} has {lines} lines (over {MAX_MODULE_LINES}): split it by concept, "
            "or say in the first line of its docstring why it is longer")


def test_the_layer_check_would_see_a_cycle_and_a_wrong_arrow(tmp_path):
    """The checks above can fail: a made-up pair of modules importing each other is a cycle and an upward arrow."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from iosim.simulate import simulate\n")
    b.write_text("def f():\n    from iosim.gpu import attention\n")
    modules = {"iosim.l2.model": a, "iosim.simulate": b, "iosim.gpu": b}
    assert _imports("iosim.l2.model", a, modules) == {"iosim.simulate"}
    assert _imports("iosim.simulate", b, modules) == {"iosim.gpu"}
    assert _layer("iosim.simulate") > _layer("iosim.l2.model")
