"""06_communication_bill: the graded cells pass on the solution, fail on the stubs, and catch the bugs.

Bug fixtures run only the graded cells a bug can reach (`only=`), to keep the launches few.
"""
import pytest

from tests.harness import grade_cells, score, assert_full_marks, assert_stubs_fail

AID = "06_communication_bill"

RING = ["ring-all-reduce-check", "ring-all-reduce-hidden"]
BYTES = ["comm-bytes-check", "comm-bytes-hidden"]
CLAIM = ["three-x-claim-check"]
TOTAL = 12   # graded code cells; the written answer (2 points) is graded by hand


def test_solution_gets_full_marks():
    assert_full_marks(AID, TOTAL, cells=RING + BYTES + CLAIM)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID, cells=RING + BYTES + CLAIM)


PASSES = "passes = {0: 2, 1: 2, 2: 2, 3: 3}[stage]"
BUGS = {
    # bug: (edits, cells to run, cells that must fail)
    "N instead of N-1 in the ring factor": (
        [("comm-bytes-per-rank", "(world_size - 1) / world_size", "world_size / world_size")],
        BYTES, BYTES),
    "ZeRO-3 counted as 2x DP": (
        [("comm-bytes-per-rank", PASSES, "passes = {0: 2, 1: 2, 2: 2, 3: 4}[stage]")], BYTES, BYTES),
    "ZeRO-3 counted as 3x DP": (
        [("comm-bytes-per-rank", PASSES, "passes = {0: 2, 1: 2, 2: 2, 3: 6}[stage]")], BYTES, BYTES),
    "ZeRO-1 counted as the all-reduce variant": (
        [("comm-bytes-per-rank", PASSES, "passes = {0: 2, 1: 3, 2: 2, 3: 3}[stage]")],
        BYTES, ["comm-bytes-hidden"]),
    "ZeRO-2 counted as one pass": (
        [("comm-bytes-per-rank", PASSES, "passes = {0: 2, 1: 2, 2: 1, 3: 3}[stage]")],
        BYTES, ["comm-bytes-hidden"]),
    "no ValueError for a bad stage": (
        [("comm-bytes-per-rank", "if stage not in (0, 1, 2, 3):", "if False:"),
         ("comm-bytes-per-rank", "[stage]", ".get(stage, 2)")], BYTES, ["comm-bytes-hidden"]),
    "3x claim taken at face value": (
        [("three-x-claim", "zero3_over_dp_bytes = 3 / 2", "zero3_over_dp_bytes = 3.0")], CLAIM, CLAIM),
    "gloo's ratio taken as the ring's (its reduce-scatter counted as one pass)": (
        [("three-x-claim", "zero3_over_dp_bytes_gloo = 4 / 2", "zero3_over_dp_bytes_gloo = 3 / 2")],
        CLAIM, CLAIM),
    "calls counted as ring passes": (
        [("three-x-claim", "zero3_over_dp_calls = 3 / 1", "zero3_over_dp_calls = 3 / 2")], CLAIM, CLAIM),
    "a ratio given as a string": (
        [("three-x-claim", "zero3_over_dp_bytes = 3 / 2", "zero3_over_dp_bytes = '3/2'")], CLAIM, CLAIM),
    "wrong chunk index (right only for N = 2)": (
        [("ring-all-reduce", "recv_idx = (rank - k - 1) % world_size",
          "recv_idx = (rank + k + 1) % world_size")], RING, RING),
    "wrong neighbours (right only for N = 2)": (
        [("ring-all-reduce", "right, left = (rank + 1) % world_size, (rank - 1) % world_size",
          "right, left = (rank - 1) % world_size, (rank + 1) % world_size")], RING, RING),
    "not in place": (
        [("ring-all-reduce", "flat = tensor.view(-1)", "flat = tensor.reshape(-1).clone()")],
        ["ring-all-reduce-hidden"], ["ring-all-reduce-hidden"]),
}

COLLECTIVE_RING = '''
def ring_all_reduce(tensor):
    dist.all_reduce(tensor)
'''
NAIVE_RING = '''
def ring_all_reduce(tensor):
    # correct sums, but sends the whole tensor to every other rank: (N-1)·S per rank
    world_size, rank = dist.get_world_size(), dist.get_rank()
    total = tensor.clone()
    for other in range(world_size):
        if other == rank:
            continue
        buf = torch.empty_like(tensor)
        reqs = [dist.isend(tensor, other), dist.irecv(buf, other)]
        for r in reqs:
            r.wait()
        total += buf
    tensor.copy_(total)
'''


def test_the_claims_self_check_says_format_only():
    """The visible check can only see that the three ratios are numbers: it prints the
    format-only line, never a ✅ (make check lists its points as "not checked here")."""
    import contextlib
    import io
    from zerocourse.checks import FORMAT_ONLY
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        results = grade_cells(AID, only=CLAIM, visible_only=True)
    assert results == {"three-x-claim-check": None}, results
    assert FORMAT_ONLY in out.getvalue() and "✅" not in out.getvalue(), out.getvalue()


# The device rule (issue 29), under the device check (ZEROCOURSE_DEVICE_PROXY=1): a receive
# buffer created without the tensor's device lands on `meta`, and the recv that gets it fails,
# naming it. A learner-style ring with blocking send/recv (the launcher checks the devices of
# send/recv and of every collective; isend/irecv are not watched yet: see the notes).
def test_device_bug_is_caught_by_the_proxy():
    buggy = EVEN_ODD_RING.replace("buf = torch.empty_like(into)",
                                  "buf = torch.empty(into.shape, dtype=into.dtype)")
    assert buggy != EVEN_ODD_RING
    results = grade_cells(AID, solutions={"ring-all-reduce": buggy}, only=["ring-all-reduce-check"],
                          device_proxy=True)
    err = results["ring-all-reduce-check"]
    assert err is not None and "meta" in err, results


@pytest.mark.parametrize("bug", list(BUGS) + ["uses dist.all_reduce", "naive all-to-all exchange"])
def test_bug_is_caught(bug):
    if bug == "uses dist.all_reduce":
        edits, solutions, only, must_fail = [], {"ring-all-reduce": COLLECTIVE_RING}, ["ring-all-reduce-hidden"], ["ring-all-reduce-hidden"]
    elif bug == "naive all-to-all exchange":
        edits, solutions, only, must_fail = [], {"ring-all-reduce": NAIVE_RING}, ["ring-all-reduce-hidden"], ["ring-all-reduce-hidden"]
    else:
        (edits, only, must_fail), solutions = BUGS[bug], None
    results = grade_cells(AID, edits=edits, solutions=solutions, only=only)
    failed = {g for g, err in results.items() if err is not None}
    assert set(must_fail) <= failed, (bug, results)
    earned, total = score(AID, results)
    assert earned < total


EVEN_ODD_RING = '''
def ring_all_reduce(tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return
    flat = tensor.view(-1)
    numel = flat.numel()
    bounds = [(i * numel // n, (i + 1) * numel // n) for i in range(n)]   # manual bounds
    chunk = lambda i: flat[bounds[i % n][0]:bounds[i % n][1]]
    def step(send_i, recv_i, add):
        out, into = chunk(send_i), chunk(recv_i)
        buf = torch.empty_like(into)
        def send():
            if out.numel():
                dist.send(out.clone(), (r + 1) % n)
        def recv():
            if buf.numel():
                dist.recv(buf, (r - 1) % n)
        if r % 2 == 0:
            send(); recv()
        else:
            recv(); send()
        if add:
            into += buf
        else:
            into.copy_(buf)
    for k in range(n - 1):
        step(r - k, r - k - 1, True)
    for k in range(n - 1):
        step(r - k + 1, r - k, False)
'''
FRACTION_BYTES = '''
from fractions import Fraction
def comm_bytes_per_rank(stage, num_params, world_size, bytes_per_element=2):
    if stage not in range(4) or world_size < 1 or num_params < 0:
        raise ValueError("bad arguments")
    passes = 3 if stage == 3 else 2          # all-reduce = reduce-scatter + all-gather
    return float(Fraction(passes * num_params * bytes_per_element * (world_size - 1), world_size))
'''
VALID = {
    # (whole-notebook ring styles: tests/fixtures/alternatives/06_communication_bill/, run by
    # tests/test_alternatives.py; EVEN_ODD_RING above serves the device test)
    "exact fractions; 3/2 written as 1.5": (
        {"comm-bytes-per-rank": FRACTION_BYTES,
         "three-x-claim": "zero3_over_dp_calls = 3\nzero3_over_dp_bytes = 1.5\n"
                          "zero3_over_dp_bytes_gloo = 2\n"}, BYTES + CLAIM),
    "the ratio as a Fraction": (
        {"three-x-claim": "from fractions import Fraction\nzero3_over_dp_calls = 3\n"
                          "zero3_over_dp_bytes = Fraction(3, 2)\n"
                          "zero3_over_dp_bytes_gloo = Fraction(2)\n"}, CLAIM),
}


@pytest.mark.parametrize("alt", list(VALID))
def test_valid_alternative_gets_full_marks(alt):
    solutions, only = VALID[alt]
    results = grade_cells(AID, solutions=solutions, only=only)
    assert all(err is None for err in results.values()), (alt, results)
