"""The package layout is the architecture: imports point inwards, and the engine is pure.

Every import counts, at module level or inside a function (a lazy import is still a
dependency). ``runtime`` is the pure Run state machine (no files, sockets, clocks, threads or
randomness: the executor and the store are its edges); the layers around it never import
the layers around them.
"""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(__file__).resolve().parents[2] / "intloom"

# What the pure engine may import: data modelling, nothing that touches the world.
PURE_STDLIB = {"__future__", "typing", "collections", "dataclasses", "enum", "functools"}
PURE_THIRD_PARTY = {"msgspec"}

# Layer -> intloom packages it may import (besides itself). Nothing inner reaches out to the
# outer layers (host, client, cli, diagnostics), and those import each other one way.
INWARD = {
    "runtime": {"errors"},
    "store": {"errors", "fsutil", "runtime"},
    "protocol": {"errors", "runtime"},
    "authoring": {"errors", "project", "runtime"},
    "executor": {"errors", "runtime", "authoring", "protocol"},
}
# The CLI is a thin adapter over the client: it never drives a host, a store or an executor
# itself.
CLI_NEVER = {"host", "executor", "store"}


def _is_part(name: str) -> bool:
    return (PACKAGE / name / "__init__.py").exists() or (PACKAGE / f"{name}.py").exists()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports; ``from intloom import X`` counts as ``intloom.X`` when X
    is a part of the package, as the package root (``intloom``) otherwise."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: intloom uses absolute imports only"
            if node.module == "intloom":
                found.update(f"intloom.{alias.name}" if _is_part(alias.name) else "intloom"
                             for alias in node.names)
            elif node.module:
                found.add(node.module)
    return found


def _modules(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


def _intloom_layer(name: str) -> str | None:
    """``intloom.host.daemon`` -> ``host``; the package root -> ``intloom``; others None."""
    parts = name.split(".")
    if parts[0] != "intloom":
        return None
    return parts[1] if len(parts) > 1 else "intloom"


def test_the_engine_imports_nothing_that_touches_the_world() -> None:
    offending: dict[str, list[str]] = {}
    for path in _modules("runtime"):
        for name in _imports(path):
            top = name.split(".")[0]
            layer = _intloom_layer(name)
            allowed = (top in PURE_STDLIB or top in PURE_THIRD_PARTY
                       or layer in ("runtime", "errors"))
            if not allowed:
                offending.setdefault(path.name, []).append(name)
    assert offending == {}, f"intloom/runtime must stay pure: {offending}"


@pytest.mark.parametrize("layer", sorted(INWARD))
def test_inner_layers_never_import_outer_ones(layer: str) -> None:
    offending: dict[str, list[str]] = {}
    for path in _modules(layer):
        for name in _imports(path):
            target = _intloom_layer(name)
            if target is not None and target != layer and target not in INWARD[layer]:
                offending.setdefault(str(path.relative_to(PACKAGE)), []).append(name)
    assert offending == {}, f"intloom/{layer} may import only {sorted(INWARD[layer])}"


def test_the_cli_is_a_thin_adapter_over_the_client() -> None:
    offending = {
        str(path.relative_to(PACKAGE)): sorted(hits)
        for path in _modules("cli")
        if (hits := {n for n in _imports(path) if _intloom_layer(n) in CLI_NEVER})
    }
    assert offending == {}, "the CLI goes through intloom.client (and diagnostics)"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in ``graph`` (its first node repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if found := visit(target):
                return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if found := visit(node):
            return found
    return None


def test_no_two_layers_import_each_other() -> None:
    """Not even lazily: a cycle between layers (client <-> diagnostics, say) means one of
    them holds something both need, which belongs in the lower one."""
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        layer = "intloom" if layer == "__init__" else layer
        for name in _imports(path):
            target = _intloom_layer(name)
            if target is not None and target != layer:
                graph.setdefault(layer, set()).add(target)
                where.setdefault((layer, target), set()).add(str(path.relative_to(PACKAGE)))
    assert "host" in graph["client"]  # a lazy import (client.lifecycle starts a host) is seen
    cycle = _cycle(graph)
    assert cycle is None, "layers import each other: " + "; ".join(
        f"{a} -> {b} ({', '.join(sorted(where[a, b]))})" for a, b in pairwise(cycle or []))


def test_every_form_of_import_is_seen(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import intloom.errors\n"
        "from intloom import __version__, store\n"
        "def later():\n"
        "    from intloom.host.daemon import Host\n"
    )
    assert _imports(module) == {"intloom.errors", "intloom", "intloom.store", "intloom.host.daemon"}
    module.write_text("from . import sibling\n")
    with pytest.raises(AssertionError, match="absolute imports only"):
        _imports(module)


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_rules_see_every_layer() -> None:
    """A new package must be placed in the rules above (or be an outer one on purpose)."""
    outer = {"host", "client", "cli", "diagnostics"}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(INWARD) | outer
    assert _imports(PACKAGE / "runtime" / "machine.py")  # the parser sees imports at all


def test_only_a_steps_own_boundaries_skip_the_bounds_check() -> None:
    """``Runtime.append_boundary`` skips ``_bounded`` (the hot path): every call hands it a
    record of one of the three kinds that carry no user text the check would bound."""
    allowed = {"StepReady", "Executing", "StepResult"}
    found: list[str] = []
    for path in (PACKAGE / "executor").glob("*.py"):
        if path.name == "runtime.py":
            continue  # append itself hands every record on, bounded
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "append_boundary" and len(node.args) >= 2):
                record = node.args[1]
                assert isinstance(record, ast.Call) and isinstance(record.func, ast.Name), (
                    f"{path.name}:{node.lineno}: append_boundary takes a record built in place")
                found.append(record.func.id)
    assert found and set(found) <= allowed, found


def test_every_package_data_file_pyproject_names_exists() -> None:
    """What ``[tool.setuptools.package-data]`` lists is shipped only if it exists: a missing
    ``py.typed`` made mypy skip intloom in a user's Workflow ("module is installed, but
    missing library stubs or py.typed marker"), so every ``ctx`` and decorator was Any."""
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["intloom"]
    missing = [pattern for pattern in patterns if not any(PACKAGE.glob(pattern))]
    assert missing == []
