"""The house's floor plan, checked from the code's own imports (issue 57): no import circles between
modules of ``epochal``, and no module imports a layer above its own (imports inside functions and
under ``TYPE_CHECKING`` count: a circle of types is still one concern cut in two). Pure: no Spark.

The layers, lowest first, and what each may import is written down once, here and in
docs/development.md; the Dagster shell (``platform_defs``, ``resources``, ``assets``) sits above all.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "epochal"

#: lowest first: a module may import modules of its own layer (without a circle) or of lower ones
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # shared vocabulary: leaf modules every layer uses
    (
        "vocabulary",
        ("epoch", "errors", "settings", "sql", "retry", "lease", "redaction", "faults", "options", "env_refs"),
    ),
    # what Epochal runs on: the meta store's backends, Spark as a process
    ("infrastructure", ("meta", "spark")),
    # files: the warehouse layout, change netting, snapshots, the state read path
    ("storage", ("storage",)),
    # what a pipeline is: SQL, plans, and the connectors and sink targets its statements name
    ("definitions", ("pipeline", "incremental", "connectors", "sinks")),
    # the checkpoint controller and every record it keeps in the meta store
    ("checkpoint", ("checkpoint",)),
    # small epochs computed on the driver by DuckDB
    ("engines", ("driver",)),
    # the steps of an epoch
    ("runtime", ("runtime",)),
    # what drives the runtime: backfill runs, `epochal query`, the CLI
    ("applications", ("backfill", "query", "cli")),
]

#: Parts of the checkpoint controller and its meta store, which code outside ``epochal/checkpoint``
#: reaches only through the controller's named methods (one transaction each).
_REACHING_IN = re.compile(
    r"controller\.(epoch_log|catalog|sink_coordinator|backfills|backend)\b|\bbackend\.transaction\("
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of other modules of the package (the longest module an import names)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named.add(node.module)
                named.update(f"{node.module}.{alias.name}" for alias in node.names)
        targets = set()
        for imported in named:
            parts = imported.split(".")
            for k in range(len(parts), 0, -1):
                candidate = ".".join(parts[:k])
                if candidate in modules:
                    if candidate != name:
                        targets.add(candidate)
                    break
        graph[name] = targets
    return graph


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return 0  # the package's own __init__
    for rank, (_, members) in enumerate(LAYERS):
        if parts[1] in members:
            return rank
    raise AssertionError(
        f"{module} belongs to no layer: add {parts[1]!r} to LAYERS in tests/test_layout.py and docs/development.md"
    )


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    circles = _circles(_imports(_modules()))
    assert not circles, (
        "import circles (a concern cut into modules that call back into each other; give the parts a narrow "
        f"interface instead): {circles}"
    )


def test_no_module_imports_a_layer_above_its_own() -> None:
    graph = _imports(_modules())
    upward = [
        f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if _layer(target) > _layer(module)
    ]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_only_vocabulary_modules_sit_at_the_top_of_the_package() -> None:
    loose = {path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    assert loose == set(LAYERS[0][1]), f"top-level modules that are not vocabulary: {sorted(loose - set(LAYERS[0][1]))}"


def test_only_the_checkpoint_reaches_into_the_controller_and_the_meta_store() -> None:
    """Callers outside ``epochal/checkpoint`` use the controller's named methods, never its parts
    (``controller.epoch_log.x``) or a raw ``backend.transaction``: what the checkpoint promises is
    decided in one place. (A sink target's own store, such as the DuckDB sink's file, is its own.)"""
    shell = [REPO / "platform_defs", REPO / "resources", REPO / "assets"]
    outside = [p for p in PACKAGE.rglob("*.py") if not p.is_relative_to(PACKAGE / "checkpoint")]
    outside = [p for p in outside if not p.is_relative_to(PACKAGE / "meta") and not p.is_relative_to(PACKAGE / "sinks")]
    outside += [p for root in shell for p in root.rglob("*.py")]
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in outside
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _REACHING_IN.search(line)
    ]
    assert not found, "reaching past the controller's methods:\n" + "\n".join(found)


def test_steps_depend_on_the_step_context_not_on_the_runtime() -> None:
    """A step runs in a ``StepContext``; only the runtime's facade (and what drives it from above)
    knows ``EpochRuntime``."""
    graph = _imports(_modules())
    steps = [m for m in graph if m.startswith("epochal.runtime.") and m not in ("epochal.runtime.facade",)]
    steps = [m for m in steps if m != "epochal.runtime.one_epoch"]  # drives a whole epoch through the facade
    leaning = [f"{m} imports the facade" for m in sorted(steps) if "epochal.runtime.facade" in graph[m]]
    leaning += [f"{m} imports the runtime package" for m in sorted(steps) if "epochal.runtime" in graph[m]]
    assert not leaning, leaning


def test_private_dagster_names_are_imported_in_one_module_each_for_the_code_and_the_tests() -> None:
    """Dagster's private ``dagster._*`` modules move between releases: the code imports them only in
    ``platform_defs/dagster_internals.py`` and the tests only in ``tests/dagster_internals.py``,
    each name with why no public API does it; everything else uses public names."""
    allowed = {REPO / "platform_defs" / "dagster_internals.py", REPO / "tests" / "dagster_internals.py"}
    roots = ["epochal", "platform_defs", "resources", "assets", "tests", "benchmarks"]
    found = []
    for path in (p for root in roots for p in (REPO / root).rglob("*.py")):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.startswith("dagster._")]
    assert not found, "private Dagster imports outside the internals modules:\n" + "\n".join(found)
