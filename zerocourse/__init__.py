"""zerocourse: instruments and helpers for the "ZeRO by hand" course.

The package gives learners a way to run code on N ranks from a notebook
(`launch`), and instruments that measure what their code does (`comm`,
`memory`). It never contains the answer to a graded exercise.
"""
from zerocourse.launch import launch
from zerocourse.progress import report

__all__ = ["launch", "report"]
__version__ = "0.1.0"
