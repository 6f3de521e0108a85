"""What a learner sees after grading: feedback without hidden tests, pending points marked.

nbgrader's ClearHiddenTests removes hidden tests from a cell's SOURCE, but a failing
hidden test's traceback (the cell's error output) still quotes the lines around the
failure. `HideTestTracebacks` keeps only the error's name and the check's own message
(what was expected, what came, on which rank, the hint) in graded test cells.
"""
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool


def _short(evalue: str) -> str:
    """The check's message, without any rank traceback quoted after it."""
    keep = []
    for line in evalue.splitlines():
        if line.startswith("--- traceback from rank") or line.startswith("Traceback (most recent"):
            break
        keep.append(line)
    return "\n".join(keep)


class HideTestTracebacks(Preprocessor):
    """Replace error tracebacks of graded test cells by `ename: message`."""

    enabled = Bool(True).tag(config=True)   # nbconvert preprocessors are off by default

    def preprocess_cell(self, cell, resources, index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("grade") and not meta.get("solution"):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    out["evalue"] = _short(out.get("evalue", ""))
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out['evalue']}"]
        return cell, resources


def mark_pending(page: str, pending: dict[str, float]) -> str:
    """Feedback HTML with each not-yet-graded written answer shown as "awaiting manual
    grading" instead of "Score: 0.0 / 2.0" (nbgrader scores it 0 until a person grades it).

    Args:
        page: the feedback HTML nbgrader wrote.
        pending: grade_id -> points of the answers that still need a person.
    """
    import re
    for gid, points in pending.items():
        g = re.escape(gid)
        note = f"awaiting manual grading ({points:g} points)"
        page = re.sub(rf'(<a href="#{g}">[^<]*</a> )\(Score: [^)]*\)', rf"\1({note})", page)
        page = re.sub(rf'(<a name="{g}"></a>.*?)Score: [0-9.]+ / [0-9.]+', rf"\1{note}", page,
                      count=1, flags=re.S)
    if pending:
        total = sum(pending.values())
        page = re.sub(r"(<h4>[^<]*\(Score: [0-9.]+ / [0-9.]+)\)",
                      rf"\1; {total:g} points await manual grading)", page, count=1)
    return page


# Feedback pages are files (opened from disk, an LMS, the learner's /files/): no server sends
# them a header, so the policy travels in the page. Scripts only from the CDN nbconvert's
# template loads MathJax from (its configuration block needs eval); nothing inline, no plugin.
FEEDBACK_CSP = ("script-src https://cdnjs.cloudflare.com 'unsafe-eval'; object-src 'none'; "
                "base-uri 'none'; form-action 'none'")


def add_csp(page: str) -> str:
    """Feedback HTML with a Content-Security-Policy <meta> first in its <head>: even content
    the sanitizer (autograder/sanitize.py) missed cannot run a script there."""
    import re
    if FEEDBACK_CSP in page:
        return page
    meta = f'<meta http-equiv="Content-Security-Policy" content="{FEEDBACK_CSP}">'
    page, n = re.subn(r"<head>", "<head>\n" + meta, page, count=1, flags=re.I)
    return page if n else meta + "\n" + page


def secure_page(path: str) -> None:
    """Add the policy to the feedback page at `path`, in place."""
    with open(path, encoding="utf-8") as f:
        page = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(add_csp(page))
