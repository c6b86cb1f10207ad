"""Imports point one way, and product code never imports ``polar.testing``.

Every module under ``src/polar`` is parsed (not imported) and each of its
imports, wherever it stands (a function's lazy import and a ``TYPE_CHECKING``
one count the same), is checked against :data:`LAYERS`, lowest first: a part
(``polar.<part>``) may import its own layer or lower ones, and no part may
import one that imports it back (two parts of one layer included). The order
is the one ``docs/architecture.md`` draws: ``ir`` ← ``proxy``/``trajectory`` ←
``rollout`` ← ``train``/``sft``/``cli``, with the other parts placed where
what they import today puts them.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: tuple[frozenset[str], ...] = (
    # The shared types: nothing from the project.
    frozenset({"ir"}),
    # Leaf modules, one concept each, for every layer above (``polar`` itself
    # holds only the version).
    frozenset(
        {
            "polar",
            "adapters",
            "assets",
            "atomicfile",
            "bearer",
            "causallm",
            "configfile",
            "device",
            "distribution",
            "gctune",
            "http1",
            "loopback",
            "malloctune",
            "plugins",
            "precision",
            "serverthread",
            "smollm2",
            "tokenizer",
        }
    ),
    # The parts on the IR: the gateway, the builders, the sandboxes, the harnesses.
    frozenset({"proxy", "trajectory", "runtime", "harness"}),
    # Tasks (prepared in a runtime); the test doubles (engines on the proxy's protocol).
    frozenset({"tasks", "testing"}),
    # Evaluators (a task's checks run in a runtime).
    frozenset({"reward"}),
    frozenset({"rollout"}),
    # What drives rollouts: the trainers, the SFT generator, the web UI, the
    # bridges to other trainers, the command line.
    frozenset({"train", "sft", "dashboard", "bridges", "cli", "tinymodel"}),
    frozenset({"__main__"}),
)

TESTING = "polar.testing"

ALLOWED_TESTING_IMPORTS: dict[tuple[str, str], str] = {
    # ``polar engine scripted`` serves the scripted engine itself; it leaves
    # ``polar.testing`` when the engine's vLLM wire module is shared with the
    # embedded engine (issue 36, item 1: the two look-alike servers).
    ("polar.cli.engine", "polar.testing.scripted"): "the scripted engine as a command",
    # A rehearsal replays scripted exchanges through the real gateway (the
    # tiny-model wing, polar.tinymodel, above the gateway and the rollout side).
    ("polar.tinymodel.rehearsal", "polar.testing.scripted"): "rehearsals on the scripted engine",
}
"""Product modules that still import ``polar.testing`` (importer, imported), each
with why. An entry goes when its import does: a stale one fails the test."""


def _layer_of() -> dict[str, int]:
    layer_of: dict[str, int] = {}
    for index, parts in enumerate(LAYERS):
        for part in parts:
            assert part not in layer_of, f"{part} is in two layers"
            layer_of[part] = index
    return layer_of


LAYER_OF = _layer_of()


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted((SRC / "polar").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """The Polar modules ``module`` imports, with the line of each."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            if name == "polar":  # ``from polar import x``: x may be a part
                for alias in node.names:
                    yield (
                        (f"polar.{alias.name}" if alias.name in LAYER_OF else "polar"),
                        node.lineno,
                    )
            else:
                yield name, node.lineno


def _part(module: str) -> str:
    return module.split(".")[1] if "." in module else "polar"


@functools.cache
def _polar_imports() -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of a Polar module by a Polar module."""
    found = []
    for module, path in _modules():
        for name, line in _imports(module, path):
            if name == "polar" or name.startswith("polar."):
                found.append((module, name, line))
    return found


def test_every_part_has_a_layer() -> None:
    parts = {_part(module) for module, _ in _modules()}
    assert parts - set(LAYER_OF) == set(), "give each new part a layer in LAYERS"
    assert set(LAYER_OF) - parts == set(), "a part in LAYERS no longer exists"


def test_no_part_imports_a_higher_layer() -> None:
    upward = [
        f"{importer}:{line} imports {imported} "
        f"(layer {LAYER_OF[_part(importer)]} -> {LAYER_OF[_part(imported)]})"
        for importer, imported, line in _polar_imports()
        if LAYER_OF.get(_part(imported), -1) > LAYER_OF.get(_part(importer), -1)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_two_parts_import_each_other() -> None:
    """Parts of one layer too: the arrows between parts form no cycle."""
    edges: dict[str, set[str]] = {}
    for importer, imported, _ in _polar_imports():
        if _part(importer) != _part(imported):
            edges.setdefault(_part(importer), set()).add(_part(imported))
    cycles = []
    done: set[str] = set()

    def visit(part: str, path: list[str]) -> None:
        if part in path:
            cycles.append(" -> ".join([*path[path.index(part) :], part]))
            return
        if part in done:
            return
        for imported in sorted(edges.get(part, ())):
            visit(imported, [*path, part])
        done.add(part)

    for part in sorted(edges):
        visit(part, [])
    assert not cycles, "parts that import each other:\n" + "\n".join(cycles)


def test_product_code_never_imports_polar_testing() -> None:
    found = {
        (importer, imported): line
        for importer, imported, line in _polar_imports()
        if (imported == TESTING or imported.startswith(TESTING + "."))
        and not (importer == TESTING or importer.startswith(TESTING + "."))
    }
    unexpected = [
        f"{importer}:{line} imports {imported}"
        for (importer, imported), line in sorted(found.items())
        if (importer, imported) not in ALLOWED_TESTING_IMPORTS
    ]
    stale = sorted(set(ALLOWED_TESTING_IMPORTS) - set(found))
    assert not unexpected, "product code imports a test double (move what it needs):\n" + "\n".join(
        unexpected
    )
    assert not stale, f"gone: drop {stale} from ALLOWED_TESTING_IMPORTS"
