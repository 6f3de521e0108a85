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
