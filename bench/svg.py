"""Small SVG charts for the benchmark drivers: grouped bars and lines, nothing else.

No matplotlib, no fonts or scripts from anywhere: every chart is a plain SVG file that any
browser shows offline.

    import svg
    a = svg.bar_chart("small MLP", groups=["N=1", "N=2"],
                      series={"lockstep": [900, 1500], "torch": [400, 600]}, y_label="samples/s")
    b = svg.line_chart("all-reduce", [svg.Line("lockstep", [4096, 65536], [1.0, 5.0])],
                       x_label="bytes", y_label="GB/s", log_x=True)
    svg.save("out.svg", [a, b], columns=2)
    svg.save_rows("out.csv", rows)   # the rows behind a chart, as CSV

"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field

PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2", "#9d755d"]
FONT = 'font-family="sans-serif" font-size="12"'
BOLD = 'font-family="sans-serif" font-weight="bold" font-size='
LEFT, RIGHT, BOTTOM = 70, 16, 48


@dataclass
class Chart:
    """One chart: its size and its SVG elements, placed by save()."""
    width: int
    height: int
    body: str


@dataclass
class Line:
    name: str
    x: list
    y: list
    dashed: bool = False
    color: str | None = None


@dataclass
class _Axis:
    lo: float
    hi: float
    ticks: list = field(default_factory=list)  # (value, label)


def esc(text) -> str:
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def fmt_number(v: float) -> str:
    """A tick or bar label: integers in full up to 10^7, else 3 significant digits."""
    if v == 0:
        return "0"
    if 1e3 <= abs(v) < 1e7:
        return f"{v:.0f}"
    return f"{v:.3g}"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def _nice(lo: float, hi: float, from_zero: bool, count: int = 5) -> _Axis:
    if from_zero:
        lo = min(lo, 0.0)
    if not hi > lo:
        pad = 1.0 if lo == 0 else 0.1 * abs(lo)
        hi = lo + pad
        if not from_zero:
            lo -= pad
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    f = raw / mag
    step = (1 if f < 1.5 else 2 if f < 3 else 5 if f < 7 else 10) * mag
    a = _Axis(math.floor(lo / step) * step, math.ceil(hi / step) * step)
    v = a.lo
    while v <= a.hi + 1e-6 * step:
        a.ticks.append((v, fmt_number(0.0 if abs(v) < 1e-9 * step else v)))
        v += step
    return a


def _legend(names_colors, width: int, dashed=()) -> tuple:
    """Legend entries left to right, wrapping; returns (svg, top of the plot area below it)."""
    out, x, y = [], LEFT, 36
    for name, color in names_colors:
        need = 28 + 7 * len(name)
        if x > LEFT and x + need > width - RIGHT:
            x, y = LEFT, y + 16
        dash = ' stroke-dasharray="5 3"' if name in dashed else ""
        out.append(f'<line x1="{x}" x2="{x + 16}" y1="{y}" y2="{y}" stroke="{color}" '
                   f'stroke-width="6"{dash}/>'
                   f'<text x="{x + 20}" y="{y + 4}" {FONT}>{esc(name)}</text>')
        x += need
    return "\n".join(out), y + 16


def _frame(title, width, height, top, xa: _Axis | None, ya: _Axis, x_label, y_label, px, py) -> list:
    out = [f'<rect width="{width}" height="{height}" fill="#fff"/>',
           f'<text x="{LEFT}" y="20" {BOLD}"14">{esc(title)}</text>']
    for v, lab in ya.ticks:
        out.append(f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{py(v):.1f}" y2="{py(v):.1f}" '
                   f'stroke="#e4e4e4"/><text x="{LEFT - 6}" y="{py(v) + 4:.1f}" '
                   f'text-anchor="end" {FONT}>{esc(lab)}</text>')
    if xa is not None:
        for v, lab in xa.ticks:
            out.append(f'<line x1="{px(v):.1f}" x2="{px(v):.1f}" y1="{top}" '
                       f'y2="{height - BOTTOM}" stroke="#e4e4e4"/>'
                       f'<text x="{px(v):.1f}" y="{height - BOTTOM + 16}" text-anchor="middle" '
                       f'{FONT}>{esc(lab)}</text>')
    out.append(f'<rect x="{LEFT}" y="{top}" width="{width - LEFT - RIGHT}" '
               f'height="{height - top - BOTTOM}" fill="none" stroke="#888"/>')
    out.append(f'<text x="{(LEFT + width - RIGHT) / 2}" y="{height - 10}" text-anchor="middle" '
               f'{FONT}>{esc(x_label)}</text>')
    out.append(f'<text transform="translate(16 {(top + height - BOTTOM) / 2}) rotate(-90)" '
               f'text-anchor="middle" {FONT}>{esc(y_label)}</text>')
    return out


def bar_chart(title: str, groups: list, series: dict, y_label: str, x_label: str = "",
              notes: list | None = None, width: int = 520, height: int = 320) -> Chart:
    """Grouped bars: one group per entry of `groups`, one bar per series in each.

    series maps a name to one value per group; notes (one string per group, optional) are
    written above each group, e.g. a ratio.
    """
    values = [v for vs in series.values() for v in vs if v is not None]
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series)}
    legend, top = _legend(colors.items(), width)
    ya = _nice(0.0, max(values) * (1.12 if notes else 1.0) if values else 1.0, True)
    py = lambda v: height - BOTTOM - (v - ya.lo) / (ya.hi - ya.lo) * (height - top - BOTTOM)
    out = _frame(title, width, height, top, None, ya, x_label, y_label, None, py)
    group_w = (width - LEFT - RIGHT) / max(1, len(groups))
    bar_w = 0.8 * group_w / max(1, len(series))
    for g, group in enumerate(groups):
        x0 = LEFT + g * group_w + 0.1 * group_w
        for s, (name, vs) in enumerate(series.items()):
            v = vs[g]
            if v is None:
                continue
            x = x0 + s * bar_w
            out.append(f'<rect x="{x:.1f}" y="{py(v):.1f}" width="{bar_w - 2:.1f}" '
                       f'height="{py(0) - py(v):.1f}" fill="{colors[name]}">'
                       f'<title>{esc(name)} {esc(group)}: {fmt_number(v)}</title></rect>')
            out.append(f'<text x="{x + bar_w / 2 - 1:.1f}" y="{py(v) - 3:.1f}" text-anchor="middle" '
                       f'font-family="sans-serif" font-size="10">{fmt_number(v)}</text>')
        out.append(f'<text x="{LEFT + (g + 0.5) * group_w:.1f}" y="{height - BOTTOM + 16}" '
                   f'text-anchor="middle" {FONT}>{esc(group)}</text>')
        if notes and notes[g]:
            out.append(f'<text x="{LEFT + (g + 0.5) * group_w:.1f}" y="{top + 14}" '
                       f'text-anchor="middle" {BOLD}"12">{esc(notes[g])}</text>')
    out.append(legend)
    return Chart(width, height, "\n".join(out))


def line_chart(title: str, lines: list, x_label: str, y_label: str, log_x: bool = False,
               x_ticks: list | None = None, y_from_zero: bool = True, width: int = 520,
               height: int = 320) -> Chart:
    """Lines with a dot per point; log_x spaces x by log2. x_ticks: [(value, label)]."""
    xs = [x for ln in lines for x in ln.x]
    ys = [y for ln in lines for y in ln.y if y is not None and math.isfinite(y)]
    tx = (lambda v: math.log2(v)) if log_x else (lambda v: v)
    if x_ticks is None:
        xa = _nice(min(xs), max(xs), False)
    else:
        xa = _Axis(min(v for v, _ in x_ticks), max(v for v, _ in x_ticks), list(x_ticks))
    lo, hi = (tx(xa.lo), tx(xa.hi)) if xa.hi > xa.lo else (tx(xa.lo) - 1, tx(xa.lo) + 1)
    ya = _nice(min(ys), max(ys), y_from_zero)
    colors = [ln.color or PALETTE[i % len(PALETTE)] for i, ln in enumerate(lines)]
    legend, top = _legend([(ln.name, c) for ln, c in zip(lines, colors)], width,
                          {ln.name for ln in lines if ln.dashed})
    px = lambda v: LEFT + (tx(v) - lo) / (hi - lo) * (width - LEFT - RIGHT)
    py = lambda v: height - BOTTOM - (v - ya.lo) / (ya.hi - ya.lo) * (height - top - BOTTOM)
    out = _frame(title, width, height, top, xa, ya, x_label, y_label, px, py)
    for ln, color in zip(lines, colors):
        pts = [(px(x), py(y)) for x, y in zip(ln.x, ln.y) if y is not None and math.isfinite(y)]
        dash = ' stroke-dasharray="6 4"' if ln.dashed else ""
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
        if not ln.dashed:
            for (x, y), (vx, vy) in zip(pts, [(x, y) for x, y in zip(ln.x, ln.y)
                                               if y is not None and math.isfinite(y)]):
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}">'
                           f'<title>{esc(ln.name)} at {esc(fmt_number(vx))}: '
                           f'{fmt_number(vy)}</title></circle>')
    out.append(legend)
    return Chart(width, height, "\n".join(out))


def save(path, charts: list, columns: int = 2, title: str | None = None) -> None:
    """Lays the charts out in a grid, left to right, and writes one SVG file."""
    columns = max(1, min(columns, len(charts)))
    head = 30 if title else 0
    col_w = max(c.width for c in charts)
    rows = [charts[i:i + columns] for i in range(0, len(charts), columns)]
    row_h = [max(c.height for c in row) for row in rows]
    width, height = col_w * columns, head + sum(row_h)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}">',
           f'<rect width="{width}" height="{height}" fill="#fff"/>']
    if title:
        out.append(f'<text x="12" y="22" {BOLD}"16">{esc(title)}</text>')
    y = head
    for row, h in zip(rows, row_h):
        for c, chart in enumerate(row):
            out.append(f'<g transform="translate({c * col_w} {y})">\n{chart.body}\n</g>')
        y += h
    out.append("</svg>\n")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out))


def save_rows(path: str, rows: list) -> None:
    """Writes dict rows as CSV, a header from the first row's keys; floats with 4 decimals."""
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        wr.writeheader()
        for r in rows:
            wr.writerow({k: f"{v:.4f}" if isinstance(v, float) else v for k, v in r.items()})
