"""zerocourse: instruments and helpers for the "ZeRO by hand" course.

The package gives learners a way to run code on N ranks from a notebook
(`launch`), and instruments that measure what their code does (`comm`,
`memory`). It never contains the answer to a graded exercise.
"""
from zerocourse.launch import launch
from zerocourse.progress import report


def rank_device():
    """The device to create tensors on inside a rank (cuda:<rank> under NCCL, else cpu).

    See zerocourse.devices for the rule (and the proxy `make test` checks it with)."""
    from zerocourse.devices import rank_device as device_of_this_rank
    return device_of_this_rank()


__all__ = ["launch", "rank_device", "report"]
__version__ = "0.1.0"
