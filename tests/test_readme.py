"""The README is a manual: it opens with the two set-up commands (the second is what .ci/run runs), its
"What is supported" table says what the registry holds, its links lead to files, and it stays short."""

from __future__ import annotations

import re
from pathlib import Path

from tvmfuse.schedules import families

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _supported() -> dict[str, str]:
    section = README.split("## What is supported", 1)[1].split("\n## ", 1)[0]
    return {m[1].strip(): m[2].strip() for m in re.finditer(r"^\| ([^|]+) \| ([^|]+) \|$", section, re.M)}


def _items(cell: str) -> list[str]:
    return [item.strip() for item in cell.split(",")]


def test_opens_with_the_two_set_up_commands_and_ci_runs_the_second():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert commands[0].startswith("pip install -e . && tvmfuse compile zoo:")
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_supported_table_is_the_registry():
    table = _supported()
    assert sorted(_items(table["fused kernels (op families)"])) == sorted(families.FAMILIES)
    assert sorted(_items(table["row kernels"])) == sorted(families.ROW_FAMILIES)
    int8 = sorted(name for name, family in families.FAMILIES.items() if family.int8 is not None)
    assert sorted(_items(table["INT8 kernels"])) == int8
    epilogues = _items(table["epilogues folded into a kernel"])
    assert set(families.ACTIVATIONS) <= set(epilogues) and "residual add" in epilogues


def test_the_check_fails_on_a_stale_table(monkeypatch):
    monkeypatch.setitem(families.FAMILIES, "pool2d", families.FAMILIES["dense"])
    try:
        test_supported_table_is_the_registry()
    except AssertionError:
        return
    raise AssertionError("a family missing from the README went unnoticed")


def test_links_lead_to_files_and_the_manual_is_short():
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links and all((ROOT / link).exists() for link in links), [l for l in links if not (ROOT / l).exists()]
    assert len(README.splitlines()) <= 220
    for page in (ROOT / "docs").glob("*.md"):  # the pages' own relative links too
        for link in re.findall(r"\]\(([^)#:]+)\)", page.read_text()):
            assert (page.parent / link).exists(), (page.name, link)
