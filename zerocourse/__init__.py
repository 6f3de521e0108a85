"""zerocourse: instruments and helpers for the "ZeRO by hand" course.

The package gives learners a way to run code on N ranks from a notebook
(`launch`), and instruments that measure what their code does (`comm`,
`memory`). It never contains the answer to a graded exercise.
"""
import os as _os
import sys as _sys

from zerocourse.launch import launch

# In a notebook, start the ranks' fork server in the background right away.
if "ipykernel" in _sys.modules and not _os.environ.get("ZEROCOURSE_NO_WARMUP"):
    from zerocourse.launch import warm_up as _warm_up
    try:
        _warm_up()
    except Exception:  # the first launch() will start it and report any problem
        pass

__all__ = ["launch"]
__version__ = "0.1.0"
