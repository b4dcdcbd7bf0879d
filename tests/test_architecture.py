"""The architecture's two rules, checked on the source: targets are answered by backends, families by the
registry (``schedules/families.py``), and the extension recipes in docs/extending.md name real files."""

import ast
import re
from pathlib import Path

import pytest

from tvmfuse import targets
from tvmfuse.schedules import families

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = {ROOT / "schedules" / name for name in targets.backend_names()}

# Branching on the target kind, or naming a backend, anywhere but targets.py and the backends themselves.
TARGET_KIND = [
    r"\.is_cpu\b", r"\.is_cuda\b",
    r"""(kind|kind\.name|\[["']kind["']\]|get\(["']kind["']\))\s*(==|!=|in)\s*[("']*["'](llvm|cuda)["']""",
    r"schedules\.(x86|cuda)\b", r"schedules import .*\b(x86|cuda)\b", r"from \.+(x86|cuda)\b",
]


def _sources():
    for folder in ("tvmfuse", "schedules"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, path.read_text()


def _outside_backends(path: Path) -> bool:
    return path != ROOT / "tvmfuse" / "targets.py" and not any(b in path.parents for b in BACKENDS)


def test_no_module_outside_targets_and_backends_branches_on_the_target_kind():
    found = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
             for path, text in _sources() if _outside_backends(path)
             for i, line in enumerate(text.splitlines(), 1)
             if any(re.search(p, line) for p in TARGET_KIND)]
    assert not found, "target-kind branches outside the backends:\n" + "\n".join(found)


def test_the_grep_finds_what_it_is_meant_to_find():
    assert re.search(TARGET_KIND[0], "if spec.is_cpu:")
    assert re.search(TARGET_KIND[2], 'if target.kind.name == "llvm":')
    assert re.search(TARGET_KIND[4], "from tvmfuse.schedules import x86")


def test_anchor_ops_are_listed_once():
    anchors = [f'"{op}"' for op in families.ANCHOR_OPS]
    for path, text in _sources():
        if path.name == "families.py":
            continue
        for op in anchors:
            # fold_bn and fold_scale match the conv2d that a batch-norm or a constant scale follows: op
            # patterns, not the anchor list.
            if op in text and not (path.name in ("fold_bn.py", "fold_scale.py") and op == '"relax.nn.conv2d"'):
                pytest.fail(f"{path.relative_to(ROOT)} spells anchor op {op}: read families.ANCHOR_OPS")


def test_the_family_is_decided_in_one_function():
    """``groups`` decides conv2d / depthwise / grouped only in families.family_of (Winograd's own condition,
    a plain conv, and TransposeConvToConv's, a plain *transposed* conv, are the other comparisons)."""
    depthwise = r"groups\)? == (in_channels|int\(.*shape\[1\]\)|data\[1\])"
    for path, text in _sources():
        if path.name == "families.py":
            continue
        compares = [ast.unparse(n) for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Compare)]
        assert not any(re.search(depthwise, c) for c in compares), path
        assert path.name in ("winograd.py", "conv_transpose.py") or not any(
            re.search(r"groups\)? == 1\b", c) for c in compares), path


def test_every_kernel_a_compute_names_is_registered():
    names = set(families.KERNELS)
    assert {"conv2d", "conv2d_nchwc", "conv2d_winograd", "depthwise_conv2d", "depthwise_conv2d_nchwc",
            "group_conv2d", "dense"} <= names
    for family in families.FAMILIES.values():
        assert callable(family.fp32_compute()) and family.flops is not None
        if family.int8 is not None:
            assert families.int8_kernel_name(family) in names
            assert callable(families.resolve(family.int8.compute))


def test_every_registered_rule_module_exists():
    for kernel in families.KERNELS.values():
        for backend, module in kernel.rules.items():
            assert (ROOT / "schedules" / backend / f"{module}.py").is_file(), (kernel.name, backend, module)


def test_every_named_target_names_a_backend_folder():
    assert targets.backend_names() == ["cuda", "x86"]
    for name in targets.names():
        spec = targets.resolve(name)
        cls = targets.backend_class(spec.backend_name)
        assert cls.name == spec.backend_name and (ROOT / "schedules" / cls.name / "__init__.py").is_file()
    for kind, name in targets.KIND_BACKENDS.items():  # what a raw dict of each kind compiles with
        assert name in targets.backend_names(), kind


@pytest.mark.parametrize("recipe", ["Adding an op family", "Adding a target"])
def test_recipes_name_files_that_exist(recipe):
    text = (ROOT / "docs" / "extending.md").read_text()
    section = text.split(f"## {recipe}", 1)[1].split("\n## ", 1)[0]
    paths = re.findall(r"`((?:tvmfuse|schedules|tests|docs)/[\w/.<>-]+)`", section)
    assert paths, recipe
    for path in paths:
        if "<" not in path:  # a placeholder such as schedules/<backend>/
            assert (ROOT / path).exists(), f"{recipe} names {path}, which does not exist"


def _name_literals(text: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every string constant in ``text`` that is exactly a family's or a kernel's name."""
    return [(n.lineno, n.value) for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names]


REGISTERED = set(families.FAMILIES) | set(families.KERNELS) | set(families.ROW_FAMILIES)


def test_family_and_kernel_names_are_spelled_only_in_the_registry():
    """A pass or a compute asks the entry (``family.matmul``, ``family.grouped``, ``families.DENSE``...) instead
    of comparing names: adding a family then touches the registry, its compute and its rules only."""
    found = [f"{path.relative_to(ROOT)}:{line}: {name!r}" for path, text in _sources() if path.name != "families.py"
             for line, name in _name_literals(text, REGISTERED)]
    assert not found, "family or kernel names spelled outside schedules/families.py:\n" + "\n".join(found)


def test_the_family_literal_check_finds_a_planted_one():
    planted = 'def weight_axis(family):\n    return 1 if family.name == "dense" else 0\n'
    assert _name_literals(planted, REGISTERED) == [(2, "dense")]
    kinds = 'KINDS = {"depthwise_conv2d_nchwc": 1, "nchw": 2}'
    assert _name_literals(kinds, REGISTERED) == [(1, "depthwise_conv2d_nchwc")]
    assert not _name_literals('"""conv2d and dense in a docstring"""\nname = f"int8_{family.name}"', REGISTERED)
