"""The package's layering, read from the source (the `ast` of every module), so that it stays as designed.

aiocop's private code is a few parts, each one concern, stacked in layers:
a part imports only parts of lower layers (never one beside it, never one
above), and no modules import each other in a circle. The parts and their
order are the data below; docs/concepts/architecture.md explains them and
shows the imports measured here.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

from tests.support.source import top_level_names

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "aiocop"
ARCHITECTURE_PAGE = ROOT / "docs" / "concepts" / "architecture.md"

# Bottom layer first. A part is a private subpackage of aiocop (`aiocop._common`) or a private module kept at
# the top (`aiocop._api`); parts in one layer are siblings and may not import each other. Every public module
# (no `_` in its path below aiocop, and `aiocop.__main__`) is in the top part, "public".
LAYERS: list[dict[str, list[str]]] = [
    {"aiocop._version": ["aiocop._version"]},
    {
        "aiocop._common": [
            "aiocop._common.clock",
            "aiocop._common.forksafe",
            "aiocop._common.validate",
            "aiocop._common.escape",
            "aiocop._common.inputs",
        ]
    },
    {
        "aiocop._model": [
            "aiocop._model.severity",
            "aiocop._model.events",
            "aiocop._model.exceptions",
            "aiocop._model.state",
            "aiocop._model.callbacks",
        ]
    },
    {
        "aiocop._interception": [
            "aiocop._interception.hook",
            "aiocop._interception.wrappers",
            "aiocop._interception.standin",
            "aiocop._interception.typepatch",
            "aiocop._interception.reload",
            "aiocop._interception.rules",
            "aiocop._interception.internals",
            "aiocop._interception.harmless",
            "aiocop._interception.allow",
            "aiocop._interception.scope",
            "aiocop._interception.frames",
            "aiocop._interception.loops",
            "aiocop._interception.trio_runs",
            "aiocop._interception.sink",
        ]
    },
    {
        "aiocop._stalls": [
            "aiocop._stalls.watchdog",
            "aiocop._stalls.settings",
            "aiocop._stalls.timing",
            "aiocop._stalls.stacks",
            "aiocop._stalls.attribution",
            "aiocop._stalls.discovery",
            "aiocop._stalls.tripwire",
            "aiocop._stalls.waits",
            "aiocop._stalls.sched",
            "aiocop._stalls.probe",
            "aiocop._stalls.culprit",
            "aiocop._stalls.sink",
            "aiocop._stalls.state",
        ]
    },
    {
        "aiocop._reporting": [
            "aiocop._reporting.delivery",
            "aiocop._reporting.building",
            "aiocop._reporting.worker",
            "aiocop._reporting.hangs",
            "aiocop._reporting.report",
            "aiocop._reporting.logs",
            "aiocop._reporting.sites",
            "aiocop._reporting.timeline",
            "aiocop._reporting.flame",
            "aiocop._reporting.exports",
            "aiocop._reporting.html_report",
            "aiocop._reporting.report_files",
            "aiocop._reporting.sink",
        ]
    },
    {"aiocop._configuration": ["aiocop._configuration.config", "aiocop._configuration.baseline"]},
    {"aiocop._api": ["aiocop._api"]},
    {
        "aiocop._commands": [
            "aiocop._commands.cli",
            "aiocop._commands.exits",
            "aiocop._commands.attach",
            "aiocop._commands.attach.command",
            "aiocop._commands.attach.agent",
            "aiocop._commands.attach.files",
            "aiocop._commands.attach.proc",
            "aiocop._commands.attach.report",
        ],
        "aiocop._pytest_support": [
            "aiocop._pytest_support.events",
            "aiocop._pytest_support.settings",
            "aiocop._pytest_support.portal",
            "aiocop._pytest_support.timeouts",
        ],
    },
]
PUBLIC = "public"

# Imports made inside a function, at run time, against the layering, each with the reason it is there.
# The test fails if one disappears (strike it here) or a new one appears.
# None today: the last one, the wrappers fetching the audit hook when they patch, went with issue 40 (the
# hook hands itself to the wrappers when it is installed).
KNOWN_LAZY_BACK_EDGES: dict[tuple[str, str], str] = {}

# `import aiocop` loads only `aiocop._version` (every other name of the package loads lazily, on first use):
# a private module may import the package for these attributes, and that counts as importing `aiocop._version`.
ROOT_ATTRIBUTES = {"__version__", "__file__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _imported_from(package: str, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, relative imports resolved against `package`."""
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        return ".".join([*base, *([node.module] if node.module else [])])
    return node.module or ""


class _Imports(ast.NodeVisitor):
    """Every import of an aiocop module: (target, inside a function, only while type checking)."""

    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.known = known
        self.found: list[tuple[str, bool, bool]] = []
        self.root_attributes: set[str] = set()
        self._function = 0
        self._type_checking = 0

    def visit_If(self, node: ast.If) -> None:
        checking = "TYPE_CHECKING" in ast.unparse(node.test)
        self._type_checking += checking
        for child in node.body:
            self.visit(child)
        self._type_checking -= checking
        for child in node.orelse:
            self.visit(child)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._function += 1
        self.generic_visit(node)
        self._function -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815 - the name ast.NodeVisitor dispatches to

    def _add(self, target: str) -> None:
        if target == "aiocop" or target.startswith("aiocop."):
            while target not in self.known:  # `from aiocop._x import name`: the module, not the name
                target = target.rpartition(".")[0]
                assert target, "an import of no module of aiocop"
            self.found.append((target, self._function > 0, self._type_checking > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = _imported_from(self.package, node)
        for alias in node.names:
            self._add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in self.known else module)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id == "aiocop":
            self.root_attributes.add(node.attr)
        self.generic_visit(node)


@functools.cache
def _imports() -> tuple[dict[str, list[tuple[str, bool, bool]]], dict[str, set[str]]]:
    modules = _modules()
    found, attributes = {}, {}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py", set(modules))
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        found[name] = visitor.found
        attributes[name] = visitor.root_attributes
    return found, attributes


def _is_public(module: str) -> bool:
    return module == "aiocop.__main__" or not any(part.startswith("_") for part in module.split(".")[1:])


def _part_of() -> dict[str, str]:
    part_of = {module: part for layer in LAYERS for part, modules in layer.items() for module in modules}
    part_of.update({part: part for layer in LAYERS for part in layer})  # a subpackage's __init__: its part
    for module in _modules():
        if _is_public(module):
            part_of[module] = PUBLIC
    return part_of


def _layer_of() -> dict[str, int]:
    layer_of = {part: index for index, layer in enumerate(LAYERS) for part in layer}
    layer_of[PUBLIC] = len(LAYERS)
    return layer_of


def _edges() -> dict[str, set[str]]:
    """Part -> the parts its modules import (any import: at the top, in a function, or for types)."""
    found, _ = _imports()
    part_of = _part_of()
    edges: dict[str, set[str]] = defaultdict(set)
    for module, imports in found.items():
        for target, _, _ in imports:
            target_part = part_of["aiocop._version"] if target == "aiocop" else part_of[target]
            if target_part != part_of[module]:
                edges[part_of[module]].add(target_part)
    return edges


def test_every_module_is_in_exactly_one_part() -> None:
    listed = [module for layer in LAYERS for modules in layer.values() for module in modules]
    assert len(listed) == len(set(listed)), sorted(m for m in listed if listed.count(m) > 1)
    private = {module for module in _modules() if not _is_public(module)}
    parts = {part for layer in LAYERS for part in layer}
    # A subpackage's __init__ belongs to its part.
    private_unlisted = {m for m in private - set(listed) if m not in parts}
    assert not private_unlisted, (
        f"private modules in no part of LAYERS (give each its part): {sorted(private_unlisted)}"
    )
    assert not set(listed) - private, f"LAYERS lists modules that do not exist: {sorted(set(listed) - private)}"


def test_imports_run_only_downwards() -> None:
    found, attributes = _imports()
    part_of, layer_of = _part_of(), _layer_of()
    wrong = []
    for module, imports in found.items():
        here = part_of[module]
        for imported, lazy, _ in imports:
            target = imported
            if imported == "aiocop":
                if here != PUBLIC and layer_of[here] < layer_of["aiocop._api"]:
                    extra = attributes[module] - ROOT_ATTRIBUTES
                    if extra:
                        wrong.append(f"{module} imports the package for {sorted(extra)} (lazy names load _api)")
                target = "aiocop._version"
            there = part_of[target]
            if there == here:
                continue
            if (module, target) in KNOWN_LAZY_BACK_EDGES and lazy:
                continue
            if layer_of[there] >= layer_of[here]:
                how = "beside it" if layer_of[there] == layer_of[here] else "above it"
                wrong.append(f"{module} ({here}) imports {target} ({there}, {how})")
    assert not wrong, "imports against the layering:\n  " + "\n  ".join(wrong)


def test_no_circle_of_imports() -> None:
    # Imports that run (at the top or in a function; not those for type checkers only), less the known lazy ones.
    found, _ = _imports()
    graph = {
        module: sorted(
            {"aiocop._version" if t == "aiocop" else t for t, _, typing in imports if not typing}
            - {module}
            - {target for (source, target) in KNOWN_LAZY_BACK_EDGES if source == module}
        )
        for module, imports in found.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target in graph.get(module, []):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state:
                circle = visit(target)
                if circle:
                    return circle
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            circle = visit(module)
            assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_known_lazy_back_edges_are_still_there_and_lazy() -> None:
    found, _ = _imports()
    for (source, target), why in KNOWN_LAZY_BACK_EDGES.items():
        kinds = [lazy for t, lazy, _ in found.get(source, []) if t == target]
        assert kinds, f"{source} no longer imports {target}: strike it from KNOWN_LAZY_BACK_EDGES ({why})"
        assert all(kinds), f"{source} imports {target} at its top: that is a circle, not a lazy import"


def test_each_private_subpackage_is_one_part_and_says_what_it_may_import() -> None:
    # Each private subpackage of aiocop/ is a part of LAYERS holding exactly that part's modules, and its
    # docstring ends with "May import: ..." naming exactly the parts below it (the version aside).
    layer_of = _layer_of()
    for init in sorted(PACKAGE.glob("_*/__init__.py")):
        package = _module_name(init)
        assert package in layer_of, f"{package} is a private subpackage but no part of LAYERS"
        layer = next(layer for layer in LAYERS if package in layer)
        inside = {m for m in _modules() if m.startswith(package + ".")}
        assert inside == set(layer[package]), f"{package} holds {sorted(inside)}, LAYERS says {layer[package]}"
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        said = re.search(r"May import: (.*?)\.?\s*\Z", docstring, re.DOTALL)
        assert said, f"{package}'s docstring does not end with 'May import: ...'"
        named = set() if said.group(1) == "nothing of aiocop" else set(re.split(r",\s*", said.group(1).strip()))
        below = {part for part, index in layer_of.items() if index < layer_of[package] and part != "aiocop._version"}
        assert named == below, f"{package} says it may import {sorted(named)}; the layers below are {sorted(below)}"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_aliases(package: str, tree: ast.Module, modules: dict[str, Path]) -> dict[str, str]:
    """The names an aiocop module is bound to by imports anywhere in `tree`: name -> module."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
        elif isinstance(node, ast.ImportFrom):
            source = _imported_from(package, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    # A module bound to another name by assignment (`hook = _hook`, `m = sys.modules["aiocop._x"]`), anywhere.
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            bound = _module_named(node.value, aliases, modules) or _module_looked_up(node.value, aliases, modules)
            if bound is not None:
                aliases[node.targets[0].id] = bound
    return aliases


def _imported_objects(package: str, tree: ast.Module, modules: dict[str, Path]) -> dict[str, str]:
    """The names bound anywhere in `tree` to what an aiocop module holds, not a module itself (`from
    aiocop._stalls.settings import sampling`): name -> the module it came from. What such a name holds is
    that module's as much as `module.name` is."""
    held: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _imported_from(package, node)
            if source in modules:
                for alias in node.names:
                    if f"{source}.{alias.name}" not in modules:
                        held[alias.asname or alias.name] = source
    return held


def _parsed() -> list[tuple[str, Path, ast.Module, str]]:
    """Each module of aiocop: its name, its path, its tree and its package (for relative imports)."""
    return [
        (
            module,
            path,
            ast.parse(path.read_text(encoding="utf-8"), str(path)),
            module if path.name == "__init__.py" else module.rpartition(".")[0],
        )
        for module, path in _modules().items()
    ]


def _module_named(node: ast.expr, aliases: dict[str, str], modules: dict[str, Path]) -> str | None:
    """The aiocop module `node` names (`alias`, or a dotted `aiocop._x.y`), if it names one."""
    named = ast.unparse(node)
    target = aliases.get(named) if isinstance(node, ast.Name) else named
    return target if target in modules else None


def _module_at_base(
    node: ast.expr, aliases: dict[str, str], modules: dict[str, Path], held: dict[str, str] | None = None
) -> str | None:
    """The aiocop module an expression reaches into: the module named at the base of a chain of attributes,
    subscripts and calls (`alias.x._y`, `alias.f()._y`, `alias.table[k]._y`), by a look-up of a module
    (`sys.modules["aiocop._x"]`, `importlib.import_module("aiocop._x")`, `vars(alias)`, `alias.__dict__`),
    or by a name imported from it (`held`: `from module import table; table._y`)."""
    while True:
        named = _module_named(node, aliases, modules) or _module_looked_up(node, aliases, modules)
        if named is not None:
            return named
        if held and isinstance(node, ast.Name) and node.id in held:
            return held[node.id]
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return None


def _module_looked_up(node: ast.expr, aliases: dict[str, str], modules: dict[str, Path]) -> str | None:
    """The module a run-time look-up names: `sys.modules["m"]`, `importlib.import_module("m")`,
    `vars(alias)`, `alias.__dict__`."""
    if (
        isinstance(node, ast.Subscript)
        and ast.unparse(node.value) == "sys.modules"
        and isinstance(node.slice, ast.Constant)
        and node.slice.value in modules
    ):
        return str(node.slice.value)
    if isinstance(node, ast.Call) and node.args:
        called = ast.unparse(node.func)
        first = node.args[0]
        if called in {"importlib.import_module", "import_module", "__import__"}:
            return first.value if isinstance(first, ast.Constant) and first.value in modules else None
        if called == "vars":
            return _module_named(first, aliases, modules)
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
        return _module_named(node.value, aliases, modules)
    return None


def _private_names_of_other_parts() -> list[str]:
    """Every use of a private name (`_x`) of a module of another part: `alias._x`, or `from module import _x`.

    Also `alias.obj._x`, `alias.f()._x`: a private name of what another part's module holds is as private.

    `alias` is a name bound by an import of an aiocop module anywhere in the module (`from aiocop._reporting
    import delivery as _delivery`, `import aiocop._api as api`), or the module's dotted name itself
    (`aiocop._api._x`). A module's private names are its own part's business: another part gets a name
    without the underscore, whose docstring says who uses it and why.
    """
    modules = _modules()
    part_of = _part_of()
    found: list[tuple[Path, int, str]] = []
    for module, path, tree, package in _parsed():
        here = part_of.get(module)
        where = path.relative_to(ROOT)
        aliases = _module_aliases(package, tree, modules)
        held = _imported_objects(package, tree, modules)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _imported_from(package, node)
                for alias in node.names:
                    if (
                        f"{source}.{alias.name}" not in modules
                        and source in modules
                        and _is_private(alias.name)
                        and part_of.get(source) != here
                    ):
                        found.append((where, node.lineno, f"imports {alias.name}, private to {source}"))
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                target = _module_at_base(node.value, aliases, modules, held)
                if target is not None and part_of.get(target) != here:
                    found.append(
                        (where, node.lineno, f"uses {ast.unparse(node.value)}.{node.attr}, private to {target}")
                    )
    return [f"{where}:{line}: {what}" for where, line, what in sorted(found)]


# Modules of a lower part whose attributes a higher part may set, each with the reason. Everything else a
# part hands upwards goes through a function of the module that owns the name (issue 40: the nine late-bound
# slots became one sink, `_interception.sink`, installed by `_api`). The test fails if one is no longer set
# (strike it here) or another module's attribute is set from another part.
ASSIGNABLE_MODULES: dict[str, str] = {
    "aiocop._model.state": (
        "the process's switches (started, ever_started, active, task_records_made) and the user's configuration "
        "(config: threshold, hang_after_ms, raise_min_score): plain data that _api, `run` and the attach agent "
        "set as the user starts, configures, pauses and stops detection, and every layer reads"
    ),
    "aiocop._stalls.settings": (
        "the watchdog's settings (`sampling`, a dataclass of plain values): _api fills it from the arguments "
        "of start_cpu_sampling and detect_slow_tasks, `run` and the pytest plugin set its default for idle looks"
    ),
}


# The calls that set an attribute of their first argument, and the methods that change a container in place.
_SETTERS = {"setattr", "delattr", "object.__setattr__", "object.__delattr__", "type.__setattr__"}
_MUTATORS = {
    "append", "appendleft", "clear", "discard", "extend", "insert", "pop", "popitem", "popleft", "remove",
    "setdefault", "update", "add", "sort", "reverse", "difference_update", "intersection_update",
    "symmetric_difference_update", "__setitem__", "__delitem__",
}  # fmt: skip


def _settings_of_modules(
    tree: ast.Module, aliases: dict[str, str], modules: dict[str, Path], held: dict[str, str]
) -> list[tuple[int, str, str]]:
    """Every attribute of an aiocop module set or deleted in `tree`, and every container it holds changed in
    place, as (line, what, the module): `alias.x = ...`, `alias.x += ...`, `del alias.x`, `setattr(alias,
    ...)`, `object.__setattr__(alias, ...)`, `alias.Class.x = ...`, `alias.f().x = ...`, `vars(alias)[k] =
    ...`, `alias.__dict__[k] = ...`, `sys.modules["m"].x = ...`, `importlib.import_module("m").x = ...`,
    `alias.table.clear()`; `alias` also a name a module was assigned to (`m = alias`). What the source
    does not say (a setter bound to another name, a module passed in as an argument) is not seen."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            owner, what = node.value, f"sets {ast.unparse(node)}"
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in _SETTERS and node.args:
            owner, what = node.args[0], f"calls {ast.unparse(node.func)} on {ast.unparse(node.args[0])}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and (
                node.func.attr in {"__setattr__", "__delattr__"}  # (`module.__setattr__(...)` too)
                # (`module.pop(...)` is a function of the module's; `module.table.pop(...)` changes its table)
                or (node.func.attr in _MUTATORS and _module_named(node.func.value, aliases, modules) is None)
            )
        ):
            owner, what = node.func.value, f"calls {ast.unparse(node.func)}"
        else:
            continue
        target = _module_at_base(owner, aliases, modules, held)
        if target is not None:
            found.append((node.lineno, what, target))
    return found


def _assignments_to_other_parts() -> tuple[list[str], set[str]]:
    """Every attribute of a module of another part set from outside it (_settings_of_modules), and the
    modules of ASSIGNABLE_MODULES found set."""
    modules = _modules()
    part_of = _part_of()
    found: list[tuple[Path, int, str]] = []
    allowed_seen: set[str] = set()
    for module, path, tree, package in _parsed():
        here = part_of.get(module)
        aliases, held = _module_aliases(package, tree, modules), _imported_objects(package, tree, modules)
        for line, what, target in _settings_of_modules(tree, aliases, modules, held):
            if part_of.get(target) == here:
                continue
            if target in ASSIGNABLE_MODULES:
                allowed_seen.add(target)
                continue
            found.append((path.relative_to(ROOT), line, f"{what}, an attribute of {target}"))
    return [f"{where}:{line}: {what}" for where, line, what in sorted(found)], allowed_seen


def test_no_part_sets_an_attribute_of_another_parts_module() -> None:
    found, allowed_seen = _assignments_to_other_parts()
    assert not found, (
        "attributes of another part's module set from outside it (give the owning module a function that sets "
        "it, or hand the callable over through the sink, `_interception.sink`):\n  " + "\n  ".join(found)
    )
    unused = set(ASSIGNABLE_MODULES) - allowed_seen
    assert not unused, f"no part sets these any more: strike them from ASSIGNABLE_MODULES: {sorted(unused)}"


def test_no_private_name_is_used_across_parts() -> None:
    found = _private_names_of_other_parts()
    assert not found, (
        "private names of another part's module (give the name a public one in its module, with a docstring "
        "saying who uses it and why):\n  " + "\n  ".join(found)
    )


def render_parts() -> str:
    """The architecture page's table of parts, from LAYERS and the imports measured in the code."""
    edges = _edges()
    rows = ["| layer | part | imports (measured from the code) |", "| --- | --- | --- |"]
    layer_of = _layer_of()
    ordered = sorted(layer_of, key=lambda part: (-layer_of[part], part))
    for part in ordered:
        targets = sorted(edges.get(part, set()), key=lambda target: (-layer_of[target], target))
        shown = ", ".join(f"`{t}`" for t in targets) or "nothing of aiocop"
        rows.append(f"| {layer_of[part]} | `{part}` | {shown} |")
    return "\n".join(rows) + "\n"


def test_the_architecture_page_shows_the_imports_of_the_code() -> None:
    page = ARCHITECTURE_PAGE.read_text(encoding="utf-8")
    start, end = "<!-- parts: begin (tests/test_layers.py) -->\n", "<!-- parts: end -->"
    assert start in page and end in page, f"{ARCHITECTURE_PAGE} has lost its table markers"
    shown = page.split(start, 1)[1].split(end, 1)[0]
    assert shown == render_parts(), "the table differs from the code; the table as measured now:\n" + render_parts()


def _sink_fields() -> list[str]:
    """The fields of the seam's records (`Sink`, and the watchdog's `StallSink`), read from their source."""
    fields = []
    for path, name in (("_interception/sink.py", "Sink"), ("_stalls/sink.py", "StallSink")):
        tree = ast.parse((PACKAGE / path).read_text(encoding="utf-8"))
        [record] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
        fields += [n.target.id for n in record.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return fields


def test_the_architecture_page_shows_every_field_of_the_sink() -> None:
    # The page's table of the seam has one row per field of the sink, in the records' order.
    page = ARCHITECTURE_PAGE.read_text(encoding="utf-8")
    shown = re.findall(r"^\| `(\w+)` \| the (?:hook|loops'|watchdog)", page, re.MULTILINE)
    assert shown == _sink_fields(), f"the page's sink table shows {shown}; the sink's fields are {_sink_fields()}"


def test_the_architecture_page_names_only_what_the_code_has() -> None:
    """Every file the page names exists, and every `module.name` of the flows and tables (`delivery.flush`,
    `hook.start_delivery`, `sink.deliver`) is a name that module defines (a sink's: a field of the seam's records):
    the page follows the code as it is renamed."""
    page = ARCHITECTURE_PAGE.read_text(encoding="utf-8")
    missing = [path for path in re.findall(r"aiocop/[\w/]+\.py", page) if not (ROOT / path).exists()]
    by_basename: dict[str, list[Path]] = defaultdict(list)
    for path in _modules().values():
        if path.name != "__init__.py":
            by_basename[path.stem].append(path)
    unknown = []
    for module, name in sorted(set(re.findall(r"\b([a-z_]+)\.([A-Za-z_]\w*)\b", page))):
        if name == "py" or module not in by_basename:
            continue
        if module == "sink":
            known = set(_sink_fields())
        else:  # (a name some modules share, `state`, `events`: any of them)
            known = set().union(*(top_level_names(path, imports=True) for path in by_basename[module]))
        if name not in known:
            unknown.append(f"{module}.{name}")
    assert not missing and not unknown, (
        f"the architecture page names files {missing} and names {unknown} the code does not have"
    )


# Each way of setting another module's attribute the check must see, written as a module of aiocop._reporting
# would (the review of issue 40 got ten of these past the first version of the check).
_WAYS_OF_SETTING = """
import importlib
import sys
from aiocop._interception import hook as _h
from aiocop._interception import loops
from aiocop._interception.hook import current_state, unclaimed
from aiocop._interception.loops import register
from aiocop._stalls import watchdog as _watchdog
from aiocop._stalls.watchdog import watchdog

def probe(name, value):
    _h.a = value  # set
    _h.b += 1  # set
    del _h.c  # set
    setattr(_h, name, value)  # set
    object.__setattr__(_h, name, value)  # set
    vars(_h)["d"] = value  # set
    _h.__dict__["e"] = value  # set
    sys.modules["aiocop._interception.hook"].f = value  # set
    importlib.import_module("aiocop._interception.hook").g = value  # set
    alias = _h
    alias.h = value  # set
    loops.LoopWatch.i = value  # set
    loops.register(None, None).j = value  # set
    _h.unclaimed.clear()  # set
    _h.unclaimed[name] = value  # set
    vars(_h).update(x=value)  # set
    _h.__setattr__("k", value)  # set
    _h.unclaimed.__setitem__(name, value)  # set
    unclaimed.clear()  # set
    unclaimed[name] = value  # set
    register(None, None).m = value  # set
    return _watchdog.watchdog._thread, _h.current_state()._x, current_state()._y, watchdog._z
"""


def test_the_checks_see_every_way_of_setting_or_reaching_into_another_module() -> None:
    tree = ast.parse(_WAYS_OF_SETTING)
    modules = _modules()
    aliases = _module_aliases("aiocop._reporting", tree, modules)
    held = _imported_objects("aiocop._reporting", tree, modules)
    found = _settings_of_modules(tree, aliases, modules, held)
    setting_lines = [n for n, line in enumerate(_WAYS_OF_SETTING.splitlines(), 1) if line.endswith("# set")]
    assert sorted({line for line, _, _ in found}) == setting_lines, found
    assert {target for _, _, target in found} == {"aiocop._interception.hook", "aiocop._interception.loops"}
    private = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and _is_private(node.attr)
        and _module_at_base(node.value, aliases, modules) is not None
    ]
    private += [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and _is_private(node.attr)
        and _module_at_base(node.value, aliases, modules) is None
        and _module_at_base(node.value, aliases, modules, held) is not None
    ]
    assert sorted(private) == [
        "_h.current_state()._x",
        "_watchdog.watchdog._thread",
        "current_state()._y",
        "watchdog._z",
    ]
