"""The comparison report's plots, as inline SVG strings for ``index.html``.

Each plot is a function of the report's ``data`` returning an ``<svg>`` element, or ``""`` when the report
holds nothing to plot. The SVG is deterministic (the same report gives the same bytes: fixed hash salt, no
date) and carries no URL: the XML declaration, the DOCTYPE, the ``<metadata>`` block, comments and the
``xmlns`` attributes are stripped (inline SVG in HTML5 needs none of them) and ``xlink:href`` becomes
``href``. Text stays text (``svg.fonttype = "none"``); element ids are prefixed with the plot's name so
several plots can share one page. Figures are built on ``matplotlib.figure.Figure`` with no pyplot, so no
global backend state is touched; math-text parsing is off, so a ``$`` in a name prints as itself.
"""

from __future__ import annotations

import io
import math
import re

import numpy as np

from . import tables

COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#64B5CD"]
OTHER, UNATTRIBUTED = "#C8C8C8", "#7F7F7F"
RC = {"svg.hashsalt": "tvmfuse-compare", "svg.fonttype": "none", "text.parse_math": False, "font.size": 9,
      "font.family": "sans-serif", "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial"],
      "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.color": "#E5E5E5",
      "grid.linewidth": 0.6, "axes.axisbelow": True, "axes.edgecolor": "#888888", "axes.titlesize": 11,
      "axes.titleweight": "bold", "legend.frameon": False}
TOP_KINDS = 8


def figure(rows: int, height: float, width: float = 5.8):
    """A constrained-layout figure with ``rows`` stacked axes (a list), built without pyplot."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(rows, 1, squeeze=False)[:, 0]
    return fig, list(axes)


def to_svg(fig, name: str) -> str:
    """Save ``fig`` as SVG and clean it for inline use: no prolog, metadata, comments, namespaces or URLs."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = re.sub(r"<!--.*?-->\s*", "", svg, flags=re.S)

    def tag(m: re.Match) -> str:
        # Inside tags only (a name in a <text> could read id="..."; matplotlib escapes < and > everywhere else).
        t = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", m.group(0)).replace("xlink:href=", "href=")
        # Ids unique across the page: prefix every id and every reference to one.
        t = re.sub(r'\bid="([^"]+)"', rf'id="{name}-\1"', t)
        t = re.sub(r'href="#([^"]+)"', rf'href="#{name}-\1"', t)
        return re.sub(r"url\(#([^)]+)\)", rf"url(#{name}-\1)", t)

    svg = re.sub(r"<[^>]+>", tag, svg)
    return svg.strip() + "\n"


def render(draw, data: dict, name: str) -> str:
    """Run ``draw(data)`` (which returns a figure or None) under the report's fixed style; its SVG or ``""``."""
    import matplotlib

    with matplotlib.rc_context(RC):
        fig = draw(data)
        return "" if fig is None else to_svg(fig, name)


def plain_log(ax, axis: str) -> None:
    """A log axis whose ticks read ``0.1``, ``1``, ``10`` (math text is off, so no ``10^x`` labels)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    getattr(ax, f"set_{axis}scale")("log")
    axis = getattr(ax, f"{axis}axis")
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def short(device) -> str:
    """A device without its parenthesised details: ``cpu: AMD EPYC``."""
    return label(str(device).split(" (", 1)[0])


def label(name) -> str:
    """A name as axis text: one line, at most 40 characters."""
    text = " ".join(str(name).split())
    return text if len(text) <= 40 else text[:39] + "…"


# --- latency -----------------------------------------------------------------------------------------------


def draw_latency(data: dict):
    groups = [(d, [r for r in rows if (r.get("latency") or {}).get("rounds")])
              for d, rows in tables.by_device(data.get("contenders") or [])]
    groups = [(d, rows) for d, rows in groups if rows]
    if not groups:
        return None
    fig, axes = figure(len(groups), 0.9 + sum(0.42 * len(rows) + 0.5 for _, rows in groups))
    rng = np.random.default_rng(0)
    for ax, (device, rows) in zip(axes, groups):
        samples = [np.array([x for rnd in r["latency"]["rounds"] for x in rnd], dtype=float) for r in rows]
        pos = np.arange(len(rows))[::-1]
        style = dict(positions=pos, widths=0.55, whis=(0, 100), showfliers=False, patch_artist=True,
                     medianprops={"color": "#222222"}, boxprops={"facecolor": "#DCE6F2", "edgecolor": "#4C72B0"})
        try:
            ax.boxplot(samples, orientation="horizontal", **style)
        except TypeError:  # matplotlib before 3.10
            ax.boxplot(samples, vert=False, **style)
        for p, s, r in zip(pos, samples, rows):
            colour = "#C44E52" if tables.outside_tolerance(r) else "#4C72B0"
            ax.scatter(s, p + rng.uniform(-0.18, 0.18, s.size), s=7, color=colour, alpha=0.55, linewidths=0)
        ax.set_yticks(pos, [label(r["name"]) for r in rows])
        lo, hi = min(s.min() for s in samples), max(s.max() for s in samples)
        if lo > 0 and hi / lo > 10:
            plain_log(ax, "x")
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("latency per inference (ms)")
        ax.set_title(f"latency distribution, all samples ({short(device)})", loc="left")
    return fig


def latency(data: dict) -> str:
    """Every raw latency sample of every measured contender (box and points), one panel per device."""
    return render(draw_latency, data, "latency")


# --- speed-up ----------------------------------------------------------------------------------------------


def draw_speedup(data: dict):
    ratios = [r for r in data.get("ratios") or [] if r.get("ratio")]
    if not ratios:
        return None
    groups = [(d, [r for r in ratios if (r.get("device") or tables.DASH) == d]) for d in tables.devices(ratios)]
    baselines = list(dict.fromkeys(r["baseline"] for r in ratios))
    kinds = {r["name"]: r for r in data.get("contenders") or []}
    fig, axes = figure(len(groups), 1.0 + sum(0.38 * len(rows) + 0.5 for _, rows in groups))
    for ax, (device, rows) in zip(axes, groups):
        pos = np.arange(len(rows))[::-1]
        for p, r in zip(pos, rows):
            s, lo, hi = 1 / r["ratio"], 1 / r["ci"][1], 1 / r["ci"][0]
            row = kinds.get(r["contender"], {})
            if row.get("kind") == "aa" or lo <= 1 <= hi:
                colour = "#8C8C8C"
            else:
                colour = "#55A868" if s > 1 else "#C44E52"
            ax.errorbar([s], [p], xerr=[[s - lo], [hi - s]], fmt="o", color=colour, ms=6, capsize=4, lw=1.6)
            mark = "  (outside tolerance)" if tables.outside_tolerance(row) else ""
            ax.annotate(f"{s:.2f}x{mark}", (hi, p), xytext=(6, 0), textcoords="offset points", va="center",
                        fontsize=8, color="#333333")
        ax.axvline(1.0, color="#333333", lw=1, ls="--")
        names = [label(r["contender"]) + ("" if len(baselines) == 1 else f" vs {label(r['baseline'])}") for r in rows]
        ax.set_yticks(pos, names)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        xs = [1.0] + [1 / r["ci"][1] for r in rows] + [1 / r["ci"][0] for r in rows]
        ax.set_xlim(min(xs) - 0.06 * (max(xs) - min(xs) + 0.1), max(xs) + 0.35 * (max(xs) - min(xs) + 0.1))
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("speed-up (baseline latency / contender latency; > 1 is faster), 95% CI")
        base = label(baselines[0]) if len(baselines) == 1 else "baseline"
        ax.set_title(f"speed-up over {base}" + (f" ({short(device)})" if len(groups) > 1 else ""), loc="left")
    return fig


def speedup(data: dict) -> str:
    """``1 / ratio`` per ``data["ratios"]`` entry with its confidence interval, and a line at 1."""
    return render(draw_speedup, data, "speedup")


# --- time by kind ------------------------------------------------------------------------------------------


def draw_kinds(data: dict):
    rows = [r for r in data.get("contenders") or [] if r.get("profile")]
    if not rows:
        return None
    per = [tables.kind_times(r["profile"]) for r in rows]
    total: dict[str, float] = {}
    for t in per:
        for k, us in t.items():
            total[k] = total.get(k, 0.0) + us
    top = sorted(total, key=lambda k: (-total[k], k))[:TOP_KINDS]
    series = [(label(k), COLOURS[i % len(COLOURS)], [t.get(k, 0.0) / 1e3 for t in per]) for i, k in enumerate(top)]
    other = [sum(us for k, us in t.items() if k not in top) / 1e3 for t in per]
    if any(other):
        series.append(("other", OTHER, other))
    series.append(("unattributed", UNATTRIBUTED, [(r["profile"].get("unattributed_us") or 0.0) / 1e3 for r in rows]))
    fig, (ax,) = figure(1, 1.5 + 0.45 * len(rows) + 0.2 * math.ceil(len(series) / 3))
    pos = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    for name, colour, values in series:
        ax.barh(pos, values, left=left, height=0.6, color=colour, label=name, edgecolor="white", linewidth=0.5)
        left += np.array(values)
    ax.set_yticks(pos, [label(r["name"]) + (" (peer)" if r.get("kind") == "peer" else "") for r in rows])
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("time per inference (ms): kernel kinds; a peer's operator types")
    ax.set_title("time by kernel kind", loc="left")
    fig.legend(loc="outside lower center", ncol=3, fontsize=8)
    return fig


def kinds(data: dict) -> str:
    """Stacked bars of each profiled contender's time by kernel kind (top kinds, other, unattributed)."""
    return render(draw_kinds, data, "kinds")


# --- roofline ----------------------------------------------------------------------------------------------


def draw_roofline(data: dict):
    points = []
    for r in tables.profiled(data.get("contenders") or [], peers=False):
        ks = [k for k in r["profile"].get("kernels") or [] if (k.get("flops") or 0) > 0 and (k.get("bytes") or 0) > 0
              and (k.get("gflops") or k.get("us"))]
        if ks:
            x = [k["flops"] / k["bytes"] for k in ks]
            y = [k["gflops"] if k.get("gflops") else k["flops"] / k["us"] / 1e3 for k in ks]
            points.append((r["name"], x, y))
    if not points:
        return None
    fig, (ax,) = figure(1, 4.4)
    xs = [v for _, x, _ in points for v in x]
    ys = [v for _, _, y in points for v in y]
    roof = (data.get("environment") or {}).get("roofline") or {}
    bw, peak = roof.get("bandwidth_gbs"), roof.get("peak_gflops")
    x0, x1 = min(xs) / 3, max(xs) * 3
    if bw and peak:
        x0, x1 = min(x0, peak / bw / 3), max(x1, peak / bw * 3)
        grid = np.geomspace(x0, x1, 200)
        ax.plot(grid, np.minimum(peak, bw * grid), color="#333333", lw=1.4, zorder=1)
        ax.text(x0 * 1.15, bw * x0 * 1.35, f"{tables.sig3(bw)} GB/s (1-thread copy, DRAM)", fontsize=8,
                color="#333333")
        ax.text(peak / bw * 1.1, peak * 1.12, f"peak {tables.sig3(peak)} GFLOP/s", fontsize=8, color="#333333")
        ys.append(peak)
    for i, (name, x, y) in enumerate(points):
        ax.scatter(x, y, s=28, color=COLOURS[i % len(COLOURS)], label=label(name), alpha=0.85,
                   edgecolors="white", linewidths=0.5, zorder=3)
    plain_log(ax, "x")
    plain_log(ax, "y")
    ax.set_xlim(x0, x1)
    ax.set_ylim(min(ys) / 3, max(ys) * 2.5)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of arguments)")
    ax.set_ylabel("GFLOP/s (GOP/s for int8)")
    ax.set_title("roofline: kernels", loc="left")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def roofline(data: dict) -> str:
    """Each profiled tvmfuse kernel at (FLOP/byte, GFLOP/s), log-log, under the machine's roofline."""
    return render(draw_roofline, data, "roofline")


PLOTS = [("latency", "Latency distribution", latency), ("speedup", "Speed-up", speedup),
         ("kinds", "Time by kind", kinds), ("roofline", "Roofline", roofline)]


def all_plots(data: dict) -> dict[str, str]:
    """Every plot with something to show, by name (``latency``, ``speedup``, ``kinds``, ``roofline``)."""
    out = {}
    for name, _, plot in PLOTS:
        svg = plot(data)
        if svg:
            out[name] = svg
    return out
