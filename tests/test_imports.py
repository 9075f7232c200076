"""No import circles in ``vta_ext`` and ``tvm_csp_embed`` (issue 20, part 5), and every module
imports on its own.

The graph is read from the source with :mod:`ast`: an edge ``a -> b`` for every ``import`` of a
module ``b`` of the two packages in ``a``, and to each package ``b`` passes through on the way
(importing ``p.q.r`` runs ``p/q/__init__``), except ``a``'s own ancestors (already being imported
when ``a`` runs). Module-level imports (also inside ``if`` / ``try`` / class bodies) make the
graph Python runs at import time; imports inside functions are added for the second check,
because a function-level import that only dodges a circle is the circle still.
"""
from __future__ import annotations

import ast
import functools
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from conftest import REPO

PACKAGES = ("vta_ext", "tvm_csp_embed")


def modules(root: Path, packages=PACKAGES) -> Dict[str, Tuple[Path, bool]]:
    """Dotted module name -> (file, is a package) for every ``.py`` file of ``packages``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _targets(module: str, is_package: bool, node, known) -> List[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module
    return [target] + [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]


@functools.lru_cache(maxsize=None)
def import_graph(root: Path, packages=PACKAGES) -> Tuple[Dict[str, Set[str]], Dict[str, Set[str]]]:
    """(module-level edges, function-level edges not also module-level) of ``packages``."""
    known = modules(root, packages)
    top: Dict[str, Set[str]] = {m: set() for m in known}
    lazy: Dict[str, Set[str]] = {m: set() for m in known}

    def walk(module, is_package, node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, is_package, child, known):
                    parts = target.split(".")
                    for i in range(1, len(parts) + 1):
                        dep = ".".join(parts[:i])
                        if dep in known and dep != module and not module.startswith(dep + "."):
                            (lazy if in_function else top)[module].add(dep)
            walk(module, is_package, child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    for module, (path, is_package) in known.items():
        walk(module, is_package, ast.parse(path.read_text()), False)
    return top, {m: lazy[m] - top[m] for m in known}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph, component) -> str:
    inside = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & inside))}" for m in component)


def test_the_checker_finds_a_circle_through_a_function_level_import(tmp_path):
    """The checks below can fail: a package with a circle closed inside a function is caught by the
    second graph and not by the first, one with a module-level circle by both."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .sub.b import f\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n")
    (pkg / "c.py").write_text("import pkg.d\n")
    (pkg / "d.py").write_text("from . import c\n")
    top, lazy = import_graph(tmp_path, ("pkg",))
    top, lazy = {m: set(e) for m, e in top.items()}, {m: set(e) for m, e in lazy.items()}
    assert top["pkg.a"] == {"pkg.sub", "pkg.sub.b"} and lazy["pkg.sub.b"] == {"pkg.a"}
    assert cycles(top) == [["pkg.c", "pkg.d"]]
    both = {m: top[m] | lazy[m] for m in top}
    assert sorted(cycles(both)) == [["pkg.a", "pkg.sub.b"], ["pkg.c", "pkg.d"]]


def test_the_graph_sees_the_real_imports():
    top, lazy = import_graph(REPO)
    assert "tvm_csp_embed.operators" in top["tvm_csp_embed.strategy"]
    assert "vta_ext" in top["tvm_csp_embed.strategy"]          # ``import vta_ext``
    assert "tvm_csp_embed.strategy" in top["tvm_csp_embed"]    # ``from . import strategy``
    assert "tvm_csp_embed.reference" in top["tvm_csp_embed.tune.measure"]


def test_no_import_circle_at_module_level():
    top, _ = import_graph(REPO)
    found = cycles(top)
    assert not found, "import circles: " + " | ".join(_describe(top, c) for c in found)


def test_no_import_circle_through_function_level_imports():
    """A function-level import inside the two packages must not close a circle either."""
    top, lazy = import_graph(REPO)
    both = {m: top[m] | lazy[m] for m in top}
    found = cycles(both)
    assert not found, ("import circles closed by function-level imports: "
                       + " | ".join(_describe(both, c) for c in found))


CHILD = textwrap.dedent("""
    import importlib, os, sys, traceback
    import numpy, tvm, tvm.relax  # third-party, shared by the forks; none of the two packages
    assert not any(m.split(".")[0] in {packages!r} for m in sys.modules)
    failed = []
    for name in sys.argv[1:]:
        pid = os.fork()
        if pid == 0:
            try:
                importlib.import_module(name)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status:
            failed.append(name)
    print("FAILED", " ".join(failed))
""").format(packages=set(PACKAGES))


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    """Each module imported first, in a new process whose only imports are numpy and tvm (a fork
    per module of one interpreter that has loaded them): no module relies on another having been
    imported before it."""
    names = sorted(m for m in modules(REPO) if not m.endswith(".__main__"))  # ``-m`` entry points
    proc = subprocess.run([sys.executable, "-c", CHILD, *names], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = proc.stdout.strip().splitlines()[-1].split()[1:]
    assert not failed, f"modules that fail to import alone: {failed}\n{proc.stderr[-3000:]}"


def imports_of_package(path: Path, package: str) -> List[Tuple[int, str]]:
    """``(line, imported module)`` of every ``import``/``from ... import`` of ``package`` (or a
    module of it) in the file ``path``, at any depth (also inside functions); relative imports
    stay in their own package and are not counted."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, n) for n in names if n == package or n.startswith(package + ".")]
    return found


def test_the_import_scan_finds_function_level_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\nfrom . import tvm_csp_embed\ndef f():\n"
                      "    from tvm_csp_embed.tune import x\n    import tvm_csp_embed as t\n")
    assert imports_of_package(source, "tvm_csp_embed") == [(4, "tvm_csp_embed.tune"),
                                                           (5, "tvm_csp_embed")]


def test_vta_ext_never_imports_its_plugin_tvm_csp_embed():
    """The lower package finds ``tvm_csp_embed`` through entry points (``vta_ext/plugins.py``),
    never by an import (issue 30, item 1)."""
    found = [f"{path.relative_to(REPO)}:{line} imports {name}"
             for path, _ in modules(REPO, ("vta_ext",)).values()
             for line, name in imports_of_package(path, "tvm_csp_embed")]
    assert not found, ("vta_ext imports tvm_csp_embed (load it as a plugin through "
                       "vta_ext.plugins instead): " + "; ".join(found))
