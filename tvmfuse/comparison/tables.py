"""The comparison report's tables, built once from ``report.json`` for both renderers.

A :class:`Table` holds plain-text cells (no markup, nothing escaped): ``render_md`` escapes them for
Markdown, ``render_html`` through Jinja2's autoescape, so both outputs show the same numbers. Rows are
grouped by device, since a ratio never crosses devices. Formatting helpers (``ms``, ``ratio_ci``, ...)
live here too, so the plots and both renderers spell a number the same way.
"""

from __future__ import annotations

import dataclasses
import math

DASH = "—"


@dataclasses.dataclass
class Column:
    """A column: its ``title`` and ``style`` (``text``, ``code``, ``num``, ``status`` or ``notes``)."""

    title: str
    style: str = "text"


@dataclasses.dataclass
class Row:
    """A row of plain-text cells; ``marks`` flag it (``fastest``, ``outside``, ``aa``, ``total``)."""

    cells: list[str]
    marks: tuple[str, ...] = ()


@dataclasses.dataclass
class Group:
    """Rows sharing a device (``label``; None when the table has a single unlabelled group)."""

    label: str | None
    rows: list[Row]


@dataclasses.dataclass
class Table:
    """A table: ``id`` (an HTML id), ``title``, ``columns``, row ``groups`` and ``notes`` (sentences shown under it)."""

    id: str
    title: str
    columns: list[Column]
    groups: list[Group]
    notes: list[str] = dataclasses.field(default_factory=list)


# --- numbers ---------------------------------------------------------------------------------------------


def sig3(x) -> str:
    """``x`` to 3 significant digits, without an exponent from 0.001 up (``3.10``, ``45.2``, ``1,380``)."""
    if x is None:
        return DASH
    x = float(f"{float(x):.3g}")
    if x == 0:
        return "0"
    if abs(x) < 1e-3:
        return f"{x:.2e}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def ms(x) -> str:
    """Milliseconds, 3 significant digits."""
    return sig3(x)


def err(x) -> str:
    """An error magnitude: ``2.3e-06``, ``0.41``, ``0``."""
    if x is None:
        return DASH
    if x == 0:
        return "0"
    return f"{x:.2g}" if abs(x) >= 0.01 else f"{x:.1e}"


def pct(fraction) -> str:
    """A fraction as a percentage: ``75%``, ``98.4%``."""
    if fraction is None:
        return DASH
    return "100%" if fraction == 1 else f"{100 * fraction:.1f}%"


def size(nbytes) -> str:
    """A byte count: ``1.76 MiB``, ``245 KiB``."""
    if nbytes is None:
        return DASH
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.2f} MiB"
    return f"{nbytes / 2**10:.0f} KiB" if nbytes >= 2**10 else f"{nbytes} B"


def times(x) -> str:
    """A ratio: ``1.21x`` (3 significant digits below 0.1)."""
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.3g}x"


def ratio_ci(r: dict, with_baseline: bool = False) -> str:
    """A ``ratios`` entry as ``1.21x [1.18, 1.24]`` (and ``vs <baseline>`` on request)."""
    lo, hi = r["ci"]
    text = f"{times(r['ratio'])} [{lo:.2f}, {hi:.2f}]"
    return f"{text} vs {r['baseline']}" if with_baseline else text


def noise(r: dict) -> float:
    """Half-width, in percent, of the band around 1 an A/A ratio and its interval span."""
    lo, hi = r["ci"]
    return 100 * max(abs(hi - 1), abs(1 - lo), abs(r["ratio"] - 1))


# --- reading the report ----------------------------------------------------------------------------------


def loads(values) -> str:
    """Load averages, ``0.12 / 0.20 / 0.31``."""
    return " / ".join(f"{x:.2f}" for x in values) if values else DASH


def count(x) -> str:
    """An integer count, or a dash."""
    return DASH if x is None else str(x)


def devices(rows: list[dict]) -> list[str]:
    """The devices of ``rows``, in order of first appearance."""
    return list(dict.fromkeys(r.get("device") or DASH for r in rows))


def by_device(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """``rows`` grouped by device (first-appearance order, command order within a device)."""
    return [(d, [r for r in rows if (r.get("device") or DASH) == d]) for d in devices(rows)]


def outside_tolerance(row: dict) -> bool:
    """Whether the row was checked and failed its tolerance."""
    c = row.get("correctness") or {}
    return c.get("within_tolerance") is False


def fastest(data: dict, row: dict) -> bool:
    """Whether ``data["fastest"]`` names the row (a row outside tolerance never is the fastest).

    Keys are devices, or ``device [host]`` in a merged report; names are unique across the report.
    """
    return row["name"] in (data.get("fastest") or {}).values() and not outside_tolerance(row)


def profiled(rows: list[dict], peers: bool) -> list[dict]:
    """Rows with a profile: the peers' (``peers=True``) or the tvmfuse builds' (arms and A/A twins)."""
    return [r for r in rows if r.get("profile") and (r.get("kind") == "peer") == peers]


def kind_times(profile: dict) -> dict[str, float]:
    """Microseconds per kernel kind (a peer's operator type), largest first."""
    out: dict[str, float] = {}
    for k in profile.get("kernels") or []:
        kind = k.get("kind") or k.get("name") or "?"
        out[kind] = out.get(kind, 0.0) + (k.get("us") or 0.0)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def share(kernel: dict, end_to_end_us) -> float | None:
    """A profile row's share of the end-to-end time (its own ``share`` when present)."""
    if kernel.get("share") is not None:
        return kernel["share"]
    return (kernel.get("us") or 0.0) / end_to_end_us if end_to_end_us else None


def fused(ops) -> str:
    """A kernel's fused operators, ``conv2d + add + clip``."""
    if not ops:
        return DASH
    return ops if isinstance(ops, str) else " + ".join(str(o) for o in ops)


# --- the tables ------------------------------------------------------------------------------------------


def present(pairs) -> list[tuple[str, str]]:
    """The (label, value) pairs whose value is known, as text."""
    return [(k, str(v)) for k, v in pairs if v is not None and v != "" and v != []]


def merged(entry: dict) -> str:
    """One ``merged_from`` entry: its host and run."""
    return f"{(entry.get('environment') or {}).get('host', DASH)} {entry.get('run', '')}".strip()


def facts(data: dict) -> list[tuple[str, str]]:
    """What was compared: model, its digest and inputs, samples, date and seed (those the report has)."""
    model = data.get("model") or {}
    inputs = ", ".join(f"{i.get('name')} {i.get('dtype')} {list(i.get('shape') or [])}"
                       for i in model.get("inputs") or [])
    samples = None
    if model.get("samples") is not None:
        samples = f"{model['samples']} ({'labelled' if model.get('labels') else 'no labels'})"
    sha = model.get("sha256") or ""
    return present([("model", model.get("source")), ("sha256", sha[:16] + ("…" if len(sha) > 16 else "")),
                    ("inputs", inputs), ("samples", samples), ("created", data.get("created")),
                    ("seed", data.get("seed"))])


def environment(data: dict) -> list[tuple[str, str]]:
    """The machine, the settings and the versions, as (label, value) pairs (those the report has)."""
    env, settings = data.get("environment") or {}, data.get("settings") or {}
    versions = [f"{k} {v or DASH}" for k, v in (env.get("versions") or {}).items()]
    versions += [f"python {env['python']}"] if env.get("python") else []
    load = None
    if env.get("load_before") or env.get("load_after"):
        load = f"{loads(env.get('load_before'))}  →  {loads(env.get('load_after'))}"
    roof, roofline = env.get("roofline"), None
    if roof:
        how = f" ({roof['how']})" if roof.get("how") else ""
        roofline = f"{sig3(roof.get('bandwidth_gbs'))} GB/s, {sig3(roof.get('peak_gflops'))} GFLOP/s{how}"
    measurement = []
    if settings.get("baseline"):
        measurement.append(f"baseline {settings['baseline']}")
    if settings.get("budget_s") is not None:
        measurement.append(f"timing budget {sig3(settings['budget_s'])} s")
    if settings.get("target_ci") is not None:
        measurement.append(f"target CI ±{pct(settings['target_ci'])}")
    return present([("host", env.get("host")), ("CPU", env.get("cpu")), ("cores", env.get("cores")),
                    ("threads", settings.get("threads")), ("load before / after (1, 5, 15 min)", load),
                    ("versions", ", ".join(versions)), ("roofline", roofline), ("measurement", ", ".join(measurement)),
                    ("INT8 calibration", settings.get("calibration")),
                    ("merged from", "; ".join(merged(m) for m in data.get("merged_from") or []))])


def summary(data: dict) -> Table:
    """One row per contender: status, latency percentiles, ratio to the baseline, correctness, marks."""
    rows = data.get("contenders") or []
    ratios = {r["contender"]: r for r in data.get("ratios") or []}
    baselines = {r["baseline"] for r in ratios.values()}
    lat = [r["latency"] for r in rows if r.get("latency")]
    cor = [r["correctness"] for r in rows if r.get("correctness")]
    show = {"p99": any(x.get("p99") is not None for x in lat),
            "fp32": any(c.get("fp32_agreement") is not None for c in cor),
            "acc": any(c.get("accuracy") is not None for c in cor),
            "run": len({r.get("run") for r in rows if r.get("latency")}) > 1}
    one_base = next(iter(baselines)) if len(baselines) == 1 else None
    cols = [Column("contender"), Column("status", "status")]
    cols += [Column("run")] if show["run"] else []
    cols += [Column("p50 ms", "num"), Column("p90 ms", "num")] + ([Column("p99 ms", "num")] if show["p99"] else [])
    cols += [Column(f"latency vs {one_base}" if one_base else "latency vs baseline", "num"),
             Column("max abs err", "num"), Column("top-1 agr.", "num")]
    cols += [Column("fp32 agr.", "num")] if show["fp32"] else []
    cols += [Column("accuracy", "num")] if show["acc"] else []
    cols.append(Column("notes", "notes"))
    groups = []
    for device, members in by_device(rows):
        out = []
        for r in members:
            lt, c = r.get("latency") or {}, r.get("correctness") or {}
            if r["name"] in ratios:
                rel = ratio_ci(ratios[r["name"]], with_baseline=one_base is None)
            else:
                rel = "baseline" if r["name"] in baselines else DASH
            cells = [r["name"], r.get("status") or DASH]
            cells += [r.get("run") or DASH] if show["run"] else []
            cells += [ms(lt.get("p50")), ms(lt.get("p90"))] + ([ms(lt.get("p99"))] if show["p99"] else [])
            cells += [rel, err(c.get("max_abs_err")), pct(c.get("top1_agreement"))]
            cells += [pct(c.get("fp32_agreement"))] if show["fp32"] else []
            cells += [pct(c.get("accuracy"))] if show["acc"] else []
            notes = []
            if outside_tolerance(r):
                notes.append(c.get("tolerance") or "")
            notes.append(r.get("reason") or "")
            t = r.get("threads") or {}
            if t.get("read_back") is not None and t.get("read_back") != t.get("requested"):
                notes.append(f"{t['read_back']} threads read back ({t.get('requested')} requested)")
            cells.append("; ".join(n for n in notes if n))
            marks = tuple(m for m, on in (("fastest", fastest(data, r)), ("outside", outside_tolerance(r)),
                                          ("aa", r.get("kind") == "aa")) if on)
            out.append(Row(cells, marks))
        groups.append(Group(device, out))
    return Table("summary", "Summary", cols, groups, summary_notes(data))


def summary_notes(data: dict) -> list[str]:
    """The A/A noise floor and the fastest row per device, in words."""
    rows = data.get("contenders") or []
    ratios = {r["contender"]: r for r in data.get("ratios") or []}
    notes = []
    for r in rows:
        if r.get("kind") == "aa" and r["name"] in ratios:
            q = ratios[r["name"]]
            notes.append(f"Noise floor: {r['name']} is {q['baseline']} measured again as a separate contender; "
                         f"its ratio {ratio_ci(q)} puts the noise floor at ±{noise(q):.1f}%: "
                         "smaller differences on this device are not real.")
    names = {r["name"]: r for r in rows}
    for device, name in (data.get("fastest") or {}).items():
        if name in names and fastest(data, names[name]):
            notes.append(f"{name} is the fastest on {device} among the rows within tolerance.")
    return notes


def build(data: dict) -> Table | None:
    """Compile time, library size and kernel counts of every row that was built."""
    rows = [r for r in data.get("contenders") or [] if r.get("build")]
    if not rows:
        return None
    cols = [Column("contender"), Column("target", "code"), Column("tuning logs", "code"), Column("compile s", "num"),
            Column("library", "code"), Column("size", "num"), Column("kernels", "num"),
            Column("tuned kernels", "num"), Column("tvmfuse kernels", "num")]
    groups = []
    for device, members in by_device(rows):
        out = []
        for r in members:
            b = r["build"]
            out.append(Row([r["name"], r.get("target") or DASH, str(r.get("logs") or DASH), sig3(b.get("seconds")),
                            b.get("library") or DASH, size(b.get("library_bytes")), count(b.get("kernels")),
                            count(b.get("tuned_kernels")), count(b.get("tvmfuse_kernels"))]))
        groups.append(Group(device, out))
    return Table("build-table", "Build", cols, groups)


def totals(profiles: list[dict]) -> list[Row]:
    """The ``unattributed`` and ``end-to-end`` rows closing a profile table (one us cell per profile)."""
    return [Row(["unattributed"] + [sig3(p.get("unattributed_us")) for p in profiles], ("total",)),
            Row(["end-to-end"] + [sig3(p.get("end_to_end_us")) for p in profiles], ("total",))]


def kernels(data: dict) -> list[Table]:
    """Per device, the kernels of every profiled tvmfuse build lined up by kernel name (us per inference)."""
    tables = []
    for device, members in by_device(profiled(data.get("contenders") or [], peers=False)):
        profiles = [r["profile"] for r in members]
        info: dict[str, dict] = {}
        us: dict[str, list[float | None]] = {}
        for i, p in enumerate(profiles):
            for k in p.get("kernels") or []:
                name = str(k.get("name"))
                info.setdefault(name, {"kind": k.get("kind"), "fused": fused(k.get("fused_ops")), "schedule": []})
                if k.get("schedule") and k["schedule"] not in info[name]["schedule"]:
                    info[name]["schedule"].append(k["schedule"])
                cells = us.setdefault(name, [None] * len(profiles))
                cells[i] = (cells[i] or 0.0) + (k.get("us") or 0.0)
        # The first build's kernels, slowest first, then each other build's own kernels the same way.
        order = []
        for i in range(len(profiles)):
            order += sorted((n for n in us if us[n][i] is not None and n not in order), key=lambda n: (-us[n][i], n))
        cols = [Column("kernel", "code"), Column("kind", "code"), Column("fused ops"), Column("schedule")]
        cols += [Column(f"{r['name']} us", "num") for r in members]
        rows = [Row([n, str(info[n]["kind"] or DASH), info[n]["fused"], " / ".join(info[n]["schedule"]) or DASH]
                    + [sig3(x) for x in us[n]]) for n in order]
        rows += [Row(t.cells[:1] + ["", "", ""] + t.cells[1:], t.marks) for t in totals(profiles)]
        sources = "; ".join(dict.fromkeys(f"{p.get('source', DASH)}, {p.get('runs', DASH)} runs" for p in profiles))
        tables.append(Table(f"kernels-table-{len(tables) + 1}", "Kernels", cols, [Group(device, rows)],
                            [f"Microseconds per inference, summed over a kernel's calls ({sources})."]))
    return tables


def peer_profiles(data: dict) -> list[Table]:
    """One table per profiled peer: its own profiler's time per operator type."""
    tables = []
    for r in profiled(data.get("contenders") or [], peers=True):
        p = r["profile"]
        e2e = p.get("end_to_end_us") or 0.0
        cols = [Column("operator", "code"), Column("calls", "num"), Column("us", "num"), Column("share", "num")]
        ks = sorted(p.get("kernels") or [], key=lambda k: (-(k.get("us") or 0.0), str(k.get("name"))))
        rows = [Row([str(k.get("name")), str(k.get("calls", DASH)), sig3(k.get("us")), pct(share(k, e2e))]) for k in ks]
        un = p.get("unattributed_us")
        rows += [Row(["unattributed", "", sig3(un), pct(un / e2e) if un is not None and e2e else DASH], ("total",)),
                 Row(["end-to-end", "", sig3(p.get("end_to_end_us")), "100%"], ("total",))]
        tables.append(Table(f"peer-table-{len(tables) + 1}", f"{r['name']} profile (by operator type)", cols,
                            [Group(None, rows)], [f"From {p.get('source', DASH)}, {p.get('runs', DASH)} runs on "
                                                  f"{r.get('device') or DASH}; microseconds per inference."]))
    return tables


def time_by_kind(data: dict) -> list[Table]:
    """Per device, each profiled tvmfuse build's time per kernel kind, with its share of the end-to-end time."""
    tables = []
    for device, members in by_device(profiled(data.get("contenders") or [], peers=False)):
        profiles = [r["profile"] for r in members]
        per = [kind_times(p) for p in profiles]
        kinds = list(dict.fromkeys(k for t in per for k in t))  # each build's kinds, largest first
        cols = [Column("kind", "code")] + [Column(f"{r['name']} us", "num") for r in members]

        def cell(us, p):
            e2e = p.get("end_to_end_us")
            return DASH if us is None else f"{sig3(us)} ({pct(us / e2e) if e2e else DASH})"

        rows = [Row([k] + [cell(t.get(k), p) for t, p in zip(per, profiles)]) for k in kinds]
        rows += [Row(["unattributed"] + [cell(p.get("unattributed_us"), p) for p in profiles], ("total",)),
                 Row(["end-to-end"] + [sig3(p.get("end_to_end_us")) for p in profiles], ("total",))]
        tables.append(Table(f"kinds-table-{len(tables) + 1}", "Time by kind", cols, [Group(device, rows)],
                            ["Microseconds per inference (share of end-to-end); peers' operator types are in their "
                             "own profiles."]))
    return tables
