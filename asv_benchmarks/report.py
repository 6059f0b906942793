"""The asv results as one HTML page that renders with no network: ``make bench-report``.

asv's own site (``asv publish``) loads jQuery, flot and Bootstrap from CDNs and shows nothing
offline. This page is built from the same results (``asv.results``), with no script and no
external file: inline CSS, each series drawn as an inline SVG line over the commits, values
in tables. It lists, per machine and environment:

* the latest commit's change against the one before it, per row, slowest first; a row more
  than ``--factor`` times its previous value is marked ``slower`` (every row's value is
  lower-is-better, as asv assumes);
* every benchmark: its unit, and for each parameter set the values over the commits.

    python asv_benchmarks/report.py asv_benchmarks/.asv/results asv_benchmarks/.asv/report
"""

from __future__ import annotations

import argparse
import html
import itertools
import json
import math
import pathlib
import sys
import time
from collections import defaultdict

from asv import results as asv_results

STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: right; font-size: 90%; }
td.name, th.name { text-align: left; }
tr.slower td { background: #fdd; }
tr.faster td { background: #dfd; }
svg { vertical-align: middle; }
h2 { border-bottom: 2px solid #444; }
"""


def fmt(value, unit):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if unit == "seconds":
        for scale, name in ((1, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
            if value >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value / 1e-9:.3g} ns"
    if unit == "bytes":
        return f"{value / 2**20:.4g} MiB"
    return f"{value:.4g}"


def sparkline(values, width=160, height=28):
    """An inline SVG polyline of ``values`` (None: a gap), scaled to its own range."""
    found = [v for v in values if v is not None]
    if len(found) < 2:
        return ""
    low, high = min(found), max(found)
    span = (high - low) or 1.0
    step = width / max(1, len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (v - low) / span * (height - 4):.1f}" for i, v in enumerate(values) if v is not None
    )
    return (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{points}"/></svg>'
    )


def load(results_dir):
    """``{(machine, env): {commit: (date, {benchmark: {params: value}})}}`` and the benchmarks' descriptions."""
    results_dir = pathlib.Path(results_dir)
    benchmarks = json.loads((results_dir / "benchmarks.json").read_text())
    benchmarks.pop("version", None)
    found = defaultdict(dict)
    for root, filename, machine in asv_results.iter_results_paths(str(results_dir)):
        result = asv_results.Results.load(str(pathlib.Path(root) / filename), machine_name=machine)
        values = {}
        for key in result.get_all_result_keys():
            params = result.get_result_params(key)
            value = result.get_result_value(key, params)
            combos = [", ".join(c) for c in itertools.product(*params)] if params else [""]
            values[key] = dict(zip(combos, value if isinstance(value, list) else [value]))
        found[(machine, result.env_name)][result.commit_hash] = (result.date or 0, values)
    return found, benchmarks


def render(found, benchmarks, factor=1.1):
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>posenc benchmarks</title><style>{STYLE}</style></head><body>"]
    parts.append("<h1>posenc benchmarks</h1>")
    parts.append(f"<p>From asv's results; generated {html.escape(time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()))}. "
                 f"Every value is lower-is-better; a row is marked <em>slower</em> beyond {factor}x its previous commit's value.</p>")
    if not found:
        parts.append("<p>No results yet: run <code>make bench-record</code> (or <code>asv run</code>) first.</p>")
    for (machine, env), commits in sorted(found.items()):
        order = sorted(commits, key=lambda c: commits[c][0])
        parts.append(f"<h2>{html.escape(machine)} &middot; {html.escape(env)}</h2>")
        parts.append("<p>Commits, oldest first: " + ", ".join(
            f"<code>{c[:8]}</code> ({time.strftime('%Y-%m-%d', time.gmtime(commits[c][0] / 1000))})" for c in order) + "</p>")
        series = defaultdict(list)  # (benchmark, params) -> values in commit order
        for commit in order:
            values = commits[commit][1]
            for key in sorted(set().union(*(commits[c][1] for c in order))):
                for combo in sorted(set().union(*(commits[c][1].get(key, {}) for c in order))):
                    value = values.get(key, {}).get(combo)
                    series[(key, combo)].append(None if value is None or value != value else value)
        parts.append(changes(series, benchmarks, order, factor))
        parts.append(every_benchmark(series, benchmarks, order))
    parts.append("</body></html>")
    return "\n".join(parts)


def changes(series, benchmarks, order, factor):
    if len(order) < 2:
        return "<p>One commit measured: no changes to show.</p>"
    rows = []
    for (key, combo), values in series.items():
        before, after = values[-2], values[-1]
        if before and after:
            rows.append((after / before, key, combo, before, after))
    rows.sort(reverse=True)
    out = [f"<h3>Latest commit <code>{order[-1][:8]}</code> against <code>{order[-2][:8]}</code></h3>",
           "<table><tr><th class='name'>benchmark</th><th class='name'>parameters</th><th>before</th><th>after</th><th>ratio</th><th class='name'>change</th></tr>"]
    for ratio, key, combo, before, after in rows:
        unit = benchmarks.get(key, {}).get("unit", "")
        mark = "slower" if ratio > factor else "faster" if ratio < 1 / factor else ""
        out.append(f"<tr class='{mark}'><td class='name'>{html.escape(key)}</td><td class='name'>{html.escape(combo)}</td>"
                   f"<td>{fmt(before, unit)}</td><td>{fmt(after, unit)}</td><td>{ratio:.3f}</td><td class='name'>{mark}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def every_benchmark(series, benchmarks, order):
    out = ["<h3>Every benchmark</h3>"]
    for key in sorted({k for k, _ in series}):
        info = benchmarks.get(key, {})
        unit = info.get("unit", "")
        names = ", ".join(info.get("param_names", []))
        out.append(f"<h4 id='{html.escape(key)}'>{html.escape(key)} <small>({html.escape(unit)}{'; ' + html.escape(names) if names else ''})</small></h4>")
        out.append("<table><tr><th class='name'>parameters</th>" + "".join(f"<th>{c[:8]}</th>" for c in order) + "<th>over the commits</th></tr>")
        for (k, combo), values in sorted(series.items()):
            if k != key:
                continue
            cells = "".join(f"<td>{fmt(v, unit)}</td>" for v in values)
            out.append(f"<tr><td class='name'>{html.escape(combo) or '-'}</td>{cells}<td>{sparkline(values)}</td></tr>")
        out.append("</table>")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="asv's results directory (asv.conf.json's results_dir)")
    parser.add_argument("out", help="directory for index.html (created)")
    parser.add_argument("--factor", type=float, default=1.1, help="mark rows slower beyond this ratio (default 1.1)")
    args = parser.parse_args(argv)
    found, benchmarks = load(args.results) if (pathlib.Path(args.results) / "benchmarks.json").exists() else ({}, {})
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(render(found, benchmarks, args.factor), encoding="utf-8")
    print(f"bench-report: wrote {out / 'index.html'} (no network needed to view it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
