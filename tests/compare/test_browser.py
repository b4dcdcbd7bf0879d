"""`tvmfuse compare`'s index.html in a real browser: headless Chromium draws it (not blank) and its DOM holds
the summary table and the SVG plots, with no script element made from a model-supplied name.

Skipped where no ``chromium`` (or ``chromium-browser``) is on PATH; CI installs Debian's ``chromium``.
``TVMFUSE_REGEN_GOLDEN=1`` also refreshes ``docs/compare-report.png``, the picture of the page in docs/comparing.md.
"""

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tvmfuse.comparison.render_html import render_html

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TIMEOUT_S = 60
WIDTH, HEIGHT = 1280, 3000
DOCS_HEIGHT = 1600  # docs/comparing.md's picture: the top of the page (summary and the first plots)

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium or chromium-browser on PATH")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The fixture's ``index.html`` in a temp dir, and a Chromium profile dir beside it."""
    folder = tmp_path_factory.mktemp("compare-page")
    data = json.loads((DATA / "report.json").read_text())
    (folder / "index.html").write_text(render_html(data), encoding="utf-8")
    return folder, data


def chromium(folder: Path, *args: str) -> str:
    """Run headless Chromium on ``folder/index.html``; its stdout. Its whole process group dies afterwards."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={folder / 'profile'}", *args, (folder / "index.html").as_uri()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium took more than {TIMEOUT_S} s: {' '.join(cmd)}")
    finally:
        # Chromium's helpers (zygote, GPU, network service) share its session: end them all, whatever happened.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, f"chromium exited {proc.returncode}:\n{err.decode(errors='replace')[-2000:]}"
    return out.decode("utf-8", errors="replace")


def test_page_draws_something(page):
    import matplotlib.image

    folder, _ = page
    png = folder / "shot.png"
    chromium(folder, f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={png}")
    pixels = matplotlib.image.imread(png)[..., :3]
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    ink = (pixels < 0.94).any(axis=-1).mean()
    colours = len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    assert ink > 0.05, f"only {ink:.1%} of the page is not white"
    assert colours > 500, f"only {colours} distinct colours: text, tables and plots should give thousands"
    if os.environ.get("TVMFUSE_REGEN_GOLDEN") == "1":
        from PIL import Image

        top = Image.open(png).convert("RGB").crop((0, 0, WIDTH, DOCS_HEIGHT))
        top.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
            ROOT / "docs" / "compare-report.png", optimize=True)


def test_dom_has_the_summary_and_the_plots(page):
    folder, data = page
    dom = chromium(folder, "--dump-dom")
    summary = dom.split('<table id="summary">', 1)[1].split("</table>", 1)[0]
    for row in data["contenders"]:
        assert f"<td>{row['name']}</td>" in summary
    for fid in ("plot-latency", "plot-speedup", "plot-kinds", "plot-roofline"):
        figure = dom.split(f'<figure id="{fid}">', 1)[1].split("</figure>", 1)[0]
        assert "<svg" in figure and "</svg>" in figure
    assert "<script" not in dom and "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
