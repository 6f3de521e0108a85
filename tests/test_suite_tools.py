"""The suite's own tools: scheduling (conftest.py), the timeline, make test's timing lines,
make test-gpu's plan, and the bench's class part and formulas (issues 26 and 29). All cheap:
no rank is launched and nothing is graded."""
import json
import os
import subprocess
import sys
import types

import pytest

from tests import conftest, gpu_suite, run_parts, timeline
from tests.fixtures.make_submission import ROOT, solution_as_submission


def _item(nodeid, group=None):
    marks = {"xdist_group": types.SimpleNamespace(args=(group,), kwargs={})} if group else {}
    return types.SimpleNamespace(nodeid=nodeid, get_closest_marker=marks.get)


# -- scheduling ------------------------------------------------------------------------------
def test_groups_keep_shared_fixtures_on_one_worker():
    assert conftest.group_of(_item("tests/test_grading.py::test_battery_scores[alice]")) == \
        "tests/test_grading.py"
    assert conftest.group_of(_item("tests/test_notebooks.py::test_hygiene[00_setup]")) is None
    assert conftest.group_of(_item("tests/test_nb03.py::test_bug[x]")) is None
    assert conftest.group_of(_item("tests/test_grading_e2e.py::test_x[a]", "e2e-2")) == "e2e-2"


def test_lpt_order_longest_unit_first_groups_together_and_in_order():
    items = [_item("tests/a.py::t1"), _item("tests/a.py::t2"), _item("tests/b.py::solo"),
             _item("tests/c.py::fast"), _item("tests/a.py::t3"), _item("tests/d.py::new")]
    groups = ["tests/a.py", "tests/a.py", None, None, "tests/a.py", None]
    known = {"tests/a.py::t1": 5, "tests/a.py::t2": 1, "tests/a.py::t3": 1,
             "tests/b.py::solo": 20, "tests/c.py::fast": 0.5, "tests/d.py::other": 3}
    order = [it.nodeid for it in conftest.lpt_order(items, groups, known)]
    # b (20 s) > a's group (7 s) > d::new (its file's mean: 3 s) > c (0.5 s)
    assert order == ["tests/b.py::solo", "tests/a.py::t1", "tests/a.py::t2", "tests/a.py::t3",
                     "tests/d.py::new", "tests/c.py::fast"]
    # xdist's "@group" suffix does not hide a test from its estimate
    at = [_item("tests/b.py::solo@g"), _item("tests/c.py::fast")]
    assert [i.nodeid for i in conftest.lpt_order(at[::-1], [None, "g"], known)] == \
        ["tests/b.py::solo@g", "tests/c.py::fast"]


def test_workers_write_each_tests_group_for_the_scheduler(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "_estimates", lambda: {"tests/test_nb03.py::big": 99,
                                                         "tests/test_nb03.py::small": 1})
    items = [_item("tests/test_data.py::a"), _item("tests/test_nb03.py::small"),
             _item("tests/test_data.py::b"), _item("tests/test_nb03.py::big"),
             _item("tests/test_grading_e2e.py::t[x]", "e2e-1")]
    path = tmp_path / "groups.json"
    config = types.SimpleNamespace(workerinput={"zerocourse_groups": str(path), "workerid": "gw0"})
    conftest.pytest_collection_modifyitems(None, config, items)
    assert json.loads(path.read_text()) == {"tests/test_data.py::a": "tests/test_data.py",
                                            "tests/test_data.py::b": "tests/test_data.py",
                                            "tests/test_grading_e2e.py::t[x]": "e2e-1"}
    assert items[0].nodeid == "tests/test_nb03.py::big"          # the longest unit first


def test_durations_file_is_readable():
    est = conftest._estimates()
    assert isinstance(est, dict) and all(isinstance(v, (int, float)) for v in est.values())


# -- the timeline ----------------------------------------------------------------------------
def _report(nodeid, when, start, duration, worker="gw0", failed=False):
    node = types.SimpleNamespace(gateway=types.SimpleNamespace(id=worker))
    return types.SimpleNamespace(nodeid=nodeid, when=when, start=start, stop=start + duration,
                                 duration=duration, failed=failed, skipped=False, node=node)


def test_timeline_records_workers_and_reports_idle_tails(tmp_path):
    rec = timeline.Recorder(str(tmp_path / "t.json"))
    rec.started = 1000.0
    for r in [_report("tests/a.py::x@g", "setup", 1000, 1), _report("tests/a.py::x@g", "call", 1001, 9),
              _report("tests/a.py::x@g", "teardown", 1010, 0),
              _report("tests/b.py::y", "call", 1000, 30, "gw1", failed=True)]:
        rec.pytest_runtest_logreport(r)
    rec.pytest_sessionfinish(None)
    run = json.loads((tmp_path / "t.json").read_text())
    run["ended"] = 1031.0
    by_id = {t["nodeid"]: t for t in run["tests"]}
    assert by_id["tests/a.py::x"]["worker"] == "gw0" and by_id["tests/a.py::x"]["call"] == 9
    assert by_id["tests/b.py::y"]["outcome"] == "failed"
    import io
    out = io.StringIO()
    timeline.report(run, out=out)
    text = out.getvalue()
    assert "tests/b.py" in text and "gw0: 1 tests, busy 10 s" in text and "idle tail 20 s" in text
    assert timeline.estimates([run]) == {"tests/a.py::x": 10.0, "tests/b.py::y": 30.0}


def test_record_timing_merges_concurrent_writers(tmp_path, monkeypatch):
    monkeypatch.setattr(timeline, "ROOT", str(tmp_path))
    code = ("import sys; sys.path.insert(0, %r); from tests import timeline; timeline.ROOT = %r\n"
            "for i in range(20): timeline.record_timing('t', sys.argv[1] + str(i), i)") % (ROOT, str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code, w]) for w in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    data = json.loads((tmp_path / "artifacts" / "timings" / "t.json").read_text())
    assert len(data) == 40


# -- make test's timing lines ----------------------------------------------------------------
def test_run_parts_prints_each_part_and_stops_at_the_first_failure(capfd):
    py = sys.executable
    rc = run_parts.main([f"one={py} -c pass", f"two={py} -c 'raise SystemExit(3)'", f"three={py} -c pass"])
    out = capfd.readouterr().out.splitlines()
    assert rc == 3
    tail = out[-5:]
    assert tail[0].startswith("== make test wall time")
    assert tail[1].split()[1:2] == ["one"] and tail[1].endswith("passed")
    assert "two" in tail[2] and "FAILED (exit 3)" in tail[2]
    assert "three" in tail[3] and "not run" in tail[3]
    assert "total" in tail[4] and "a figure, not a bound" in tail[4]


def test_run_parts_refuses_a_malformed_part():
    with pytest.raises(SystemExit, match="NAME=COMMAND"):
        run_parts.parse(["no command here"])
    for bad in (["a=true", "||"], ["||", "a=true"], ["a=true", "||", "||", "b=true"]):
        with pytest.raises(SystemExit, match="a lane has no part"):
            run_parts.parse_lanes(bad)
    with pytest.raises(SystemExit, match="share a name"):
        run_parts.parse_lanes(["a=true", "||", "a=true"])


def test_run_parts_runs_lanes_at_once_and_reports_every_part(tmp_path, monkeypatch, capfd):
    """Two lanes that each wait for the other's file: they pass only if they run at the same
    time. A failure in the side lane stops that lane, not the first; the side lane's output is
    printed whole once it ends, and the exit status is the failed part's."""
    monkeypatch.setattr(run_parts, "TIMINGS", str(tmp_path))
    py = sys.executable
    wait = ("import os, sys, time; open(sys.argv[1], 'w').close(); t = time.monotonic()\n"
            "while not os.path.exists(sys.argv[2]):\n"
            "    assert time.monotonic() - t < 60, 'the other lane never ran'; time.sleep(0.05)\n"
            "print('side says', sys.argv[3])")
    script = tmp_path / "wait.py"
    script.write_text(wait)
    a, b = tmp_path / "a", tmp_path / "b"
    rc = run_parts.main([f"first={py} {script} {a} {b} one", f"after first={py} -c pass", "||",
                         f"side={py} {script} {b} {a} two", f"side fails={py} -c 'raise SystemExit(4)'",
                         f"side skipped={py} -c pass"])
    out = capfd.readouterr().out
    assert rc == 4, out
    lines = out.splitlines()
    tail = lines[-7:]
    assert tail[0].startswith("== make test wall time")
    assert [l.split()[1] for l in tail[1:6]] == ["first", "after", "side", "side", "side"]
    assert tail[1].endswith("passed") and tail[2].endswith("passed") and tail[3].endswith("passed")
    assert "FAILED (exit 4)" in tail[4] and "not run" in tail[5]
    # The side lane's output is printed in one piece, after its header.
    at = lines.index("== side: its output (artifacts/timings/side.log):".replace(
        "artifacts/timings", os.path.relpath(str(tmp_path), ROOT)))
    assert lines[at + 1] == "side says two"
    assert "side says one" in out.split("== side: its output")[0]


def test_make_test_runs_its_parts_through_run_parts():
    text = open(os.path.join(ROOT, "Makefile")).read()
    recipe = text.split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    assert "tests/run_parts.py" in recipe and "--dist loadgroup --no-loadscope-reorder" in recipe
    for part in ("parallel part=", "browser=", "hub="):
        assert part in recipe
    # The browser and hub tests run in one lane beside the workers, one after the other.
    assert recipe.index("parallel part=") < recipe.index('"||"') < recipe.index("browser=") < recipe.index("hub=")


# -- make test-gpu ---------------------------------------------------------------------------
def test_gpu_plan_needs_one_gpu_per_rank():
    ok, lines = gpu_suite.plan(0)
    assert not ok and len(lines) == 1 and "no GPU" in lines[0]
    ok, lines = gpu_suite.plan(2)
    assert not ok and len(lines) == 1 and "2 GPU(s) here, 4 needed" in lines[0]
    ok, lines = gpu_suite.plan(4)
    assert ok and len(lines) == 1 + len(gpu_suite.STEPS) and "ZEROCOURSE_BACKEND=nccl" in lines[0]
    ok, lines = gpu_suite.plan(8, ["probe", "nope"])
    assert not ok and "nope" in lines[0]


def test_make_test_gpu_without_gpus_says_so_in_one_line(capsys):
    if gpu_suite.gpu_count():
        pytest.skip("this machine has GPUs: make test-gpu runs for real here")
    assert gpu_suite.main([]) == 1
    out = capsys.readouterr().out
    assert out.strip().count("\n") == 0 and "no GPU" in out, out
    assert gpu_suite.main(["--dry-run", "--gpus", "4"]) == 0
    assert "bench stages + overlap on NCCL" in capsys.readouterr().out
    assert "ZEROCOURSE_BACKEND" not in os.environ         # a plan runs nothing, sets nothing


def test_backend_from_the_environment_for_auto_only(monkeypatch):
    from zerocourse.launch import pick_backend
    monkeypatch.setenv("ZEROCOURSE_BACKEND", "gloo")
    assert pick_backend("auto", 2) == "gloo"
    monkeypatch.setenv("ZEROCOURSE_BACKEND", "mpi")
    with pytest.raises(ValueError, match="ZEROCOURSE_BACKEND must be"):
        pick_backend("auto", 2)
    assert pick_backend("gloo", 2) == "gloo"          # an explicit backend wins
    if not gpu_suite.gpu_count():
        monkeypatch.setenv("ZEROCOURSE_BACKEND", "nccl")
        with pytest.raises(ValueError, match="needs one GPU per rank"):
            pick_backend("auto", 2)


# -- the bench -------------------------------------------------------------------------------
def test_bench_takes_the_formulas_from_the_notebooks():
    """G9: the expected bytes are 01's and 06's own functions, loaded like the implementations."""
    from zerocourse import bench
    src = open(bench.__file__).read()
    assert "bytes_formula" not in src and "sent_formula" not in src
    folder = os.path.join(ROOT, "solutions")
    held = bench._learners_formula(folder, "01_bytes_per_parameter", "model_state_bytes")
    sent = bench._learners_formula(folder, "06_communication_bill", "comm_bytes_per_rank")
    assert bench._call(held, 1000, 4, 3) == 16 * 1000 / 4
    assert bench._call(sent, 0, 1000, 4, 2) == 2 * 2 * 1000 * 3 / 4
    stub = bench._learners_formula(os.path.join(ROOT, "notebooks"), "01_bytes_per_parameter",
                                   "model_state_bytes")
    assert bench._call(stub, 1000, 4, 3) is None          # a learner's stub: n/a, not a crash


def test_bench_class_submits_what_a_learner_submits():
    from zerocourse import bench
    for aid in ("00_setup", "05_zero3"):
        assert bench._as_submission(aid) == solution_as_submission(aid)


def test_class_measurement_renders_workshops_table_dated():
    """make bench's class figures -> docs/measured.json -> WORKSHOP's class table (tests/measured.py):
    measured rows as measured, the others derived and marked so."""
    from tests import measured
    m = measured.load()
    res = {"class": {"size": 20, "date": "2026-12-01", "cpus": 2, "sandboxed": True,
                     "notebooks": {"00_setup": {"jobs1_s": 600.0, "jobs2_s": 480.0,
                                                "jobs1_full": 20, "jobs2_full": 20}},
                     "not_measured": ["01_bytes_per_parameter JOBS=1"]}}
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(res, f)
    measured.from_bench(m, f.name)
    os.unlink(f.name)
    assert m["class"]["notebooks"] == {"00_setup": {"jobs1_s": 600.0, "jobs2_s": 480.0}}
    assert m["class"]["jobs2_speedup"] == 1.25 and "01_bytes_per_parameter JOBS=1" in m["how"]["class"]
    text = measured.render_workshop(open(measured.WORKSHOP).read(), m, measured.assignments())
    assert "| notebook | JOBS=1 (measured, 2026-12-01) | JOBS=2 (measured, 2026-12-01) |" in text
    assert "| 00_setup | 10 min | 8 min |" in text
    assert "| 01_bytes_per_parameter | " in text and "min (derived) |" in text
