"""The layers of the package, checked on the source: every import goes to its own layer or one below, the package
root (which imports the runtime) is imported by no module, and no module passes 400 lines.

The order (docs/extending.md, "Layers"): core facts -> graph passes -> build and run -> workflows -> CLI. A
module belongs to the layer of the longest name below that is its own name or a package above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400

LAYERS = (
    ("core facts", ("tvmfuse.version", "tvmfuse.errors", "tvmfuse.tensors", "tvmfuse.targets", "tvmfuse.threads",
                    "tvmfuse.heap", "tvmfuse.host", "tvmfuse.tvmscript",
                    "tvmfuse.cuda_driver", "tvmfuse.progress", "tvmfuse.zoo", "tvmfuse.patterns", "tvmfuse.schedules",
                    "tvmfuse.quant", "tvmfuse.tune.database", "tvmfuse.tune.log_files", "tvmfuse.tune.workload_index",
                    "tvmfuse.tune.records", "tvmfuse.tune.shared_form", "tvmfuse.tune.runs")),
    ("graph passes", ("tvmfuse.frontend", "tvmfuse.passes")),
    ("build and run", ("tvmfuse.export", "tvmfuse.link", "tvmfuse.scratch", "tvmfuse.library_file",
                       "tvmfuse.blob_object", "tvmfuse.cache", "tvmfuse.runtime", "tvmfuse.opcheck",
                       "tvmfuse.tune.measure", "tvmfuse.tune.workers", "tvmfuse.tune.validate")),
    ("workflows", ("tvmfuse.api", "tvmfuse.cached_build", "tvmfuse.calibration", "tvmfuse.partition_report",
                   "tvmfuse.model_info", "tvmfuse.corpus", "tvmfuse.tune", "tvmfuse.comparison", "tvmfuse.fuzz")),
    ("cli", ("tvmfuse.cli", "tvmfuse.cli_recorded", "tvmfuse.__main__", "tvmfuse.comparison.cli", "tvmfuse.tune.cli",
             "tvmfuse.cache.cli")),
)
PACKAGE_ROOT = "tvmfuse"  # the facade (compile, load, ...): for users, never imported by tvmfuse's modules


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "schedules":  # packaged as tvmfuse.schedules
        parts = ["tvmfuse"] + parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in ("tvmfuse", "schedules") for p in sorted((ROOT / folder).rglob("*.py"))}


def layer_of(name: str) -> int | None:
    """The layer index of module ``name`` (None for the package root)."""
    best, level = "", None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > len(best):
                best, level = prefix, index
    return level


def imports(name: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every tvmfuse module ``name`` imports, at any depth of the file (function-level too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "tvmfuse"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "tvmfuse":
                continue
            for alias in node.names:  # ``from . import api`` imports the module tvmfuse.api
                candidate = f"{target}.{alias.name}"
                found.append((node.lineno, candidate if candidate in known else target))
    return found


def upward_imports(mods: dict[str, Path]) -> list[str]:
    known = set(mods)
    bad = []
    for name, path in mods.items():
        own = layer_of(name)
        if own is None:
            continue
        for line, target in imports(name, path, known):
            theirs = layer_of(target)
            where = f"{path.name}:{line}: {name} ({LAYERS[own][0]})"
            if target == PACKAGE_ROOT:
                bad.append(f"{where} imports the package root; import the module itself")
            elif theirs is not None and theirs > own:
                bad.append(f"{where} imports {target} ({LAYERS[theirs][0]})")
    return bad


def test_every_module_has_a_layer():
    assert not [name for name in modules() if name != PACKAGE_ROOT and layer_of(name) is None]


def test_no_module_imports_a_layer_above_its_own():
    bad = upward_imports(modules())
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_check_fails_on_a_planted_upward_import(tmp_path):
    planted = {"tvmfuse.targets": tmp_path / "targets.py", "tvmfuse.api": tmp_path / "api.py",
               "tvmfuse.quant.table": tmp_path / "table.py"}
    planted["tvmfuse.targets"].write_text("def f():\n    from .api import compile\n")
    planted["tvmfuse.api"].write_text("from . import targets\n")
    planted["tvmfuse.quant.table"].write_text("from .. import __version__\n")
    bad = upward_imports(planted)
    assert len(bad) == 2
    assert "targets.py:2: tvmfuse.targets (core facts) imports tvmfuse.api (workflows)" in bad
    assert "table.py:1: tvmfuse.quant.table (core facts) imports the package root; import the module itself" in bad


def too_long(path: Path) -> str | None:
    lines = len(path.read_text().splitlines())
    return f"{path.name} has {lines} lines: split it" if lines > MAX_LINES else None


@pytest.mark.parametrize("path", sorted(modules().values()), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_at_most_400_lines(path):
    assert too_long(path) is None, too_long(path)


def test_the_size_check_fails_on_a_long_module(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_LINES + 1))
    assert too_long(long) == "long.py has 401 lines: split it"
    long.write_text("x = 1\n" * MAX_LINES)
    assert too_long(long) is None


def mutual_imports(mods: dict[str, Path]) -> list[str]:
    """Pairs of modules that import each other (a package and its own submodules aside)."""
    known = set(mods)
    edges = {name: {target for _, target in imports(name, path, known)} for name, path in mods.items()}
    return sorted(f"{a} <-> {b}" for a in edges for b in edges[a]
                  if a < b and a in edges.get(b, ()) and not (b.startswith(a + ".") or a.startswith(b + ".")))


def test_no_two_modules_import_each_other():
    assert not mutual_imports(modules())


def test_the_cycle_check_fails_on_a_planted_pair(tmp_path):
    planted = {"tvmfuse.cli": tmp_path / "cli.py", "tvmfuse.comparison.cli": tmp_path / "compare_cli.py"}
    planted["tvmfuse.cli"].write_text("from .comparison.cli import add_parser\n")
    planted["tvmfuse.comparison.cli"].write_text("def f():\n    from ..cli import parse_shape\n")
    assert mutual_imports(planted) == ["tvmfuse.cli <-> tvmfuse.comparison.cli"]


def _defined_names(path: Path) -> set[str]:
    """Names a module binds at its top level (definitions, assignments, imports), and what its ``__getattr__``
    may answer is not counted: a name a module only serves lazily must be imported from its own module."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def missing_imports(mods: dict[str, Path]) -> list[str]:
    """``from tvmfuse... import name`` (function-level ones too) whose module does not exist, or that names neither
    a submodule nor a top-level name of it: what a moved module leaves behind."""
    bad = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "tvmfuse" or target == PACKAGE_ROOT:
                continue
            if target not in mods:
                bad.append(f"{path.name}:{node.lineno}: {name} imports {target}, which does not exist")
                continue
            for alias in node.names:
                if alias.name != "*" and f"{target}.{alias.name}" not in mods \
                        and alias.name not in _defined_names(mods[target]):
                    bad.append(f"{path.name}:{node.lineno}: {name} imports {alias.name} from {target}, which has none")
    return bad


def test_every_import_names_something_that_exists():
    bad = missing_imports(modules())
    assert not bad, "imports of nothing:\n" + "\n".join(bad)


def test_the_import_check_finds_a_moved_module(tmp_path):
    planted = dict(modules())
    planted["tvmfuse.frontend.stale"] = tmp_path / "stale.py"
    planted["tvmfuse.frontend.stale"].write_text("def f():\n    from ..schedules import recurrence\n"
                                                 "    from ..schedules.computes.winograd import nothing_here\n")
    bad = missing_imports(planted)
    assert bad == ["stale.py:2: tvmfuse.frontend.stale imports recurrence from tvmfuse.schedules, which has none",
                   "stale.py:3: tvmfuse.frontend.stale imports nothing_here from tvmfuse.schedules.computes.winograd, "
                   "which has none"]
