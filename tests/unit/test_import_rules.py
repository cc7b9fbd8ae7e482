"""Two rules of the import graph that import-linter's contracts do not state in general (issue 27 item 4;
CONTRIBUTING.md#gates): no import cycles among the modules of broker/, worker/ and minicluster/, and no private
name (a leading underscore) taken from another module. The contracts in pyproject.toml keep each cycle that was
broken broken; this finds a new one wherever it appears.
"""
from __future__ import annotations

import ast
from pathlib import Path

import grimp
import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "worker", "minicluster")
# None left (the last, execution<->window, went when the window got its dependencies passed in).
KNOWN_CYCLES: list[set[str]] = []


def import_cycles() -> list[set[str]]:
    """Each group of modules that import one another (through any chain), a package importing its own
    submodules (an __init__ re-exporting them) not counted."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    imports = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if not imported.startswith(module + "."):
                imports.add_edge(module, imported)
    return [group for group in nx.strongly_connected_components(imports) if len(group) > 1]


def private_imports(source: str, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """`from other import _name` and `other._name` in `source` (module `module`), where `other` is one of
    `modules` other than `module` itself."""
    package = module if is_package else module.rpartition(".")[0]
    names: dict[str, str] = {}  # a local name -> the project module it is bound to
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    names[alias.asname or alias.name] = full
                elif alias.name.startswith("_") and base in modules and base != module:
                    found.append(f"{module}:{node.lineno}: from {base} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname:
                    names[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in names:
                target = ".".join([names[value.id], *reversed(chain)])
                if target in modules and target != module:
                    found.append(f"{module}:{node.lineno}: {target}.{node.attr}")
    return found


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def test_no_import_cycles_but_the_known_one() -> None:
    cycles = import_cycles()
    assert [c for c in cycles if c not in KNOWN_CYCLES] == []


def test_no_private_name_is_imported_across_modules() -> None:
    modules = project_modules()
    found = []
    for module, path in sorted(modules.items()):
        found += private_imports(path.read_text(), module, path.name == "__init__.py", set(modules))
    assert found == []


def test_the_checks_find_what_main_had() -> None:
    modules = {"broker.api.ops", "broker.api.flowops", "broker.sched", "broker.sched.queue", "broker.sched.cycle"}
    assert private_imports("from broker.api.ops import _readable, op\n", "broker.api.flowops", False, modules) == [
        "broker.api.flowops:1: from broker.api.ops import _readable"]
    assert private_imports("from .queue import Scheduler, _Pending\n", "broker.sched.cycle", False, modules) == [
        "broker.sched.cycle:1: from broker.sched.queue import _Pending"]
    assert private_imports("from broker.api import ops\nops._then(1)\n", "broker.api.flowops", False, modules) == [
        "broker.api.flowops:2: broker.api.ops._then"]
    # Its own private names, and a private attribute of an object, are a module's own business.
    assert private_imports("def _f(): pass\n_f()\nself._x = 1\n", "broker.api.ops", False, modules) == []
