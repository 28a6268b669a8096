"""How the installed package's modules depend on each other: no import cycles, the engine below the models
and their reports, models and experiments found through ``pipeline.registry`` alone, and no module that
registers anything when it is imported."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import pkgutil
import subprocess
import sys
from functools import lru_cache

import pytest

from buffet.pipeline import registry

PACKAGES = ("buffet.pipeline", "buffet.kernels", "buffet.data")
ENGINE = "buffet.pipeline.engine"
ABOVE_THE_ENGINE = ("buffet.pipeline.reports", "buffet.pipeline.models")


@lru_cache(maxsize=1)
def package_modules() -> dict[str, str]:
    """Every module of the installed packages, by name, with its source file."""
    found = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        found[package] = spec.origin
        for info in pkgutil.walk_packages(spec.submodule_search_locations, f"{package}."):
            origin = importlib.util.find_spec(info.name).origin
            if origin.endswith(".py"):
                found[info.name] = origin
    return found


def imported_names(node: ast.stmt, module: str, is_package: bool) -> list[str]:
    """The absolute names an import statement loads (``from X import a`` loads ``X.a`` when it is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parent = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            parent = parent.rpartition(".")[0]
        base = f"{parent}.{base}" if base else parent
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in package_modules() else base for alias in node.names]


def module_level_imports(module: str, path: str) -> set[str]:
    """The package modules ``module`` imports outside functions and classes (in ``if`` and ``try`` blocks too,
    ``if TYPE_CHECKING:`` included)."""
    with open(path, encoding="utf-8") as source:
        body = list(ast.parse(source.read(), path).body)
    names: set[str] = set()
    while body:
        node = body.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(imported_names(node, module, path.endswith("__init__.py")))
        elif isinstance(node, (ast.If, ast.Try)):
            body += node.body + node.orelse + getattr(node, "finalbody", [])
            body += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
    return names & set(package_modules())


@lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    return {module: module_level_imports(module, path) for module, path in package_modules().items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the list of its modules (the first repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once every path from it is checked
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_walk_finds_every_package_and_the_reader_sees_relative_and_conditional_imports(tmp_path):
    modules = package_modules()
    for name in ("buffet.pipeline.cli", "buffet.pipeline.engine.loop", "buffet.pipeline.reports.bnmf",
                 "buffet.kernels.bnmf", "buffet.data.store", "buffet.pipeline.registry"):
        assert name in modules
    source = tmp_path / "runs.py"
    source.write_text("from . import loop\nfrom .engine import Engine\nimport numpy\nif TYPE_CHECKING:\n"
                      "    from ..registry import MODELS\ndef later():\n    import buffet.pipeline.cli\n")
    assert module_level_imports("buffet.pipeline.engine.runs", str(source)) == {
        "buffet.pipeline.engine.loop", "buffet.pipeline.engine.engine", "buffet.pipeline.registry"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_module_of_the_package_imports_itself_back():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_engine_imports_no_model_and_no_report():
    """Statically (every module-level import, followed through other packages) and in a fresh interpreter."""
    graph = import_graph()
    for module in (m for m in graph if m == ENGINE or m.startswith(f"{ENGINE}.")):
        above = sorted(m for m in reachable(graph, module) if m.startswith(ABOVE_THE_ENGINE))
        assert not above, f"{module} imports {above}"
    engine_modules = sorted(m for m in graph if m.startswith(f"{ENGINE}."))
    code = (f"import importlib, json, sys\nfor m in {engine_modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({ABOVE_THE_ENGINE!r}))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout)
    assert loaded == []


# Run in a fresh interpreter: for each module, the module-level dicts, lists and sets of every buffet module
# loaded before it, as they read before and after importing it; the names of the modules it changed.
SIDE_EFFECTS = """
import importlib, json, sys
import buffet.pipeline.registry

def containers():
    return {(name, key): repr(value) for name, module in list(sys.modules.items()) if name.startswith("buffet")
            for key, value in vars(module).items() if isinstance(value, (dict, list, set))}

changed = {}
for name in sys.argv[1:]:
    before = containers()
    importlib.import_module(name)
    after = containers()
    changed[name] = sorted(f"{m}.{k}" for (m, k), text in before.items() if after[(m, k)] != text)
print(json.dumps(changed))
"""


def test_importing_a_report_or_experiment_module_registers_nothing():
    """Importing the reports package loads none of its modules, and importing any report or experiment module
    changes nothing in a module loaded before it (the registry's tables included)."""
    modules = sorted(m for m in package_modules() if m.startswith(("buffet.pipeline.reports.",
                                                                    "buffet.pipeline.experiments.")))
    code = ("import json, sys, buffet.pipeline.reports\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('buffet.pipeline.reports.'))))")
    assert json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                     check=True).stdout) == []
    out = subprocess.run([sys.executable, "-c", SIDE_EFFECTS, *modules], capture_output=True, text=True, check=True)
    changed = json.loads(out.stdout)
    assert set(changed) == set(modules) and "buffet.pipeline.reports.bnmf" in changed
    assert {name: touched for name, touched in changed.items() if touched} == {}


def test_the_side_effect_check_sees_a_registration(tmp_path):
    """The check above names the table a module adds to when it is imported."""
    (tmp_path / "buffet_table.py").write_text("TABLE = {}\n")
    (tmp_path / "buffet_plugin.py").write_text("import buffet_table\nbuffet_table.TABLE['plugin'] = 1\n")
    out = subprocess.run([sys.executable, "-c", SIDE_EFFECTS, "buffet_table", "buffet_plugin"], cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"buffet_table": [], "buffet_plugin": ["buffet_table.TABLE"]}


@pytest.mark.parametrize("name", sorted(registry.MODELS))
def test_every_model_name_leads_to_its_spec(name):
    module = importlib.import_module(registry.MODELS[name])
    assert registry.spec_for(name) is module.SPECS[name]
    assert all(registry.MODELS.get(other) == registry.MODELS[name] for other in module.SPECS), sorted(module.SPECS)


def test_every_experiment_name_leads_to_its_function():
    for name, entry in registry.EXPERIMENTS.items():
        assert callable(entry.load()), name
