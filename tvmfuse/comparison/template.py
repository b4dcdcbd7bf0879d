"""The Jinja2 template of ``index.html`` (a string, so the package needs no data files).

Self-contained: inline CSS, inline SVG plots, no script, no external reference. Rendered with autoescape
on, so every model-supplied name is escaped; only the plots' SVG (built by matplotlib, which escapes its
text) is marked safe.
"""

CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --head: #f6f8fa; --group: #eef2f6;
        --red: #cf222e; --red-bg: #ffebe9; --green: #1a7f37; --green-bg: #dafbe1; --blue: #0969da; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #fff; line-height: 1.45; font-size: 15px;
       font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", "Noto Sans", "Liberation Sans",
                    Arial, sans-serif; }
main { max-width: 1280px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 26px; margin: 0 0 12px; }
h1 code { font-size: 0.9em; }
h2 { font-size: 20px; margin: 36px 0 10px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
h3 { font-size: 16px; margin: 22px 0 8px; }
code, pre { font-family: ui-monospace, SFMono-Regular, "SF Mono", Menlo, Consolas, "Liberation Mono", monospace;
            font-size: 13px; }
pre.command { background: var(--head); border: 1px solid var(--line); border-radius: 6px; padding: 10px 14px;
              white-space: pre-wrap; word-break: break-all; margin: 0 0 12px; }
.facts { color: var(--muted); margin: 0; }
.facts span { margin-right: 18px; white-space: nowrap; }
.facts b { color: var(--fg); font-weight: 600; }
dl.env { display: grid; grid-template-columns: max-content 1fr max-content 1fr; gap: 3px 16px; margin: 0;
         font-size: 14px; }
dl.env dt { color: var(--muted); }
dl.env dd { margin: 0; }
.wrap { overflow-x: auto; }
table { border-collapse: collapse; font-size: 13.5px; margin: 4px 0 10px; }
table code { font-size: 12.5px; }
th, td { padding: 5px 9px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top;
         white-space: nowrap; }
td.notes { white-space: normal; min-width: 240px; }
thead th { background: var(--head); border-bottom: 2px solid var(--line); font-weight: 600; vertical-align: bottom; }
tbody th.group { background: var(--group); font-weight: 600; padding: 6px 10px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:hover td { background: #f6f8fa; }
tr.total td { font-weight: 600; background: #fafbfc; }
tr.outside td:first-child { box-shadow: inset 4px 0 0 var(--red); }
tr.fastest td:first-child { box-shadow: inset 4px 0 0 var(--green); }
tr.aa td { color: var(--muted); }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600;
         white-space: nowrap; line-height: 18px; }
.status-measured { background: var(--green-bg); color: #116329; }
.status-build-only { background: #fff8c5; color: #7d4e00; }
.status-failed { background: var(--red-bg); color: #a40e26; }
.status-other { background: #eaeef2; color: #424a53; }
.mark-fastest { background: var(--green); color: #fff; }
.mark-outside { background: var(--red); color: #fff; }
.mark-aa { background: #ddf4ff; color: var(--blue); }
p.note { color: var(--muted); margin: 4px 0 8px; max-width: 980px; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 18px; margin: 14px 0;
         align-items: start; }
figure { margin: 0; padding: 10px; border: 1px solid var(--line); border-radius: 8px; background: #fff; }
figure svg { display: block; width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
footer { margin-top: 40px; color: var(--muted); font-size: 13px; }
"""

TEMPLATE = """\
{%- macro table(t, heading=True) -%}
{% if heading %}<h3>{{ t.title }}</h3>
{% endif %}
<div class="wrap"><table{% if t.id %} id="{{ t.id }}"{% endif %}>
<thead><tr>{% for c in t.columns %}<th{% if c.style == "num" %} class="num"{% endif %}>{{ c.title }}</th>{% endfor %}</tr></thead>
{% for g in t.groups %}
<tbody>
{% if g.label is not none %}<tr><th class="group" colspan="{{ t.columns | length }}">{{ g.label }}</th></tr>
{% endif %}
{% for r in g.rows %}
<tr{% if r.marks %} class="{{ r.marks | join(' ') }}"{% endif %}>
{%- for v, c in zip(r.cells, t.columns) -%}
{%- if c.style == "num" %}<td class="num">{{ v }}</td>
{%- elif c.style == "status" %}<td><span class="badge status-{{ status_class(v) }}">{{ v }}</span></td>
{%- elif c.style == "notes" %}<td class="notes">{% for m in r.marks if m in marks %}<span class="badge mark-{{ m }}">{{ marks[m] }}</span> {% endfor %}{{ v }}</td>
{%- elif c.style == "code" and v and v != dash and "total" not in r.marks %}<td><code>{{ v }}</code></td>
{%- else %}<td>{{ v }}</td>
{%- endif -%}
{%- endfor -%}
</tr>
{% endfor %}
</tbody>
{% endfor %}
</table></div>
{% for n in t.notes %}<p class="note">{{ n }}</p>
{% endfor %}
{%- endmacro -%}
{%- macro figure(name, caption) -%}
{% if name in plots %}<figure id="plot-{{ name }}">
{{ plots[name] | safe }}<figcaption>{{ caption }}</figcaption>
</figure>
{% endif %}
{%- endmacro -%}
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tvmfuse compare: {{ model }}</title>
<style>{{ css | safe }}</style>
</head>
<body>
<main>
<h1>tvmfuse compare: <code>{{ model }}</code></h1>
{% if command %}<pre class="command">{{ command }}</pre>
{% endif %}
{% if facts %}<p class="facts">{% for k, v in facts %}<span>{{ k }} <b>{{ v }}</b></span> {% endfor %}</p>
{% endif %}
{% if environment %}

<h2 id="environment">Environment</h2>
<dl class="env">
{% for k, v in environment %}<dt>{{ k }}</dt><dd>{{ v }}</dd>
{% endfor %}
</dl>
{% endif %}

<h2>Summary</h2>
{{ table(summary, heading=False) }}
{% if "latency" in plots or "speedup" in plots %}
<div class="plots">
{{ figure("latency", "Every raw sample of every round; boxes span the quartiles, whiskers the range.") }}
{{ figure("speedup", "Baseline latency over contender latency, paired per round, with its 95% interval; green is faster, red slower, grey within noise or the A/A twin.") }}
</div>
{% endif %}
{% if build %}

<h2 id="build">Build</h2>
{{ table(build, heading=False) }}
{% endif %}
{% if kernels or peers or kinds or plots_kernels %}

<h2 id="kernels">Kernels</h2>
{% if plots_kernels %}<div class="plots">
{{ figure("kinds", "Time per inference by kernel kind (a peer's by operator type): the largest kinds, the rest as other, and the time no kernel accounts for.") }}
{{ figure("roofline", "Each profiled tvmfuse kernel at its arithmetic intensity (FLOPs over the bytes of its arguments, a lower bound on its traffic) and its throughput, under the memory-bandwidth slope and the compute peak. The slope is one thread copying 128 MB, out of cache: a kernel whose arguments stay in cache, or that streams on several threads, sits above it; one above the peak would be a miscount.") }}
</div>
{% endif %}
{% for t in kernels %}{{ table(t, heading=False) }}{% endfor %}
{% for t in peers %}{{ table(t) }}{% endfor %}
{% if kinds %}

<h2 id="time-by-kind">Time by kind</h2>
{% for t in kinds %}{{ table(t, heading=False) }}{% endfor %}
{% endif %}
{% endif %}
<footer>Rendered from report.json (schema {{ schema }}); the same tables are in report.md.</footer>
</main>
</body>
</html>
"""
