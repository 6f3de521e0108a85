"""01_bytes_per_parameter: the graded cells pass on the solution, fail on the stubs, catch the
bugs, accept the valid alternatives; and the memory calculator reacts to its controls."""
import os

import pytest

from tests.harness import ROOT, grade_cells, score, assert_full_marks, assert_stubs_fail

AID = "01_bytes_per_parameter"
TOTAL = 25

BPP = "bpp-bytes-per-parameter"
MSB = "bpp-model-state-bytes"
MAX = "bpp-max-num-params"
COUNT = "bpp-count-parameters"


def _failed(results):
    return {g for g, err in results.items() if err is not None}


def test_solution_gets_full_marks():
    assert_full_marks(AID, TOTAL)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID)


_MAX_BODY = ("psi = int(device_bytes // per_param)\n"
             "    # Guard against floating-point rounding on either side of the boundary.\n"
             "    while psi > 0 and model_state_bytes(psi, world_size, stage, precision, optimizer) > device_bytes:\n"
             "        psi -= 1\n"
             "    while model_state_bytes(psi + 1, world_size, stage, precision, optimizer) <= device_bytes:\n"
             "        psi += 1\n"
             "    return psi")

BUGS = {
    "tied weights counted twice": (
        [(COUNT, "for p in model.parameters():",
          "for _, p in model.named_parameters(remove_duplicate=False):")],
        [f"{COUNT}-check", f"{COUNT}-hidden", "bpp-measure-tinygpt"]),
    "trainable_only ignored": (
        [(COUNT, "if trainable_only and not p.requires_grad:", "if False:")],
        [f"{COUNT}-check", f"{COUNT}-hidden", "bpp-measure-tinygpt"]),
    "a master copy for fp32": (
        [(BPP, '{"params": 4, "grads": 4, "master_params": 0}', '{"params": 4, "grads": 4, "master_params": 4}')],
        [f"{BPP}-hidden", f"{MSB}-hidden", f"{MAX}-hidden"]),
    "K = 8 (no master copy in mixed precision)": (
        [(BPP, '{"params": 2, "grads": 2, "master_params": 4}', '{"params": 2, "grads": 2, "master_params": 0}')],
        [f"{BPP}-check", f"{BPP}-hidden", f"{MSB}-check", f"{MSB}-hidden", "bpp-table1",
         "bpp-measure-tinygpt"]),
    "stage 1 shards the gradients": (
        [(MSB, "if stage >= 2:\n        grads", "if stage >= 1:\n        grads")],
        [f"{MSB}-check", f"{MSB}-hidden", "bpp-table1"]),
    "stage 2 shards the parameters": (
        [(MSB, "if stage >= 3:\n        params", "if stage >= 2:\n        params")],
        [f"{MSB}-check", f"{MSB}-hidden", "bpp-table1"]),
    "N - 1 instead of N": (
        [(MSB, "opt_state = opt_state / world_size", "opt_state = opt_state / max(world_size - 1, 1)")],
        [f"{MSB}-check", f"{MSB}-hidden", "bpp-table1"]),
    "max_num_params rounds up": (
        [(MAX, _MAX_BODY, "return math.ceil(device_bytes / per_param)")],
        [f"{MAX}-check", f"{MAX}-hidden"]),
    "max_num_params rounds to nearest": (
        [(MAX, _MAX_BODY, "return round(device_bytes / per_param)")],
        [f"{MAX}-hidden"]),
    "max_num_params one too many": (
        [(MAX, "    return psi", "    return psi + 1")],
        [f"{MAX}-check", f"{MAX}-hidden"]),
    "max_num_params misses the exact boundary (< instead of <=)": (
        [(MAX, "model_state_bytes(psi + 1, world_size, stage, precision, optimizer) <= device_bytes",
          "model_state_bytes(psi + 1, world_size, stage, precision, optimizer) < device_bytes"),
         (MAX, "> device_bytes:", ">= device_bytes:")],
        [f"{MAX}-check", f"{MAX}-hidden"]),
    "max_num_params returns a float": (
        [(MAX, "    return psi", "    return float(psi)")],
        [f"{MAX}-check", f"{MAX}-hidden"]),
    "no ValueError for a bad stage": (
        [(MSB, "    if stage not in (0, 1, 2, 3):\n        raise ValueError(f\"stage must be 0, 1, 2 or 3, got {stage!r}\")\n", "")],
        [f"{MSB}-hidden"]),
    "no ValueError for a bad world size": (
        [(MSB, "    if world_size < 1:\n        raise ValueError(f\"world_size must be >= 1, got {world_size}\")\n", "")],
        [f"{MSB}-hidden"]),
    "no ValueError for num_params < 0": (
        [(MSB, "    if num_params < 0:\n        raise ValueError(f\"num_params must be >= 0, got {num_params}\")\n", "")],
        [f"{MSB}-hidden"]),
    "no ValueError for a bad precision": (
        [(BPP, "raise ValueError(f\"precision must be 'mixed' or 'fp32', got {precision!r}\")",
          'out = {"params": 2, "grads": 2, "master_params": 4}')],
        [f"{BPP}-hidden", f"{MSB}-hidden"]),
    "no ValueError for a bad optimizer": (
        [(BPP, "raise ValueError(f\"optimizer must be 'adam', 'sgd_momentum' or 'sgd', got {optimizer!r}\")",
          "out.update(momentum=4, variance=4)")],
        [f"{BPP}-hidden", f"{MSB}-hidden"]),
    "wrong self-test answers": (
        [("bpp-q1-answer", "answer_gpt2_gb = 24", "answer_gpt2_gb = 3"),
         ("bpp-q2-answer", "answer_zero2_bytes_n8 = 2 * 1.5e9 + 14 * 1.5e9 / 8",
          "answer_zero2_bytes_n8 = 5.625"),
         # Q3's Adam answer (4) for SGD with momentum; Q4 the stage of 7.5B on 32 GB devices
         ("bpp-q3-answer", "answer_zero1_limit_factor = 3", "answer_zero1_limit_factor = 4"),
         ("bpp-q4-answer", "answer_min_stage_20b_n64 = 2", "answer_min_stage_20b_n64 = 1")],
        ["bpp-q1", "bpp-q2", "bpp-q3", "bpp-q4"]),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_bug_is_caught(bug):
    edits, must_fail = BUGS[bug]
    results = grade_cells(AID, edits=edits)
    assert set(must_fail) <= _failed(results), (bug, {g: e for g, e in results.items() if e})
    earned, total = score(AID, results)
    assert earned < total


VALID_SOLUTIONS = {
    "bytes_per_parameter leaves absent components out; model_state_bytes as the paper writes it": {
        BPP: '''
def bytes_per_parameter(precision="mixed", optimizer="adam"):
    moments = {"adam": ["momentum", "variance"], "sgd_momentum": ["momentum"], "sgd": []}
    if precision not in ("mixed", "fp32") or optimizer not in moments:
        raise ValueError(f"bad precision/optimizer {precision!r}, {optimizer!r}")
    if precision == "mixed":
        d = dict(params=2, grads=2, master_params=4)
    else:
        d = dict(params=4, grads=4)
    for m in moments[optimizer]:
        d[m] = 4
    return d
''',
        MSB: '''
def model_state_bytes(num_params, world_size, stage, precision="mixed", optimizer="adam"):
    if stage not in range(4) or world_size < 1 or num_params < 0:
        raise ValueError("bad stage, world_size or num_params")
    b = bytes_per_parameter(precision, optimizer)
    P, G = b["params"], b["grads"]
    K = sum(b.values()) - P - G
    psi, N = num_params, world_size
    if stage == 0:
        return (P + G + K) * psi
    elif stage == 1:
        return P * psi + G * psi + K * psi / N
    elif stage == 2:
        return P * psi + (G + K) * psi / N
    return (P + G + K) * psi / N
''',
    },
    "max_num_params by binary search; count_parameters by identity over modules": {
        MAX: '''
def max_num_params(device_bytes, world_size, stage, precision="mixed", optimizer="adam"):
    lo, hi = 0, 1
    while model_state_bytes(hi, world_size, stage, precision, optimizer) <= device_bytes:
        hi *= 2
    while hi - lo > 1:      # invariant: lo fits, hi does not
        mid = (lo + hi) // 2
        if model_state_bytes(mid, world_size, stage, precision, optimizer) <= device_bytes:
            lo = mid
        else:
            hi = mid
    return lo
''',
        COUNT: '''
def count_parameters(model, trainable_only=False):
    seen = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if p.requires_grad or not trainable_only:
                seen[id(p)] = p.numel()
    return sum(seen.values())
''',
    },
    "answers computed with the learner's functions; max_num_params in closed form": {
        "bpp-q1-answer": "answer_gpt2_gb = model_state_bytes(1.5e9, 1, 0) / GB\n",
        "bpp-q2-answer": "answer_zero2_bytes_n8 = model_state_bytes(1.5e9, 8, 2)\n",
        "bpp-q3-answer": "answer_zero1_limit_factor = (model_state_bytes(1e9, 1, 0, optimizer='sgd_momentum')\n"
                         "    / model_state_bytes(1e9, 10**9, 1, optimizer='sgd_momentum'))\n",
        "bpp-q4-answer": "answer_min_stage_20b_n64 = min(s for s in range(4) "
                         "if model_state_bytes(20e9, 64, s) <= 80 * GB)\n",
        MAX: '''
def max_num_params(device_bytes, world_size, stage, precision="mixed", optimizer="adam"):
    return int(math.floor(device_bytes / model_state_bytes(1, world_size, stage, precision, optimizer)))
''',
    },
}


@pytest.mark.parametrize("alt", list(VALID_SOLUTIONS))
def test_valid_alternatives_get_full_marks(alt):
    results = grade_cells(AID, solutions=VALID_SOLUTIONS[alt])
    assert all(err is None for err in results.values()), {g: e for g, e in results.items() if e}


# -- the memory calculator ------------------------------------------------------------------

@pytest.fixture(scope="module")
def solution_fns():
    from zerocourse.loader import load_notebook
    nb = load_notebook(os.path.join(ROOT, "solutions", AID, f"{AID}.ipynb"),
                       names=["bytes_per_parameter", "model_state_bytes", "max_num_params"])
    return nb.bytes_per_parameter, nb.model_state_bytes, nb.max_num_params


def _bar_heights(fig):
    return [round(p.get_height(), 9) for p in fig.axes[0].patches]


def test_memory_calculator_follows_the_world_size_slider(solution_fns):
    from zerocourse.widgets import memory_calculator
    calc = memory_calculator(*solution_fns, num_params=7.5e9, world_size=64, stage=1, device_gb=32)
    totals = [row["total"] for row in calc.data["breakdown"]]
    assert [round(t / 1e9, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]
    assert all(row["consistent"] for row in calc.data["breakdown"])
    assert "fits" in calc.text.value and "⚠️" not in calc.text.value
    heights, png = _bar_heights(calc.figure), calc.image.value
    assert png[:4] == b"\x89PNG"

    calc.controls["world_size"].value = 8          # as if the learner moved the slider
    assert calc.data["world_size"] == 8
    assert calc.data["breakdown"][3]["total"] == pytest.approx(120e9 / 8)
    assert calc.data["max_num_params"][3] == 32 * 10**9 * 8 // 16
    assert _bar_heights(calc.figure) != heights
    assert calc.image.value != png

    calc.controls["stage"].value = 0
    assert "does not fit" in calc.text.value       # 120 GB on a 32 GB device


def test_memory_calculator_warns_about_a_wrong_formula(solution_fns):
    from zerocourse.widgets import memory_calculator
    bpp, msb, mnp = solution_fns

    def grads_sharded_in_stage_1(num_params, world_size, stage, precision="mixed", optimizer="adam"):
        return msb(num_params, world_size, 2 if stage == 1 else stage, precision, optimizer)

    calc = memory_calculator(bpp, grads_sharded_in_stage_1, mnp)
    assert not all(row["consistent"] for row in calc.data["breakdown"])
    assert "⚠️" in calc.text.value


def test_memory_calculator_without_ipywidgets_draws_once(solution_fns, monkeypatch):
    """A front end without widgets gets the same text and figure, drawn for the given values."""
    import sys
    from zerocourse.widgets import memory_calculator
    monkeypatch.setitem(sys.modules, "ipywidgets", None)          # import ipywidgets fails
    calc = memory_calculator(*solution_fns, num_params=7.5e9, world_size=64, stage=1, device_gb=32)
    assert [round(r["total"] / 1e9, 1) for r in calc.data["breakdown"]] == [120.0, 31.4, 16.6, 1.9]
    html = calc.widget._repr_html_()
    assert "ipywidgets is not available" in html and "fits" in html
    assert "data:image/png;base64,iVBOR" in html


# -- the whole budget (notebook 08 draws it with the learner's activation_bytes) ---------------

def test_budget_breakdown_adds_activations_and_logits_to_the_states(solution_fns):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from zerocourse.widgets import budget_breakdown, draw_budget
    _, msb, _ = solution_fns
    calls = []

    def per_block(batch, seq_len, n_embd, n_head, bytes_per_element=2):   # a stand-in, not 08's answer
        calls.append((batch, seq_len, n_embd, n_head, bytes_per_element))
        return 1000 * batch * seq_len

    L, C, a, V, B, T, N = 36, 4096, 32, 50_257, 4, 2048, 64
    psi = 12 * L * C**2 + V * C
    got = budget_breakdown(msb, per_block, psi, N, L, C, a, V, B, T)
    assert calls == [(B, T, C, a, 2)]
    assert got["logits"] == B * T * V * 4 and round(got["logits"] / 1e9, 2) == 1.65
    assert got["kept_inputs"] == L * B * T * C * 2
    for s, row in enumerate(got["stages"]):
        assert row["states"] == msb(psi, N, s)
        assert row["without"] == L * got["block"] + got["logits"]
        assert row["with"] == got["kept_inputs"] + got["block"] + got["logits"]
    fig, ax = plt.subplots()
    draw_budget(ax, got, device_bytes=32e9)
    marks = [t.get_text() for t in ax.texts]
    assert len(ax.patches) == 16 and len(marks) == 8 and all(m.endswith(("✅", "❌")) for m in marks)
    plt.close(fig)


# The self-checks alone (hidden tests removed, as the learner runs them) catch wrong units and a
# float count: what the hidden tests fail, the learner sees ❌ for before submitting.
SELF_CHECK = {
    "Q1 in bytes instead of GB": ([("bpp-q1-answer", "answer_gpt2_gb = 24", "answer_gpt2_gb = 24e9")],
                                  ["bpp-q1"]),
    "Q2 in GB instead of bytes": ([("bpp-q2-answer", "answer_zero2_bytes_n8 = 2 * 1.5e9 + 14 * 1.5e9 / 8",
                                    "answer_zero2_bytes_n8 = 5.625")], ["bpp-q2"]),
    "count_parameters returns a float": ([(COUNT, "    return total\n", "    return float(total)\n")],
                                         [f"{COUNT}-check"]),
}


@pytest.mark.parametrize("bug", list(SELF_CHECK))
def test_self_check_catches(bug):
    from tests.harness import assert_bug_caught
    edits, must_fail = SELF_CHECK[bug]
    assert_bug_caught(AID, edits, must_fail, must_fail, visible_only=True)


def test_quiz_self_checks_say_format_only():
    """The quiz cells can only check the format before grading: they say so (☑), never ✅."""
    from tests.fixtures.make_submission import load, source
    cells = {c["metadata"]["nbgrader"]["grade_id"]: source(c) for c in load("notebooks", AID)["cells"]
             if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
    for gid in ("bpp-q1", "bpp-q2", "bpp-q3", "bpp-q4"):
        assert "format_only(" in cells[gid] and "passed(" not in cells[gid], gid
