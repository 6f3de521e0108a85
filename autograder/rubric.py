"""Rubrics beside the answers a person grades, in formgrader only.

A manually graded answer (a written explanation) is scored in formgrader from the
submission `make grade` autograded. Its rubric lives in the instructor notes
(autograder/notes/<assignment>.md, a paragraph starting "**Rubric for `<grade_id>`").
After autograding, `add` puts that paragraph in a markdown cell right below the answer
in OUT/autograded/..., where formgrader shows it; `strip` takes it out again before
nbgrader writes feedback, so learners never see it.
"""
from __future__ import annotations

import os
import re

import nbformat

NOTES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "notes")
MARK = "zerocourse_rubric"          # metadata key of an inserted rubric cell
HEAD = re.compile(r"^\*\*Rubric for `([^`]+)`")


def rubrics(aid: str) -> dict[str, str]:
    """grade_id -> the rubric's markdown, from the assignment's instructor notes."""
    path = os.path.join(NOTES, f"{aid}.md")
    if not os.path.exists(path):
        return {}
    lines, found, current = open(path, encoding="utf-8").read().splitlines(), {}, None
    for i, line in enumerate(lines):
        m = HEAD.match(line)
        if m:
            current = m.group(1)
            found[current] = [line]
        elif current is not None:
            nxt = next((l for l in lines[i + 1:] if l.strip()), "")
            # A rubric is one paragraph plus its list; it ends at a heading or a new paragraph.
            if line.startswith("#") or (not line.strip() and not nxt.startswith(("-", " "))):
                current = None
            else:
                found[current].append(line)
    return {gid: "\n".join(text).strip() for gid, text in found.items()}


def add(path: str, aid: str) -> int:
    """Insert each manual answer's rubric below it in the notebook at `path`; returns how many."""
    nb = nbformat.read(path, as_version=4)
    strip_cells(nb)
    table, added, cells = rubrics(aid), 0, []
    for cell in nb.cells:
        cells.append(cell)
        meta = cell.metadata.get("nbgrader", {})
        gid = meta.get("grade_id")
        if meta.get("solution") and meta.get("grade") and gid in table:
            rubric = nbformat.v4.new_markdown_cell(
                f"> **Instructor only** (inserted by `make grade`, not in the learner's feedback): "
                f"{meta.get('points', '?')} point(s).\n\n" + table[gid])
            rubric.metadata[MARK] = True
            cells.append(rubric)
            added += 1
    nb.cells = cells
    nbformat.write(nb, path)
    return added


def strip_cells(nb) -> bool:
    """Remove inserted rubric cells from a notebook object; True if there were any."""
    kept = [c for c in nb.cells if not c.metadata.get(MARK)]
    changed = len(kept) != len(nb.cells)
    nb.cells = kept
    return changed


def strip(path: str) -> None:
    """Remove inserted rubric cells from the notebook at `path` (before feedback)."""
    nb = nbformat.read(path, as_version=4)
    if strip_cells(nb):
        nbformat.write(nb, path)
