"""The layers of the code (docs/design.md §13): no module imports from a layer above its own, nor
from another package of its own layer.

Read from the source with `ast`, nothing imported: every import statement counts, at the top of a
module, inside a function (a lazy import is still a dependency) or under TYPE_CHECKING (a type
names what it depends on), and so does `importlib.import_module` given a literal name.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS: tuple[tuple[str, ...], ...] = (
    ("tbon",),  # shared by all: errors, exit codes, limits, records, the process title
    ("tbon.keys",),  # CURVE key pairs and certificate files
    ("tbon.overlay.parse",),
    ("tbon.overlay.wire",),
    ("tbon.overlay.state", "tbon.overlay.connectors"),
    ("tbon.overlay.config",),
    ("tbon.overlay.links", "tbon.overlay.boot"),
    ("tbon.overlay.services",),
    ("tbon.overlay.broker",),
    ("tbon.overlay.launch",),
    ("tbon.cli",),
)
"""Lowest first. A package is the longest of these names that a module's name starts with (so
`tbon.errors` is in `tbon`, and so is the empty `tbon.overlay` package itself)."""

EXCEPTIONS: dict[tuple[str, str], str] = {}
"""(file, imported name as reported) -> why that import against the layers is allowed. None is:
an upward need is met by moving a rule or a value down, or by passing it in."""

LEVEL = {package: level for level, layer in enumerate(LAYERS) for package in layer}


def package_of(module: str) -> str | None:
    """The package of LAYERS that `module` belongs to; None for anything not tbon's."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if (name := ".".join(parts[:end])) in LEVEL:
            return name
    return None


def source_folders() -> dict[str, Path]:
    """Each top import name and the folder that holds it, from pyproject.toml's package-dir."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {
        name: ROOT / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()
    }


def modules() -> Iterator[tuple[str, Path]]:
    """(import name, file) for every module of tbon/, keys/ and overlay/. cli/ is the top layer:
    whatever it imports is below it."""
    for name, folder in source_folders().items():
        if name == "tbon.cli":
            continue
        for path in sorted(folder.rglob("*.py")):
            parts = [*name.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, module imported) for every import in the file, in line order; for `from X import
    y`, X.y, which is in X's package whether y is a submodule or a name."""
    is_package = path.name == "__init__.py"
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per dot after one
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.append((node.lineno, base if alias.name == "*" else f"{base}.{alias.name}"))
        elif isinstance(node, ast.Call) and _names_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((node.lineno, first.value))
    return sorted(found)


def _names_import_module(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("import_module", "__import__")


def upward_imports() -> Iterator[tuple[str, str, str]]:
    """(file:line, imported module, why it is wrong) for each import of a higher layer, or of
    another package of the same layer."""
    for module, path in modules():
        own = package_of(module)
        assert own is not None, f"{path} is in no layer"
        for line, imported in imports(module, path):
            other = package_of(imported)
            if other is None or other == own or LEVEL[other] < LEVEL[own]:
                continue
            where = "above" if LEVEL[other] > LEVEL[own] else "beside"
            why = f"{_short(other)} is {where} {_short(own)}"
            yield f"{path.relative_to(ROOT)}:{line}", imported, why


def _short(package: str) -> str:
    return package.removeprefix("tbon.overlay.")


def test_no_module_imports_a_higher_layer() -> None:
    found = [(where, imported, why) for where, imported, why in upward_imports()]
    wrong = [
        f"{where}: import {imported} ({why})"
        for where, imported, why in found
        if (where.partition(":")[0], imported) not in EXCEPTIONS
    ]
    assert not wrong, "imports against docs/design.md §13:\n" + "\n".join(wrong)
    used = {(where.partition(":")[0], imported) for where, imported, _ in found}
    assert not set(EXCEPTIONS) - used, "exceptions that no import needs any more"


def test_every_package_of_overlay_is_in_a_layer() -> None:
    folder = source_folders()["tbon.overlay"]
    packages = {f"tbon.overlay.{p.parent.name}" for p in folder.glob("*/__init__.py")}
    layered = {name for name in LEVEL if name.startswith("tbon.overlay.")}
    assert packages == layered, "overlay/'s packages and LAYERS (and docs/design.md §13) differ"
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert packages <= set(listed), "a package missing from pyproject.toml is not installed"


def test_the_layers_are_those_design_md_states() -> None:
    overlay = [layer for layer in LAYERS if layer[0].startswith("tbon.overlay.")]
    rule = " < ".join(", ".join(name.rpartition(".")[2] for name in layer) for layer in overlay)
    assert rule in (ROOT / "docs" / "design.md").read_text(), rule


def test_the_check_sees_lazy_relative_and_type_only_imports(tmp_path: Path) -> None:
    """The checker itself: each form of import is found, and resolved to the package it names."""
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import importlib\n"
        "if TYPE_CHECKING:\n"
        "    from tbon.overlay.broker.broker import Broker\n"
        "def f():\n"
        "    from ..services import flub\n"
        "    importlib.import_module('tbon.overlay.launch.local')\n"
        "from . import hello\n"
    )
    found = list(imports("tbon.overlay.links.mod", source))
    assert [(line, package_of(name)) for line, name in found if name.startswith("tbon")] == [
        (4, "tbon.overlay.broker"),
        (6, "tbon.overlay.services"),
        (7, "tbon.overlay.launch"),
        (8, "tbon.overlay.links"),
    ]
