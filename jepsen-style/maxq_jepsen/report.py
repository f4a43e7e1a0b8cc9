"""The report: a summary table, results.json, and an HTML timeline per run (inline SVG, no packages).

Theory of operation: everything is drawn from the history and the checker's result, never from
the live run, so `run --check HISTORY` can redraw any past run. The timeline buckets the history
into one-second bins: publishes attempted, confirmed, failed/indeterminate, and deliveries
(redeliveries apart), with each fault window shaded and labelled by its nemesis, and kills,
pauses and heals marked. The last line printed is the one-line summary the CI greps:

    runs=2 confirmed=5230 lost=0 unexpected=0 duplicates=12 verdict=PASS
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from .checker import FAILED, FATAL_KINDS, PASS, UNKNOWN
from .history import FAIL, INFO, INVOKE, OK

BUCKET_S = 1.0
SVG_WIDTH, SVG_HEIGHT = 1000, 280
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 50, 20, 24, 36
SERIES = (  # key, label, colour
    ("publish_invoke", "published/s", "#9e9e9e"),
    ("publish_ok", "confirmed/s", "#2e7d32"),
    ("deliver", "delivered/s", "#1565c0"),  # dashed (below): it mostly covers the confirmed line
    ("deliver_redelivered", "redelivered/s", "#6a1b9a"),
    ("deliver_dead_letter", "dead-lettered/s", "#00838f"),  # deliveries that carry an x-death (dlx workload)
    ("publish_bad", "nacked+indeterminate/s", "#e65100"),
)
FAULT_COLOURS = {
    "kill": "#ef5350",
    "kill-leader": "#c62828",
    "pause": "#ffb300",
    "pause-leader": "#ff8f00",
    "partition-one": "#42a5f5",
    "partition-leader": "#1565c0",
    "partition-halves": "#7e57c2",
    "one-way": "#26a69a",
    "membership": "#8d6e63",
}


def overall_verdict(results: list[dict]) -> str:
    verdicts = [r.get("verdict", UNKNOWN) for r in results]
    if not verdicts:
        return UNKNOWN
    if FAILED in verdicts:
        return FAILED
    if UNKNOWN in verdicts:
        return UNKNOWN
    return PASS


def totals(results: list[dict]) -> dict:
    keys = (
        "published",
        "confirmed",
        "lost",
        "unexpected",
        "nacked_delivered",
        "corrupt",
        "fifo_violations",
        "minority_confirmed",
        "dead_letter_without_x_death",
        "received_after_delete",
        "recovered",
        "unknown",
        "duplicates",
        "duplicates_unflagged",
        "delivered",
    )
    return {k: sum(r.get("counts", {}).get(k, 0) for r in results) for k in keys}


def summary_line(results: list[dict]) -> str:
    t = totals(results)
    return (
        f"runs={len(results)} confirmed={t['confirmed']} lost={t['lost']} unexpected={t['unexpected']} "
        f"duplicates={t['duplicates']} verdict={overall_verdict(results)}"
    )


def _max_recovery(result: dict) -> str:
    values = [r["recovery_s"] for r in result.get("recovery_s", []) if r.get("recovery_s") is not None]
    missing = sum(1 for r in result.get("recovery_s", []) if r.get("recovery_s") is None)
    text = f"{max(values):.2f}" if values else "-"
    return text + (f" ({missing} none)" if missing else "")


def summary_table(results: list[dict]) -> str:
    header = (
        "run",
        "seed",
        "workload",
        "faults",
        "published",
        "confirmed",
        "lost",
        "unexp",
        "nack+dlv",
        "corrupt",
        "fifo",
        "minority",
        "dl-no-xdeath",
        "recovered",
        "dups(unflagged)",
        "avail",
        "max recov s",
        "verdict",
    )
    rows = [header]
    for i, r in enumerate(results, 1):
        c = r.get("counts", {})
        avail = r.get("availability", {}).get("all", {}).get("ratio")
        rows.append(
            (
                str(i),
                str(r.get("seed")),
                r.get("workload"),
                f"{r.get('faults', 0)} {'+'.join(r.get('nemeses') or [])}",
                str(c.get("published", 0)),
                str(c.get("confirmed", 0)),
                str(c.get("lost", 0)),
                str(c.get("unexpected", 0)),
                str(c.get("nacked_delivered", 0)),
                str(c.get("corrupt", 0)),
                str(c.get("fifo_violations", 0)),
                str(c.get("minority_confirmed", 0)),
                str(c.get("dead_letter_without_x_death", 0)),
                str(c.get("recovered", 0)),
                f"{c.get('duplicates', 0)}({c.get('duplicates_unflagged', 0)})",
                "-" if avail is None else f"{avail:.2f}",
                _max_recovery(r),
                r.get("verdict", UNKNOWN),
            )
        )
    rows = [tuple("-" if cell is None else str(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_details(result: dict) -> list[str]:
    """The lines worth reading under the table: what was fatal, with examples, and findings."""
    out = []
    seed = result.get("seed")
    for kind in FATAL_KINDS:
        n = result.get("counts", {}).get(kind, 0)
        if n:
            examples = result.get("examples", {}).get(kind, [])[:10]
            out.append(f"seed {seed}: {kind}={n} e.g. {json.dumps(examples)}")
    c = result.get("counts", {})
    if "by_dead_letter_only" in c:
        out.append(
            f"seed {seed}: routes: {c['by_work_queue_only']} ids from the work queue only, "
            f"{c['by_dead_letter_only']} dead-lettered (expired) only, {c['by_both_routes']} by both; "
            f"{c['dead_letter_deliveries']} deliveries from the dead-letter queue"
            + (
                f"; {c['x_death_count_above_one']} with an x-death count above 1"
                if c.get("x_death_count_above_one")
                else ""
            )
        )
    if c.get("duplicates_unflagged"):
        ids = result.get("examples", {}).get("duplicates_unflagged", [])[:10]
        out.append(
            f"seed {seed}: {c['duplicates_unflagged']} duplicate deliveries came with redelivered=false, "
            f"e.g. {json.dumps(ids)}"
        )
    if result.get("drain_complete") is False:
        out.append(f"seed {seed}: the final drain did not empty the queue: {json.dumps(result.get('drain'))}")
    for note in result.get("notes", []):
        out.append(f"seed {seed}: note: {note}")
    for finding in result.get("findings", []):
        out.append(f"seed {seed}: FINDING: {finding}")
    return out


# -- timeline -------------------------------------------------------------------------------


def timeline_data(records: list[dict]) -> dict:
    """Per-second counts, fault windows and nemesis markers from a history."""
    end = max((r.get("time", 0.0) for r in records), default=0.0)
    n = int(end // BUCKET_S) + 1
    series = {key: [0] * n for key, _, _ in SERIES}
    windows, markers = [], []
    open_fault = None
    for r in records:
        t, kind, f = r.get("time", 0.0), r.get("type"), r.get("f")
        b = min(n - 1, int(t // BUCKET_S))
        if f == "publish":
            if kind == INVOKE:
                series["publish_invoke"][b] += 1
            elif kind == OK:
                series["publish_ok"][b] += 1
            elif kind in (FAIL, INFO):
                series["publish_bad"][b] += 1
        elif f == "deliver" and kind == OK:
            series["deliver_redelivered" if r.get("redelivered") else "deliver"][b] += 1
            if r.get("x_death"):
                series["deliver_dead_letter"][b] += 1
        elif f == "phase" and kind == OK:
            value = r.get("value") or {}
            if open_fault is not None:
                windows.append({**open_fault, "end": t})
                open_fault = None
            if value.get("phase") == "fault":
                open_fault = {"start": t, "nemesis": value.get("nemesis", "?")}
            elif value.get("phase") in ("recover", "drain", "end"):
                markers.append({"time": t, "label": value["phase"]})
        elif r.get("process") == "nemesis" and kind == OK:
            markers.append({"time": t, "label": f})
    if open_fault is not None:
        windows.append({**open_fault, "end": end})
    return {"end": end, "bucket_s": BUCKET_S, "series": series, "windows": windows, "markers": markers}


def timeline_svg(data: dict, title: str) -> str:
    w, h = SVG_WIDTH, SVG_HEIGHT
    plot_w, plot_h = w - MARGIN_LEFT - MARGIN_RIGHT, h - MARGIN_TOP - MARGIN_BOTTOM
    end = max(data["end"], 1.0)
    top = max([1] + [max(values) if values else 0 for values in data["series"].values()])

    def x(t: float) -> float:
        return MARGIN_LEFT + plot_w * t / end

    def y(v: float) -> float:
        return MARGIN_TOP + plot_h * (1 - v / top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
        f'<text x="{MARGIN_LEFT}" y="14" font-weight="bold">{html.escape(title)}</text>',
    ]
    bottom = MARGIN_TOP + plot_h
    for window in data["windows"]:
        colour = FAULT_COLOURS.get(window["nemesis"], "#bdbdbd")
        name = html.escape(window["nemesis"])
        x0, width = x(window["start"]), max(1.0, x(window["end"]) - x(window["start"]))
        parts.append(
            f'<rect x="{x0:.1f}" y="{MARGIN_TOP}" width="{width:.1f}" height="{plot_h}" fill="{colour}" '
            f'fill-opacity="0.18"><title>{name} {window["start"]:.1f}-{window["end"]:.1f}s</title></rect>'
        )
        parts.append(f'<text x="{x0 + 2:.1f}" y="{MARGIN_TOP + 10}" fill="{colour}">{name}</text>')
    for marker in data["markers"]:
        xm = x(marker["time"])
        parts.append(
            f'<line x1="{xm:.1f}" x2="{xm:.1f}" y1="{MARGIN_TOP}" y2="{bottom}" stroke="#616161" '
            f'stroke-dasharray="2,3"><title>{html.escape(marker["label"])} {marker["time"]:.2f}s</title></line>'
        )
    # axes and ticks
    parts.append(f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + plot_w}" y1="{bottom}" y2="{bottom}" stroke="black"/>')
    parts.append(f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT}" y1="{MARGIN_TOP}" y2="{bottom}" stroke="black"/>')
    step = next(s for s in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1e9) if end / s <= 15)
    t = 0.0
    while t <= end:
        parts.append(f'<text x="{x(t):.1f}" y="{h - MARGIN_BOTTOM + 14}" text-anchor="middle">{t:g}</text>')
        t += step
    parts.append(f'<text x="{MARGIN_LEFT + plot_w / 2}" y="{h - 4}" text-anchor="middle">seconds</text>')
    for frac in (0, 0.5, 1):
        parts.append(f'<text x="{MARGIN_LEFT - 4}" y="{y(top * frac) + 4:.1f}" text-anchor="end">{top * frac:g}</text>')
    bucket = data["bucket_s"]
    for key, label, colour in SERIES:
        values = data["series"][key]
        points = " ".join(f"{x((i + 0.5) * bucket):.1f},{y(v / bucket):.1f}" for i, v in enumerate(values))
        dash = ' stroke-dasharray="5,3"' if key == "deliver" else ""
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}>'
            f"<title>{label}</title></polyline>"
        )
    lx = w - MARGIN_RIGHT - sum(24 + 6 * len(label) for _, label, _ in SERIES)
    for _key, label, colour in SERIES:
        parts.append(
            f'<rect x="{lx:.0f}" y="5" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14:.0f}" y="14">{label}</text>'
        )
        lx += 24 + 6 * len(label)
    parts.append("</svg>")
    return "\n".join(parts)


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}pre{background:#f5f5f5;padding:.8em;overflow:auto}"
        ".PASS{color:#2e7d32}.FAIL{color:#c62828}.UNKNOWN{color:#e65100}</style></head><body>"
        f"{body}</body></html>"
    )


def write_run_report(result: dict, records: list[dict], run_dir: Path) -> str:
    """timeline.html and results.json in the run's folder; returns the SVG for the overall page."""
    nemeses = "+".join(result.get("nemeses") or [])
    title = f"seed {result.get('seed')} ({result.get('workload')}, {nemeses}): {result.get('verdict')}"
    svg = timeline_svg(timeline_data(records), title)
    details = "\n".join(run_details(result)) or "nothing fatal, nothing noted"
    body = (
        f"<h1 class='{result.get('verdict')}'>{html.escape(title)}</h1>{svg}"
        f"<pre>{html.escape(summary_table([result]))}</pre><pre>{html.escape(details)}</pre>"
    )
    (run_dir / "timeline.html").write_text(_page(title, body), encoding="utf-8")
    (run_dir / "results.json").write_text(json.dumps(result, indent=2, sort_keys=True), encoding="utf-8")
    return svg


def write_summary(results: list[dict], svgs: list[str], out_dir: Path, header: dict) -> None:
    verdict = overall_verdict(results)
    doc = {**header, "verdict": verdict, "totals": totals(results), "summary": summary_line(results), "runs": results}
    (out_dir / "results.json").write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
    table = summary_table(results)
    details = "\n".join(line for r in results for line in run_details(r))
    (out_dir / "summary.txt").write_text(f"{table}\n{details}\n{summary_line(results)}\n", encoding="utf-8")
    body = (
        f"<h1 class='{verdict}'>MaxQ-Raft jepsen-style: {html.escape(summary_line(results))}</h1>"
        f"<pre>{html.escape(table)}</pre><pre>{html.escape(details or 'nothing fatal, nothing noted')}</pre>"
        + "".join(f"<div>{svg}</div>" for svg in svgs)
    )
    (out_dir / "report.html").write_text(_page("jepsen-style report", body), encoding="utf-8")
