"""No module of ours imports one that imports it back.

The graph is read from the source (every `import` and `from ... import`, also those under
`if TYPE_CHECKING:` and inside functions), so a cycle that only a type checker would follow
counts too. Packages install as maxq_raft.* from three folders (pyproject's package-dir).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"maxq_raft": ROOT / "maxq_raft", "maxq_raft.amqp": ROOT / "amqp", "maxq_raft.storage": ROOT / "storage"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph = {}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:  # `from . import x` names a module; `from .m import x` a name in m
                    targets.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in mods else module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {target for target in targets if target in mods and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_is_read():
    graph = import_graph()
    assert "maxq_raft.server.channel_state" in graph["maxq_raft.server.channel"]
    assert "maxq_raft.server.channel" in graph["maxq_raft.server.session"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_channel_does_not_load_session_and_channel_state_loads_no_trio():
    code = (
        "import sys, maxq_raft.server.channel_state as s; assert 'trio' not in sys.modules, 'trio'; "
        "import maxq_raft.server.channel; assert 'maxq_raft.server.session' not in sys.modules, 'session'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
