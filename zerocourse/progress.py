"""Live progress of a launch: ranks report numbers, the notebook draws them as they come.

Ranks are separate processes, so a progress bar or a plot made inside one can only print text
(prefixed "[rank r]"). Instead a rank *reports* and the kernel draws:

    def train(rank, world_size, steps):
        for step in range(steps):
            loss = ...
            report(step=step + 1, loss=loss)        # to the notebook (a no-op outside launch)

    curve = LivePlot("TinyGPT on the course corpus", ylabel="training loss (nats/char)")
    launch(train, 2, 100, on_report=curve.series("ZeRO-3 (yours)", total=100))
    launch(fsdp_train, 2, 100, on_report=curve.series("FSDP2", total=100))   # both curves

`series` gives a tqdm.auto progress bar (a widget in JupyterLab, Notebook 7 and VS Code; text
where ipywidgets is missing) and a curve that is redrawn at most every `min_interval` seconds
while the ranks run, through an updatable display (no widget needed for the figure). Each
series draws in the cell that runs it, with every earlier series of the same LivePlot on it.
"""
from __future__ import annotations

import io
import sys
import time

import cloudpickle

# Series colours (not rank colours: those are zerocourse.plots.RANK_COLORS, one per rank).
SERIES_COLORS = ["#111111", "#d62728", "#2ca02c", "#9467bd", "#8c564b"]


def report(**values) -> bool:
    """Send values from this rank to the notebook's `launch(..., on_report=...)` callback.

    Args:
        values: picklable keyword values, e.g. report(step=3, loss=2.71).
    Returns:
        True if sent; False outside a launch (torchrun, plain Python), where it does nothing.
    """
    _rank = sys.modules.get("zerocourse._rank")
    chan = getattr(_rank, "_CHANNEL", None)
    if chan is None:
        return False
    try:
        payload = cloudpickle.dumps(values)
    except Exception as e:
        raise TypeError(f"report: values must be picklable (numbers, strings, lists): {e}") from None
    chan.send(("report", payload))
    return True


def progress_bar(total: int, desc: str, rank: int = 0):
    """A callback for launch(on_report=...) that moves a tqdm.auto bar (a widget in Jupyter,
    text elsewhere) to the `step` rank `rank` reports.

    Args:
        total: the number of steps the rank will report.
        desc: the bar's label.
        rank: whose reports move the bar.
    Returns:
        on_report(rank, values), with .bar (the tqdm) and .close().
    """
    from tqdm.auto import tqdm
    bar = tqdm(total=total, desc=desc, file=sys.stdout, mininterval=0.5)

    def on_report(r: int, values: dict) -> None:
        if r == rank and not bar.disable:
            bar.update(int(values.get("step", bar.n + 1)) - bar.n)
            if bar.n >= total:
                bar.close()                       # sets bar.disable

    on_report.bar, on_report.close = bar, bar.close
    return on_report


def _in_notebook() -> bool:
    try:
        return get_ipython() is not None and "IPKernelApp" in get_ipython().config  # noqa: F821
    except NameError:
        return False


class LivePlot:
    """One figure, several series (one per launch), redrawn while ranks report.

    Args:
        title: the figure's title.
        xlabel, ylabel: axis labels, with units.
        key: the reported value to plot against `step` (default "loss").
        min_interval: seconds between redraws while a series runs.
    Attributes:
        data: {series name: ([steps], [values])}, what has been drawn.
        figure: the matplotlib Figure.
    """

    def __init__(self, title: str, xlabel: str = "step", ylabel: str = "training loss (nats/char)",
                 key: str = "loss", min_interval: float = 1.0):
        self.title, self.xlabel, self.ylabel, self.key = title, xlabel, ylabel, key
        self.min_interval = min_interval
        self.data: dict[str, tuple[list, list]] = {}
        self.colors: dict[str, str] = {}
        from matplotlib.figure import Figure     # not at import: ranks import report only
        self.figure = Figure(figsize=(7, 3.5))
        self._handle = None
        self._last_draw = 0.0
        self.draws = 0

    def series(self, name: str, total: int, rank: int = 0, color: str | None = None):
        """A callback for launch(on_report=...): progress bar + one curve named `name`.

        Args:
            name: the legend entry (and the progress bar's label).
            total: the number of steps the ranks will report (the bar's length).
            rank: whose reports are drawn (rank 0: every rank reports the same mean loss).
            color: the curve's colour (default: the next of SERIES_COLORS).
        Returns:
            on_report(rank, values), with .close() to finish the bar and draw the last state
            (called by itself when step == total).
        """
        if not isinstance(total, int) or total < 1:
            raise ValueError(f"LivePlot.series: total must be the number of steps (an int >= 1), "
                             f"got {total!r}")
        self.data[name] = steps, ys = [], []
        self._handle = None          # draw in the cell that runs this series (earlier ones kept)
        self.colors[name] = color or SERIES_COLORS[(len(self.data) - 1) % len(SERIES_COLORS)]
        advance = progress_bar(total, name, rank)

        def on_report(r: int, values: dict) -> None:
            if r == rank and self.key in values:
                steps.append(int(values.get("step", len(steps) + 1)))
                ys.append(float(values[self.key]))
                advance.bar.set_postfix({self.key: f"{ys[-1]:.3f}"}, refresh=False)
            advance(r, values)                    # closes the bar at `total`
            if r == rank and (advance.bar.disable or
                              time.monotonic() - self._last_draw >= self.min_interval):
                self.draw()                       # the last state is always drawn

        on_report.close = lambda: (advance.close(), self.draw())
        return on_report

    def draw(self):
        """Redraw every series; show or update the figure in the notebook."""
        self.figure.clear()
        ax = self.figure.add_subplot()
        for name, (steps, ys) in self.data.items():
            ax.plot(steps, ys, color=self.colors[name], label=name)
        ax.set_title(self.title)
        ax.set_xlabel(self.xlabel)
        ax.set_ylabel(self.ylabel)
        if self.data:
            ax.legend(loc="upper right")
        self.figure.tight_layout()
        self._last_draw = time.monotonic()
        self.draws += 1
        if _in_notebook():
            from IPython.display import Image, display
            buf = io.BytesIO()
            self.figure.savefig(buf, format="png", dpi=90)
            img = Image(data=buf.getvalue(), format="png")
            if self._handle is None:
                self._handle = display(img, display_id=True)
            else:
                self._handle.update(img)
        return self.figure
