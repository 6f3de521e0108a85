"""zerocourse.progress: ranks report while they run, the notebook draws (bar + live curve)."""
import subprocess
import sys

import pytest

from zerocourse import launch, report
from zerocourse.launch import RankError
from zerocourse.progress import LivePlot


def _count(rank, world_size, steps):
    for step in range(steps):
        report(step=step + 1, loss=1.0 / (step + 1), rank_seen=rank)
    return "done"


def test_reports_arrive_in_order_while_the_ranks_run():
    got = []
    assert launch(_count, 3, 5, on_report=lambda r, v: got.append((r, v))) == ["done"] * 3
    for r in range(3):
        mine = [v for rr, v in got if rr == r]
        assert [v["step"] for v in mine] == [1, 2, 3, 4, 5]
        assert all(v["rank_seen"] == r for v in mine)


def _report_then_wait(rank, world_size, marker):
    import os
    import time
    report(step=1, marker=marker)
    deadline = time.monotonic() + 30
    while not os.path.exists(f"{marker}.{rank}"):        # written by the notebook's callback
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_callback_runs_while_the_ranks_run(tmp_path):
    """Live: each rank waits for the notebook's callback to answer its report before returning."""
    def answer(rank, values):
        open(f"{values['marker']}.{rank}", "w").close()
    assert launch(_report_then_wait, 2, str(tmp_path / "seen"), on_report=answer) == [True, True]


def test_report_outside_a_launch_does_nothing():
    assert report(step=1) is False


def _bad_report(rank, world_size):
    import threading
    report(lock=threading.Lock())


def test_unpicklable_values_name_the_problem():
    with pytest.raises(RankError, match="report: values must be picklable"):
        launch(_bad_report, 2)


def test_on_report_must_be_callable():
    with pytest.raises(TypeError, match="on_report must be a function"):
        launch(_count, 2, 1, on_report="plot")


def test_a_failing_callback_stops_the_launch():
    def boom(rank, values):
        raise ValueError("bad plot")
    with pytest.raises(ValueError, match="bad plot"):
        launch(_count, 2, 3, on_report=boom)


def test_live_plot_series_overlay_and_redraws():
    plot = LivePlot("t", ylabel="loss (nats)", min_interval=0.0)
    launch(_count, 2, 6, on_report=plot.series("ours", total=6))
    launch(_count, 2, 4, on_report=plot.series("torch", total=4))
    assert plot.data["ours"] == ([1, 2, 3, 4, 5, 6], [1.0, 1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 6])
    assert plot.data["torch"][0] == [1, 2, 3, 4]
    assert plot.draws >= 10                    # every report redraws when min_interval = 0
    ax = plot.figure.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ours", "torch"]
    assert ax.get_title() == "t" and ax.get_xlabel() == "step" and ax.get_ylabel() == "loss (nats)"
    with pytest.raises(ValueError, match="total must be the number of steps"):
        plot.series("x", total=0)


def test_falls_back_to_text_without_a_notebook():
    """Outside Jupyter (no widgets, no display): the bar is text, nothing is displayed."""
    code = ("from zerocourse import launch\nfrom zerocourse.progress import LivePlot\n"
            "from tests.test_progress import _count\n"
            "p = LivePlot('t')\nlaunch(_count, 2, 3, on_report=p.series('run', total=3))\n"
            "print('points', len(p.data['run'][0]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "points 3" in proc.stdout
    assert "run: 100%" in proc.stdout and "3/3" in proc.stdout


def test_progress_bar_follows_rank_zero():
    from zerocourse.progress import progress_bar
    cb = progress_bar(5, "steps")
    launch(_count, 2, 5, on_report=cb)
    assert cb.bar.n == 5
