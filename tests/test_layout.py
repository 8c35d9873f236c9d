"""The package's layering, read from the source (every import, lazy ones inside functions included): the methods
never import the experiments built on them, and no two modules import each other, directly or through others."""

from __future__ import annotations

import ast
from pathlib import Path

import swarmlm

PACKAGE = Path(swarmlm.__file__).parent
METHOD_PACKAGES = ("runtime", "models", "tasks", "verify", "sapo", "noloco")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["swarmlm", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the swarmlm modules it imports (a name imported from a package counts as its submodule when
    there is one)."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(filter(None, (known(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = module if is_package else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}" if base else package
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    found = target if target in modules else known(base)
                    if found:
                        deps.add(found)
        deps.discard(module)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
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

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_lazy_imports():
    graph = import_graph()
    assert "swarmlm.sapo.engines.vllm" in graph["swarmlm.sapo.engines"]  # imported inside make_engine
    assert "swarmlm.noloco.pipeline.step" in graph["swarmlm.noloco.launch"]


def test_methods_never_import_experiments():
    offenders = {module: sorted(d for d in deps if d.startswith("swarmlm.experiments"))
                 for module, deps in import_graph().items()
                 if module.split(".")[1:2] and module.split(".")[1] in METHOD_PACKAGES}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_the_trust_boundary_is_one_package():
    """Task streams and prompts (``tasks``) read nothing untrusted: of ``verify`` they import only the allow-list,
    which imports nothing of swarmlm's; every scorer, worker and the verifier live in ``verify``."""
    graph = import_graph()
    from_tasks = {d for m, deps in graph.items() if m.startswith("swarmlm.tasks") for d in deps if d.startswith("swarmlm.verify")}
    assert from_tasks == {"swarmlm.verify.scorer_audit"}
    assert graph["swarmlm.verify.scorer_audit"] == set()
    assert not [m for m in graph if m.startswith("swarmlm.tasks") and any(w in m for w in ("scor", "verif", "hygiene"))]


def test_no_function_runs_over_80_lines():
    """Long bodies are split into named steps (docstrings and comments count)."""
    long = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long == []


def test_only_experiments_import_matplotlib():
    """matplotlib is the optional ``plots`` extra."""
    users = []
    for module, path in _modules().items():
        if not module.startswith("swarmlm.experiments"):
            tree = ast.parse(path.read_text())
            names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
            if any(name.split(".")[0] == "matplotlib" for name in names):
                users.append(module)
    assert users == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_a_cycle_would_be_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_name_imported_from_swarmlm_exists():
    """Every ``from swarmlm... import name`` in the source, lazy ones included, finds its name (a module moved or
    split would otherwise fail only when that code path runs, for instance in a node's subprocess)."""
    import importlib

    missing = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("swarmlm"):
                target = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(target, alias.name):
                        try:
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ImportError:
                            missing.append(f"{module}: from {node.module} import {alias.name}")
    assert missing == []


def test_the_noloco_loop_holds_no_measurement():
    """NoLoCo's replica loop does the method only: no timer, progress bar or metrics writer (those are its
    observer's, swarmlm.noloco.observer), no fault injection (swarmlm.noloco.faults); and its communicator offers
    only algorithmic calls, with time (swarmlm.noloco.comm.clock) and the spread measurement beside it."""
    from swarmlm.noloco.comm.base import Communicator

    graph = import_graph()
    replica = ast.parse(_modules()["swarmlm.noloco.replica"].read_text())
    stdlib = {alias.name for node in ast.walk(replica) if isinstance(node, ast.Import) for alias in node.names}
    assert not {"time", "os"} & stdlib
    assert not {"swarmlm.runtime.metrics"} & graph["swarmlm.noloco.replica"]
    assert "tqdm" not in _modules()["swarmlm.noloco.replica"].read_text()
    members = {name for name in vars(Communicator) if not name.startswith("_")}
    assert members == {"exchange", "all_reduce_mean_", "gather_objects", "agree_stop", "heartbeat", "finish"}


def test_the_sapo_node_holds_no_measurement():
    """A SAPO node does the method only: no timer and no metrics writer. Its hooks hear of each part of the round
    (swarmlm.sapo.hooks) and its observer (swarmlm.sapo.observer) times them, evaluates and writes the metrics."""
    graph = import_graph()
    node = ast.parse(_modules()["swarmlm.sapo.node"].read_text())
    stdlib = {alias.name for n in ast.walk(node) if isinstance(n, ast.Import) for alias in n.names}
    stdlib |= {n.module for n in ast.walk(node) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {"time"} & stdlib
    assert not {"swarmlm.runtime.metrics"} & graph["swarmlm.sapo.node"]
    assert "swarmlm.runtime.metrics" in graph["swarmlm.sapo.observer"]

