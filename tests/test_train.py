"""`torchrun -m zerocourse.train` on 2 CPU ranks: the path a learner uses on a real cluster."""
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 180


def _torchrun(*args, nproc=2):
    """Run torchrun in its own process group; kill the whole group on timeout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "zerocourse.train", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {TIMEOUT} s:\n{out[-3000:]}")
    return proc.returncode, out


def _losses(out):
    return [float(m) for m in re.findall(r"^step +\d+ \| loss (\S+)", out, flags=re.M)]


@pytest.mark.parametrize("stage", [0, 3])
def test_torchrun_two_cpu_ranks_trains(stage):
    nb_id = {0: "02_data_parallelism", 3: "05_zero3"}[stage]    # the learner passes theirs
    rc, out = _torchrun("--stage", str(stage), "--impl", f"solutions/{nb_id}/{nb_id}.ipynb",
                        "--steps", "12", "--log-every", "4",
                        "--batch-size", "8", "--sample-chars", "30", "--backend", "gloo")
    assert rc == 0, out[-3000:]
    assert f"stage {stage} | 2 ranks (gloo, cpu)" in out
    losses = _losses(out)
    assert len(losses) == 4, out[-3000:]                     # steps 1, 4, 8, 12 from rank 0 only
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0], losses
    sample = out.split("sample:\n", 1)[1]
    assert sample.startswith("The ") and len(sample.splitlines()[0]) >= 4


def test_learner_notebook_via_impl(tmp_path):
    """--impl accepts a notebook; a notebook missing the names fails with a clear message."""
    import json
    bad = tmp_path / "03_zero1.ipynb"
    bad.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "x = 1",
                                          "metadata": {}, "outputs": []}],
                               "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    rc, out = _torchrun("--stage", "1", "--steps", "2", "--impl", str(bad), "--sample-chars", "0")
    assert rc != 0
    assert "does not define ['ZeRO1Adam']" in out


def test_refuses_to_run_without_torchrun():
    r = subprocess.run([sys.executable, "-m", "zerocourse.train"], cwd=REPO, capture_output=True,
                       text=True, timeout=60, env={k: v for k, v in os.environ.items()
                                                   if k not in ("RANK", "WORLD_SIZE")})
    assert r.returncode == 2 and "torchrun" in r.stderr


def test_no_fallback_on_solutions(tmp_path, monkeypatch):
    """Learners get a handout without solutions/: without --impl or my-notebooks/, say what to pass."""
    from zerocourse import train
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "REPO", tmp_path)
    with pytest.raises(FileNotFoundError, match="needs your notebook 05_zero3.*--impl"):
        train.load_impl(3, None)
    mine = tmp_path / "my-notebooks" / "05_zero3" / "05_zero3.ipynb"
    mine.parent.mkdir(parents=True)
    mine.write_text((REPO / "solutions" / "05_zero3" / "05_zero3.ipynb").read_text())
    impl, path = train.load_impl(3, None)
    assert path == mine and hasattr(impl, "ZeRO3Module")
