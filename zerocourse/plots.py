"""Shared plotting conventions: one colour per rank across every notebook."""
from __future__ import annotations

# Rank r is always drawn in RANK_COLORS[r % len(RANK_COLORS)] (matplotlib's tab10).
RANK_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def rank_color(rank: int) -> str:
    """The colour of rank `rank` in every figure of the course."""
    return RANK_COLORS[rank % len(RANK_COLORS)]


def rank_values(ax, values: list[float], title: str, ylabel: str = "value", legend: bool = True) -> None:
    """One bar per rank, coloured by rank, value written on top, and a legend of rank colours.

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
                  label=[f"rank {r}" for r in ranks])
    for b, v in zip(bars, values):
        ax.annotate(f"{v:g}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom")
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_xlabel("rank")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend:
        ax.legend(fontsize="small")
