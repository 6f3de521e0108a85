"""The figure audit used on every notebook catches what it promises to catch."""
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tests import figure_audit  # noqa: E402
from zerocourse.plots import rank_color  # noqa: E402


def _audited(draw):
    """Run the audit cell's code here, draw, render (as the inline backend does), report."""
    ns = {}
    exec(figure_audit.AUDIT_CELL, ns)
    try:
        fig = draw()
        fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)
        return figure_audit.problems(ns["_FIGURE_AUDIT"])
    finally:
        import matplotlib.backend_bases as mbb
        mbb.FigureCanvasBase.print_figure = ns["_orig_print_figure"]


def test_a_complete_figure_passes():
    def draw():
        fig, ax = plt.subplots()
        for r in range(3):
            ax.bar([r], [r + 1], color=rank_color(r), label=f"rank {r}")
        ax.set(title="t", xlabel="rank", ylabel="bytes (kB)")
        ax.legend()
        return fig
    assert _audited(draw) == []


def test_missing_labels_legend_and_wrong_rank_colour_are_reported():
    def draw():
        fig, (a, b) = plt.subplots(1, 2)
        a.plot([0, 1], [0, 1], color=rank_color(1), label="rank 0 (local)")   # rank 0 in rank 1's colour
        a.legend()
        b.plot([0, 1], [1, 0])                                                 # no title, no labels
        return fig
    problems = _audited(draw)
    assert any("'rank 0 (local)' drawn in" in p for p in problems), problems
    assert sum("no title" in p for p in problems) == 2
    assert any("axes 1" in p and "no xlabel" in p for p in problems)


def test_a_figure_without_any_legend_is_reported():
    def draw():
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, 1])
        ax.set(title="t", xlabel="x", ylabel="y")
        return fig
    assert _audited(draw) == ["figure 0 (t): no legend"]
