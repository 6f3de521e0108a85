"""Per-rank timelines of compute and communication, drawn from perf_counter timestamps.

An instrument for notebook 07 (overlap): ranks record spans with time.perf_counter() and
CommTracer records (t_start = when a collective was issued; for an async call t_end is when it
was enqueued, so its running time is not known: draw it as an issue tick), return them as plain
data, and the kernel draws one row per (rank, label):

    rows = [{"label": "rank 0 · naive", "rank": 0,
             "spans": [(t0, t1, "compute"), (t1, t2, "comm"), (t2, t3, "wait")],
             "ticks": [t_issue, ...]}]
    plot_timeline(ax, rows, title="...")

Kinds: "compute" (solid, the rank's colour), "comm" (a blocking collective: hatched),
"wait" (waiting for async collectives to finish: light). Times are shown in ms from each row's
first timestamp, so ranks whose clocks are not aligned still compare by duration.

Timestamps on a GPU: CUDA kernels and NCCL collectives run asynchronously, so perf_counter() right
after a call measures when it was queued, not when it ran. `now(device)` first waits for the
device's queue (torch.cuda.synchronize) when the device is a GPU, then reads the clock: take span
ends with it. On the CPU it is perf_counter() itself.
"""
from __future__ import annotations

import time

import torch

from zerocourse.plots import rank_color, rank_hatch

__all__ = ["plot_timeline", "KIND_STYLE", "now"]


def now(device=None) -> float:
    """time.perf_counter() once the work queued on `device` is done (a GPU runs asynchronously).

    Args:
        device: the rank's device (zerocourse.rank_device()); None or a CPU device reads the
            clock at once.
    """
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()

KIND_STYLE = {
    "compute": {"alpha": 1.0, "hatch": None, "label": "compute (forward + backward)"},
    "comm": {"alpha": 0.45, "hatch": "xxx", "label": "blocking collective"},
    "wait": {"alpha": 0.25, "hatch": "...", "label": "waiting for async collectives"},
}


def plot_timeline(ax, rows: list[dict], title: str, xlabel: str = "time from the step's start (ms)",
                  tick_label: str = "async collective issued") -> None:
    """Draw one horizontal lane per row: spans as bars, issue times of collectives as ticks.

    Args:
        ax: a matplotlib Axes.
        rows: [{"label", "rank", "spans": [(t0, t1, kind)], "ticks": [t]}], times in seconds.
        title: the panel's title.
        xlabel: the x-axis label.
        tick_label: what a tick marks, for the legend (e.g. "all-gather issued").
    """
    seen = set()
    for y, row in enumerate(rows):
        times = [t for s in row["spans"] for t in s[:2]] + list(row.get("ticks", []))
        origin = min(times) if times else 0.0
        color = rank_color(row["rank"])
        for t0, t1, kind in row["spans"]:
            style = KIND_STYLE[kind]
            label = f"rank {row['rank']}: {style['label']}" if (row["rank"], kind) not in seen else None
            seen.add((row["rank"], kind))
            ax.barh(y, 1e3 * (t1 - t0), left=1e3 * (t0 - origin), height=0.6, color=color,
                    alpha=style["alpha"], hatch=style["hatch"] or rank_hatch(row["rank"]),
                    edgecolor="black" if style["hatch"] else "white", linewidth=0.3, label=label)
        ticks = list(row.get("ticks", []))
        if ticks:
            label = f"rank {row['rank']}: {tick_label}" if (row["rank"], "tick") not in seen else None
            seen.add((row["rank"], "tick"))
            ax.scatter([1e3 * (t - origin) for t in ticks], [y - 0.42] * len(ticks), marker="v", s=28,
                       color=color, edgecolor="black", linewidth=0.4, zorder=3, label=label)
    ax.set_yticks(range(len(rows)), [r["label"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rank · variant")
    ax.set_title(title)
