"""zerocourse.loader: definitions only, missing names named, usable with launch."""
import json

import pytest

from zerocourse import launch
from zerocourse.loader import NotebookLoadError, load_notebook


def _nb(path, *sources):
    cells = [{"cell_type": "code", "metadata": {}, "source": s, "outputs": [],
              "execution_count": None} for s in sources]
    cells.insert(1, {"cell_type": "markdown", "metadata": {}, "source": "# hi"})
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return str(path)


def test_loads_definitions_and_skips_side_effects(tmp_path):
    path = _nb(tmp_path / "a.ipynb",
               "import math\nSCALE = 3\nprint('side effect')\nraise SystemExit('never run')",
               "%matplotlib inline\ndef f(x):\n    return math.sqrt(x) * SCALE\n"
               "class C:\n    v = 2\nresult = f(4)\n!echo hi")
    mod = load_notebook(str(path), names=["f", "C"])
    assert mod.f(4) == 6.0 and mod.C.v == 2
    assert not hasattr(mod, "result")


def test_missing_names_and_bad_files_are_named(tmp_path):
    path = _nb(tmp_path / "b.ipynb", "def g():\n    pass")
    with pytest.raises(NotebookLoadError, match=r"does not define \['h'\]"):
        load_notebook(path, names=["g", "h"])
    with pytest.raises(NotebookLoadError, match="no notebook"):
        load_notebook(str(tmp_path / "missing.ipynb"))
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{oops")
    with pytest.raises(NotebookLoadError, match="not a readable notebook"):
        load_notebook(str(bad))
    syn = _nb(tmp_path / "syn.ipynb", "def broken(:\n  pass")
    with pytest.raises(NotebookLoadError, match="syntax error"):
        load_notebook(syn)


def test_loaded_functions_run_on_ranks(tmp_path):
    path = _nb(tmp_path / "c.ipynb",
               "import torch\nimport torch.distributed as dist\n"
               "def total(rank, world_size):\n    t = torch.ones(1)\n    dist.all_reduce(t)\n"
               "    return t.item()")
    mod = load_notebook(path, names=["total"])
    assert launch(mod.total, 3) == [3.0, 3.0, 3.0]


def _stub(rank, world_size):
    raise NotImplementedError()


def test_a_fallback_reads_as_one_line_of_information(capsys):
    """A stub on the ranks, a missing notebook, an error with an empty message: one short line,
    no traceback, nothing on stderr (the details go to a fold in a notebook)."""
    from zerocourse.loader import explain_fallback
    try:
        launch(_stub, 2, timeout=60)
    except Exception as e:  # noqa: BLE001
        line = explain_fallback("your ZeRO3Module (05)", e, "torch FSDP2")
    assert line == ("ⓘ your ZeRO3Module (05) not used (not written yet: it raises "
                    "NotImplementedError); using torch FSDP2 instead.")
    try:
        load_notebook("../nowhere/05_zero3.ipynb", names=["ZeRO3Module"])
    except NotebookLoadError as e:
        line = explain_fallback("your ZeRO3Module (05)", e, "torch FSDP2")
    assert "no notebook at '../nowhere/05_zero3.ipynb'" in line and "Traceback" not in line
    assert explain_fallback("x", ValueError(""), "y") == "ⓘ x not used (ValueError); using y instead."
    out = capsys.readouterr()
    assert out.err == "" and "Traceback" not in out.out and len(out.out.splitlines()) == 3
