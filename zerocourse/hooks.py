"""One autograd hook that torch's public API lacks: "call me when this backward is over".

ZeRO-3 frees a unit's gathered weights as soon as backward is done with it. Module and tensor
hooks say when one use of a unit is done, but a unit that some use never reaches (an unused
parameter, a branch that got no gradient) would stay gathered. A callback that runs once the
whole backward pass has finished is the safety net: it frees whatever is still gathered and
reduce-scatters gradients that are still pending. FSDP uses the same mechanism.

    from zerocourse.hooks import call_at_end_of_backward
    def backward_start(grad):                  # a tensor hook: backward is running now
        call_at_end_of_backward(cleanup)       # cleanup() runs after the last gradient
        return grad
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["call_at_end_of_backward"]


def call_at_end_of_backward(fn: Callable[[], None]) -> None:
    """Run fn() once, when the backward pass that is running now has finished.

    Args:
        fn: a callable without arguments. It runs in the thread that ran backward, after every
            gradient of this backward pass was computed and accumulated (post-accumulate-grad
            hooks included), before loss.backward() returns.

    Call it only while backward runs (from a tensor hook or a backward hook): outside a
    backward pass autograd has no pass to attach fn to and raises a RuntimeError. Calling it
    several times in one pass queues fn several times: remember that you did (a flag you
    reset in fn).
    """
    # torch has no public spelling for this in 2.13: the execution engine's queue_callback is
    # what torch.distributed.fsdp itself calls. Wrapping it here keeps the private name out of
    # the notebooks (one place to change if torch renames it).
    torch.autograd.Variable._execution_engine.queue_callback(fn)
