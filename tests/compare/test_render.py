"""`tvmfuse compare`'s renderers: golden report.md and index.html from a hand-made report.json, escaping of
model-supplied names, no external reference in the page, deterministic well-formed SVG plots.

Regenerate the goldens after an intended change with
``TVMFUSE_REGEN_GOLDEN=1 python -m pytest tests/compare/test_render.py`` and read the diff.
"""

import copy
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tvmfuse.comparison import plots
from tvmfuse.comparison.render_html import render_html
from tvmfuse.comparison.render_md import render_markdown
from tvmfuse.comparison.report import Report

DATA = Path(__file__).parent / "data"
REGEN = os.environ.get("TVMFUSE_REGEN_GOLDEN") == "1"
XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
FIGURES = ["plot-latency", "plot-speedup", "plot-kinds", "plot-roofline"]
FIGURE_SVG = re.compile(r'(<figure id="(plot-[\w-]+)">\s*)<svg\b.*?</svg>', re.S)


@pytest.fixture
def data():
    return json.loads((DATA / "report.json").read_text())


@pytest.fixture(scope="module")
def page():
    """The fixture's ``index.html``, rendered once for the tests that only read it."""
    return render_html(json.loads((DATA / "report.json").read_text()))


def without_svg(html: str) -> str:
    """The page with each plot's SVG replaced by ``<svg>[plot-id]</svg>`` (matplotlib versions change its bytes)."""
    out = FIGURE_SVG.sub(r"\1<svg>[\2]</svg>", html)
    assert out.count("<svg") == out.count("<svg>["), "an <svg> outside a <figure id=plot-...>"
    return out


def svgs(html: str) -> dict[str, str]:
    return {m.group(2): m.group(0)[len(m.group(1)):] for m in FIGURE_SVG.finditer(html)}


def check_golden(name: str, text: str) -> None:
    path = DATA / name
    if REGEN:
        path.write_text(text)
    expected = path.read_text() if path.exists() else ""
    assert text == expected, (f"tests/compare/data/{name} differs from the renderer's output. If the change is "
                              "intended, regenerate it with TVMFUSE_REGEN_GOLDEN=1 python -m pytest "
                              "tests/compare/test_render.py and review the diff.")


def pipes(line: str) -> int:
    """The unescaped ``|`` in a Markdown table line: its cell count plus one."""
    return len(re.findall(r"(?<!\\)\|", line))


def summary_html(html: str) -> str:
    return re.search(r'<table id="summary">.*?</table>', html, re.S).group(0)


def test_markdown_matches_golden(data):
    check_golden("expected.md", render_markdown(data))


def test_html_matches_golden(page):
    check_golden("expected.html", without_svg(page))


def test_rendering_twice_gives_the_same_bytes(data):
    assert render_markdown(data) == render_markdown(copy.deepcopy(data))
    assert render_html(data) == render_html(copy.deepcopy(data))


def test_html_references_nothing_outside_itself(page):
    html = page
    assert not re.search(r"https?:|file:|ftp:", html, re.I)
    assert not re.search(r"(?<![\w*/])//[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+", html), "a protocol-relative URL"
    for needle in ("src=", "<script", "<link", "<img", "<iframe", "<object", "<embed", "@import"):
        assert needle not in html.lower(), needle
    assert re.findall(r"url\(([^)]*)\)", html) == [u for u in re.findall(r"url\(([^)]*)\)", html) if u.startswith("#")]
    for ref in re.findall(r'href="([^"]*)"', html):
        assert ref.startswith("#"), ref


def test_script_named_kernel_is_escaped_everywhere(data, page):
    html = page
    assert XSS not in html and XSS_ESCAPED in html
    kinds = svgs(html)["plot-kinds"]
    assert XSS_ESCAPED in kinds, "the kind shows in the legend, escaped"
    for svg in svgs(html).values():
        assert "<script" not in svg
    md = render_markdown(data)
    assert XSS in md
    # In Markdown the name only ever appears inside code spans, where it is literal text.
    assert "<script" not in re.sub(r"`[^`]*`", "", md)


def test_every_figure_is_present(page):
    html = page
    for fid in FIGURES:
        assert f'<figure id="{fid}">' in html
    assert set(svgs(html)) == set(FIGURES)


def test_summary_lists_every_contender(data, page):
    html, md = summary_html(page), render_markdown(data)
    first_cells = re.findall(r"<tr[^>]*><td>([^<]*)</td>", html)
    assert first_cells == [r["name"] for r in data["contenders"]]
    summary_md = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    for r in data["contenders"]:
        assert f"\n| {r['name']} | {r['status']} |" in summary_md
    assert "1.21x [1.20, 1.22]" in html and "1.21x [1.20, 1.22]" in summary_md


def test_marks_fastest_and_outside_tolerance(data, page):
    html = summary_html(page)
    assert '<tr class="fastest"><td>x86-avx512</td>' in html
    assert '<tr class="outside"><td>x86-avx512:int8</td>' in html
    assert '<tr class="aa"><td>x86-avx512 (A/A)</td>' in html
    # A row outside tolerance is never called fastest, even when the report says so.
    data["fastest"] = {data["contenders"][0]["device"]: "x86-avx512:int8"}
    html, md = summary_html(render_html(data)), render_markdown(data)
    assert "fastest" not in html
    assert "**fastest**" not in md and "is the fastest" not in md


def test_rows_not_measured_show_their_reason(data):
    row = next(r for r in data["contenders"] if r["name"] == "x86-host")
    row.update(status="failed", reason="segfault in tvmfuse_conv2d | exit 139", latency=None, correctness=None)
    md, html = render_markdown(data), summary_html(render_html(data))
    assert "| x86-host | failed |" in md and r"segfault in tvmfuse_conv2d \| exit 139" in md
    assert "status-failed" in html and "segfault in tvmfuse_conv2d | exit 139" in html
    assert "no CUDA device on this machine" in md and "no CUDA device on this machine" in html
    assert "openvino is not installed" in md


def test_rows_are_grouped_by_device(data, page):
    md = render_markdown(data)
    summary_md = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    cpu, cuda = summary_md.index("### cpu: AMD EPYC"), summary_md.index("### cuda: sm_90")
    assert cpu < summary_md.index("| onnxruntime |") < cuda < summary_md.index("| cuda-sm90 |")
    assert summary_html(page).count("<tbody>") == 2


def test_p99_column_only_when_some_row_has_one(data):
    assert "p99 ms" in render_markdown(data)
    for r in data["contenders"]:
        if r["latency"]:
            r["latency"]["p99"] = None
    md, html = render_markdown(data), render_html(data)
    assert "p99" not in md and "p99" not in summary_html(html)


def test_pipes_and_markup_in_names_cannot_break_a_markdown_table(data):
    rename = {"x86-host": "host|fast $x$ *y*", "onnxruntime": "ort`1`|2"}
    for r in data["contenders"]:
        r["name"] = rename.get(r["name"], r["name"])
    for q in data["ratios"]:
        q["contender"] = rename.get(q["contender"], q["contender"])
    data["contenders"][0]["profile"]["kernels"][0]["name"] = "kernel|one"
    md = render_markdown(data)
    blocks = [b.splitlines() for b in md.split("\n\n") if b.startswith("|")]
    assert len(blocks) == 7  # summary and build (a table per device), kernels, the peer's profile, kinds
    for block in blocks:
        assert all(pipes(line) == pipes(block[0]) for line in block), block
    assert r"host\|fast $x$ \*y\*" in md and r"`kernel\|one`" in md
    assert "host|fast $x$ *y*" in render_html(data)  # matplotlib drew the $...$ as text, not math


def test_minimal_report_renders():
    data = {"schema": "tvmfuse.compare/1", "model": {"source": "model.onnx"},
            "contenders": [{"name": "x86-host", "kind": "tvmfuse", "device": "cpu: x", "status": "measured",
                            "latency": {"rounds": [[1.0, 1.1], [1.05, 0.98]], "p50": 1.02, "p90": 1.09, "p99": None,
                                        "mean": 1.03, "samples": 4}}]}
    md, html = render_markdown(data), render_html(data)
    assert "| x86-host | measured | 1.02 | 1.09 |" in md and "## Kernels" not in md
    assert re.findall(r'<figure id="([\w-]+)"', html) == ["plot-latency"]
    assert 'id="summary"' in html and "Kernels" not in html
    assert plots.speedup(data) == plots.kinds(data) == plots.roofline(data) == ""
    empty = {"schema": "tvmfuse.compare/1", "contenders": []}
    assert render_markdown(empty).startswith("# tvmfuse compare") and "<svg" not in render_html(empty)


def test_plots_are_deterministic_well_formed_svg_without_urls(data):
    first, second = plots.all_plots(data), plots.all_plots(copy.deepcopy(data))
    assert list(first) == ["latency", "speedup", "kinds", "roofline"] and first == second
    ids = []
    for name, svg in first.items():
        root = ET.fromstring(svg)
        assert root.tag == "svg" and root.get("viewBox")
        assert not re.search(r"https?:|xmlns|<!DOCTYPE|<\?xml|<metadata|<!--|xlink:", svg)
        assert root.find(".//text") is not None, f"{name}: text should stay text (svg.fonttype none)"
        own = [e.get("id") for e in root.iter() if e.get("id")]
        assert all(i.startswith(f"{name}-") for i in own)
        for ref in re.findall(r'href="#([^"]+)"|url\(#([^)]+)\)', svg):
            assert (ref[0] or ref[1]) in own
        ids += own
    assert len(ids) == len(set(ids)), "ids repeat across the page's plots"


def test_speedup_title_names_the_baseline(page):
    svg = svgs(page)["plot-speedup"]
    assert ">speed-up over x86-avx512<" in svg


def test_report_write_uses_the_renderers(data, tmp_path):
    Report(data).write(tmp_path)
    assert (tmp_path / "report.md").read_text() == render_markdown(data)
    assert (tmp_path / "index.html").read_text() == render_html(data)
