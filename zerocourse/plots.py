"""Shared plotting conventions: one colour, one hatch and one marker per rank across every notebook.

Colour alone does not tell ranks apart for every reader (about 1 in 12 men is colour-blind), so
every figure that separates ranks also draws rank r with RANK_HATCHES[r] (bars) or
RANK_MARKERS[r] (lines and points). The colours are Okabe and Ito's palette, chosen to stay
distinct under the common forms of colour blindness.
"""
from __future__ import annotations

# Okabe & Ito (2008), "Color Universal Design": distinguishable with protan, deutan and tritan vision.
RANK_COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7",
               "#56B4E9", "#F0E442", "#000000"]
# A second cue beside colour: bars get a hatch, lines and points get a marker.
RANK_HATCHES = ["", "//", "..", "xx", "\\\\", "++", "--", "oo"]
RANK_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def rank_color(rank: int) -> str:
    """The colour of rank `rank` in every figure of the course."""
    return RANK_COLORS[rank % len(RANK_COLORS)]


def rank_hatch(rank: int) -> str:
    """The hatch of rank `rank`'s bars (pass as `hatch=`; draw with `edgecolor="white"`)."""
    return RANK_HATCHES[rank % len(RANK_HATCHES)]


def rank_marker(rank: int) -> str:
    """The marker of rank `rank`'s lines and points (pass as `marker=`)."""
    return RANK_MARKERS[rank % len(RANK_MARKERS)]


def rank_values(ax, values: list[float], title: str, ylabel: str = "value", legend: bool = True) -> None:
    """One bar per rank, coloured and hatched by rank, value written on top, and a legend.

    Args:
        ax: a matplotlib Axes.
        values: values[r] is rank r's value.
        title: the panel's title.
        ylabel: y-axis label (with units where there are some).
        legend: draw the legend (the course's figures all have one; pass False on all but one
            panel of a multi-panel figure if it crowds).
    """
    ranks = list(range(len(values)))
    bars = ax.bar(ranks, values, color=[rank_color(r) for r in ranks],
                  hatch=None, edgecolor="white", label=[f"rank {r}" for r in ranks])
    for r, b in zip(ranks, bars):
        b.set_hatch(rank_hatch(r))
    for b, v in zip(bars, values):
        ax.annotate(f"{v:g}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom")
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_xlabel("rank")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend:
        ax.legend(fontsize="small")
