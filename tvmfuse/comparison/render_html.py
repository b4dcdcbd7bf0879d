"""``index.html``: the comparison report as one self-contained HTML5 page.

The page opens offline and references nothing: CSS inline, plots as inline SVG (:mod:`tvmfuse.comparison.plots`),
no script, no link, no image file. The tables are :mod:`tvmfuse.comparison.tables`, the same ones
``report.md`` shows; the template (:mod:`tvmfuse.comparison.template`) is rendered by Jinja2 with autoescape on,
so a contender or kernel named ``<script>...`` prints as text.
"""

from __future__ import annotations

from . import plots, tables
from .template import CSS, TEMPLATE

MARKS = {"fastest": "fastest", "outside": "✗ outside tolerance", "aa": "A/A: noise floor"}
STATUSES = {"measured", "build-only", "failed"}


def status_class(status: str) -> str:
    """The badge class of a status: ``measured``, ``build-only``, ``failed``, or ``other``."""
    return status if status in STATUSES else "other"


def environment():
    """The Jinja2 environment: autoescape on, undefined names an error, blocks trimmed."""
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.globals.update(zip=zip, status_class=status_class, marks=MARKS, dash=tables.DASH)
    return env


def render_html(data: dict) -> str:
    """Render a ``tvmfuse.compare/1`` report as a self-contained HTML page.

    Parameters
    ----------
    data : dict
        The report (``report.json``, see :mod:`tvmfuse.comparison.report`).

    Returns
    -------
    str
        The HTML document; the same input gives the same text.
    """
    template = environment().from_string(TEMPLATE)
    figures = plots.all_plots(data)
    return template.render(
        schema=data.get("schema", tables.DASH), model=(data.get("model") or {}).get("source", tables.DASH),
        command=data.get("command") or "", facts=tables.facts(data), environment=tables.environment(data),
        summary=tables.summary(data), build=tables.build(data), kernels=tables.kernels(data),
        peers=tables.peer_profiles(data), kinds=tables.time_by_kind(data), plots=figures,
        plots_kernels=any(name in figures for name in ("kinds", "roofline")), css=CSS)
