"""The leak test (tests/leak.py): no learner-visible file holds a graded answer, even paraphrased.

test_no_unexplained_leak is the check of `make test`: every match between a solution or
hidden-test region and a learner-visible file is explained by tests/leak_allowlist.txt (known
leaks carry the review's finding id and go when the notebook fix lands). The other tests prove
the detector: synthetic paraphrases are caught, generic code is not, and the review's known
leaks, frozen from main at 3e19c84 (tests/fixtures/leaks/), are all found.
"""
import json
import os

import pytest

from tests import leak

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "leaks", "known_at_3e19c84.json")


@pytest.fixture(scope="module")
def course():
    allowed = leak.read_allowlist()
    regions, matches = leak.scan(allowed=allowed)
    return allowed, regions, matches


def test_no_unexplained_leak(course):
    allowed, regions, matches = course
    assert len(regions) > 60 and {r.aid for r in regions} >= {"03_zero1", "05_zero3", "10_capstone"}
    bad = leak.unexplained(matches, allowed)
    assert not bad, (
        f"{len(bad)} solution/hidden-test region(s) share code with a learner-visible file "
        f"(python -m tests.leak shows them all). Remove the answer from the visible file, or, if "
        f"the match is no answer, add 'region | file | reason' to tests/leak_allowlist.txt:\n"
        + "\n".join(leak.describe(m) for m in bad[:15]))


def test_the_scan_reads_everything_a_learner_can():
    files = leak.visible_files()
    for must in ("README.md", "zerocourse/shard_holder.py", "zerocourse/bench.py",
                 "docs/beyond_zero.md", "autograder/handout/README.md", "autograder/check.py",
                 "requirements.txt"):
        assert must in files, must
    assert {f for f in files if f.startswith("notebooks/") and f.endswith(".ipynb")} == {
        f"notebooks/{aid}/{aid}.ipynb" for aid, _ in leak.notebooks("notebooks")}
    assert not [f for f in files if f.startswith(("solutions/", "tests/", "autograder/notes/"))]


def test_the_table_counts_every_notebook(course):
    allowed, regions, matches = course
    text = leak.table(regions, matches, allowed)
    for aid in {r.aid for r in regions}:
        assert aid in text
    total = text.splitlines()[-1].split()
    assert total[0] == "total" and int(total[1]) == sum(r.kind == "solution" for r in regions)


def test_allowlist_entries_say_why():
    allowed = leak.read_allowlist()
    assert allowed.entries and allowed.idioms
    for a in allowed.entries:
        kind = a.reason.split(":")[0]
        assert kind in ("NEW", "ACCEPTED") or (kind[0] == "G" and kind[1:].isdigit()), (
            f"tests/leak_allowlist.txt line {a.line}: a reason starts with a finding id (G2: ...), "
            f"NEW: or ACCEPTED:, got {a.reason!r}")
        assert len(a.reason.split()) >= 6, f"line {a.line}: say why in a sentence"


def test_a_malformed_allowlist_line_is_named(tmp_path):
    path = tmp_path / "allow.txt"
    path.write_text("# fine\n05_zero3:zero3-unit:* | notebooks/07* | G2: the given Unit\nno bars here\n")
    with pytest.raises(ValueError, match=r"allow.txt:3: expected"):
        leak.read_allowlist(str(path))


# --- the detector, on synthetic paraphrases ---------------------------------------------------

SOLUTION = '''\
def bytes_per_rank(stage, psi, n):
    """Per-rank model-state bytes for ZeRO stage 0-3: 16 * psi, 4 * psi + 12 * psi / n, ..."""
    ### BEGIN SOLUTION
    # the paper's table, one stage per entry
    return float([16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n][stage])
    ### END SOLUTION


class Unit:
    def free(self):
        ### BEGIN SOLUTION
        self.flat.untyped_storage().resize_(0)
        ### END SOLUTION

    def gather(self):
        ### BEGIN SOLUTION
        if self.flat.untyped_storage().nbytes() > 0:
            return
        self.flat.untyped_storage().resize_(self.nbytes)
        dist.all_gather_single(self.flat, self.shard.to(self.flat.dtype))
        ### END SOLUTION
'''

GENERIC = '''\
import torch
import torch.distributed as dist
def anything(model, opt):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    for name, p in model.named_parameters():
        if p.requires_grad and p.grad is not None:
            opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}
'''


def _solutions(src=SOLUTION, aid="99_demo", gid="demo"):
    cell = {"cell_type": "code", "source": src, "metadata": {"nbgrader": {"grade_id": gid}}}
    imports = {"cell_type": "code", "source": "import torch\nimport torch.distributed as dist\n",
               "metadata": {}}
    return [(aid, {"cells": [imports, cell]})]


def _notebook(*cells):
    return json.dumps({"cells": [{"cell_type": kind, "source": src, "metadata": {}}
                                 for kind, src in cells]})


def _found(texts, solutions=None, allowed=None):
    _, matches = leak.scan_texts(solutions or _solutions(), texts, allowed)
    return {(m.region.key, m.stream.path) for m in matches}


def test_renamed_variables_other_spacing_and_comments_are_caught():
    paraphrase = '''
def table_entry(k, P, world):   # renamed everything, reformatted
    return [ 16*P ,
             4*P+12*P/world,   # ZeRO-1
             2 * P + (14 * P) / world,
             (16*P)/world ][k]
'''
    found = _found({"zerocourse/helper.py": paraphrase})
    assert ("99_demo:demo:bytes_per_rank", "zerocourse/helper.py") in found


def test_a_method_body_given_under_other_names_is_caught():
    given = _notebook(("code", '''
class GivenUnit:
    def release(me):
        me.flat.untyped_storage( ).resize_( 0 )

    def fetch(me):
        if (me.flat.untyped_storage().nbytes() > 0):
            return
        me.flat.untyped_storage().resize_(me.nbytes)
        dist.all_gather_single(me.flat, me.shard.to(me.flat.dtype))
'''))
    found = _found({"notebooks/07/07.ipynb": given})
    assert ("99_demo:demo:Unit.free", "notebooks/07/07.ipynb") in found
    assert ("99_demo:demo:Unit.gather", "notebooks/07/07.ipynb") in found


def test_a_formula_in_markdown_or_a_docstring_is_caught():
    prose = _notebook(("markdown", "The stars: `[16·Ψ, 4·Ψ + 12·Ψ/N, 2·Ψ + 14·Ψ/N, 16·Ψ/N][s]` bytes."),
                      ("code", 'def stub(s, p, n):\n    """Returns: [16 * p, 4 * p + 12 * p / n, '
                               '2 * p + 14 * p / n, 16 * p / n][s]"""\n    raise NotImplementedError\n'))
    _, matches = leak.scan_texts(_solutions(), {"notebooks/x/x.ipynb": prose})
    cells = {m.stream.cell for m in matches if m.region.where == "bytes_per_rank"}
    assert len([m for m in matches if m.region.where == "bytes_per_rank"]) == 1   # one per file
    places = [m.places for m in matches if m.region.where == "bytes_per_rank"][0]
    assert places == 2 and cells                                  # the markdown and the docstring


def test_generic_code_and_near_misses_are_not_matches():
    # boilerplate, other constants and an inconsistent renaming (a*b+a is not x*y+z)
    other = '''
def f(k, P, world):
    return [16 * P, 3 * P + 13 * P / world, 2 * P + 15 * P / world, 17 * P / world][k]
def g(a, b, c, d):
    return [16 * a, 4 * b + 12 * c / d, 2 * a + 14 * b / c, 16 * d / a][a]
'''
    found = _found({"zerocourse/generic.py": GENERIC, "zerocourse/other.py": other})
    assert found == set(), found
    # a docstring and comments inside a solution region are not part of the secret
    documented = SOLUTION.replace("    # the paper's table, one stage per entry\n", '''\
    def helper(x):
        """Calls torch.linalg.qr(x.mT.contiguous(), mode='r').R * 12 + 14 // 16."""
        # torch.zeros(x.numel() * 12 + 14 // 16, dtype=torch.bfloat16)
        return x
''')
    doc = _notebook(("markdown", "Calls `torch.linalg.qr(x.mT.contiguous(), mode='r').R * 12 "
                                 "+ 14 // 16`, or `torch.zeros(x.numel() * 12 + 14 // 16, "
                                 "dtype=torch.bfloat16)`"))
    assert _found({"notebooks/d/d.ipynb": doc}, _solutions(documented)) == set()
    as_code = documented.replace('"""Calls ', "return (").replace('16."""', "16)")
    assert _found({"notebooks/d/d.ipynb": doc}, _solutions(as_code))   # the same text as code is


def test_idioms_are_masked_and_the_allowlist_explains(tmp_path):
    boiler = '''
def solved(model):
    ### BEGIN SOLUTION
    world_size, rank = dist.get_world_size(), dist.get_rank()
    return world_size * rank + 1
    ### END SOLUTION
'''
    texts = {"zerocourse/x.py": "def h():\n    n, r = dist.get_world_size(), dist.get_rank()\n    "
                                "return n * r + 1\n"}
    assert _found(texts, _solutions(boiler))                     # matched without the idiom
    path = tmp_path / "allow.txt"
    path.write_text("idiom | dist.get_world_size(), dist.get_rank() | a rank's process-group boilerplate\n")
    assert not _found(texts, _solutions(boiler), leak.read_allowlist(str(path)))
    # a (region, file) entry explains a match; an entry nothing needs is reported as unused
    path.write_text("99_demo:demo:Unit.* | notebooks/07/* | G2: the given Unit is part A's\n"
                    "99_demo:demo:nothing | * | ACCEPTED: no such region, listed as unused\n")
    allowed = leak.read_allowlist(str(path))
    given = _notebook(("code", "def f(me):\n    me.flat.untyped_storage().resize_(0)\n"))
    _, matches = leak.scan_texts(_solutions(), {"notebooks/07/07.ipynb": given}, allowed)
    assert matches and not leak.unexplained(matches, allowed)
    assert [a.region for a in leak.unused(matches, allowed)] == ["99_demo:demo:nothing"]


# --- the review's known leaks, as they were on main -------------------------------------------

def test_the_known_leaks_at_main_are_caught():
    with open(FIXTURE, encoding="utf-8") as f:
        fx = json.load(f)
    solutions = [(aid, nb) for aid, nb in fx["solutions"].items()]
    _, matches = leak.scan_texts(solutions, fx["visible"], leak.read_allowlist())
    found = {(m.region.key, m.stream.path): m for m in matches}
    missed = [(fid, key, path) for fid, key, path in fx["expect"] if (key, path) not in found]
    assert not missed, f"known leaks of main {fx['commit'][:7]} the test does not catch: {missed}"
    assert found[("10_capstone:capstone-q1:bytes_per_rank",
                  "notebooks/10_capstone/10_capstone.ipynb")].length >= 30   # paper_bytes, whole
