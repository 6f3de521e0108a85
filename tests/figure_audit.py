"""Every figure a notebook draws: title, labelled axes, legend, one colour per rank.

`AUDIT_CELL` is run first in a kernel (tests/test_notebooks.py prepends it): it wraps
matplotlib's FigureCanvasBase.print_figure, through which every rendered figure passes
(plt.show, the inline backend at the end of a cell, savefig into a widget's image, LivePlot).
`REPORT_CELL`, run last, prints what was seen as JSON; `problems(report)` lists what is wrong.
"""
from __future__ import annotations

import json
import re

AUDIT_CELL = r'''
import matplotlib.backend_bases as _mbb
import matplotlib.colors as _mcolors

_FIGURE_AUDIT = []


def _audit_figure(fig):
    axes = []
    for ax in fig.get_axes():
        has_data = bool(ax.lines or ax.patches or ax.images or ax.collections)
        if not has_data or not ax.get_visible():
            continue
        leg = ax.get_legend()
        entries = []
        if leg is not None:
            for text, handle in zip(leg.get_texts(), leg.legend_handles):
                color = None
                for getter in ("get_facecolor", "get_color", "get_edgecolor"):
                    try:
                        color = _mcolors.to_hex(getattr(handle, getter)())
                        break
                    except Exception:
                        continue
                entries.append([text.get_text(), color])
        axes.append({"title": ax.get_title() or (fig._suptitle.get_text() if fig._suptitle else ""),
                     "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "legend": entries})
    key = id(fig)
    _FIGURE_AUDIT[:] = [f for f in _FIGURE_AUDIT if f["id"] != key]   # keep a figure's last state
    _FIGURE_AUDIT.append({"id": key, "axes": axes})


_orig_print_figure = _mbb.FigureCanvasBase.print_figure


def _print_figure(self, *args, **kwargs):
    try:
        _audit_figure(self.figure)
    except Exception as e:                 # an audit bug must not hide the notebook's own errors
        _FIGURE_AUDIT.append({"id": -1, "error": repr(e)})
    return _orig_print_figure(self, *args, **kwargs)


_mbb.FigureCanvasBase.print_figure = _print_figure
'''

REPORT_CELL = r'''
import json as _json
print("FIGURE_AUDIT=" + _json.dumps(_FIGURE_AUDIT))
'''


def parse(text: str) -> list[dict]:
    """The audit list from the report cell's printed output."""
    line = next(l for l in text.splitlines() if l.startswith("FIGURE_AUDIT="))
    return json.loads(line[len("FIGURE_AUDIT="):])


def problems(report: list[dict]) -> list[str]:
    """What is missing: a title or axis label on a panel, a legend on the figure (one legend may
    serve several panels), or a rank drawn in a colour other than zerocourse.plots.rank_color."""
    from zerocourse.plots import rank_color
    out = []
    for i, fig in enumerate(report):
        if "error" in fig:
            out.append(f"figure {i}: audit failed: {fig['error']}")
            continue
        if fig["axes"] and not any(ax["legend"] for ax in fig["axes"]):
            out.append(f"figure {i} ({fig['axes'][0]['title'] or 'untitled'}): no legend")
        for j, ax in enumerate(fig["axes"]):
            where = f"figure {i} axes {j} ({ax['title'] or 'untitled'})"
            for key in ("title", "xlabel", "ylabel"):
                if not ax[key].strip():
                    out.append(f"{where}: no {key}")
            for label, color in ax["legend"]:
                m = re.match(r"rank (\d+)\b", label)
                # to_hex gives lower case; plots.RANK_COLORS are written in upper case
                if m and (color or "").lower() != rank_color(int(m.group(1))).lower():
                    out.append(f"{where}: {label!r} drawn in {color}, not {rank_color(int(m.group(1)))}")
    return out
