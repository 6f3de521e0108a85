"""Nothing learner-authored runs in a browser: the sanitizer, formgrader's CSP, feedback's CSP.

Each hostile notebook below is cleaned by autograder/sanitize.py, rendered by nbconvert with
the templates formgrader and feedback use, and the page is parsed as a browser parses it
(html5lib): the payload's marker must not appear in any executable place (script text, an
event handler, a URL attribute), nor any element that runs or embeds content. The browser test
(tests/test_browser.py::test_formgrader_and_feedback_run_nothing_learner_authored) loads the
real pages in Chromium; these cover many more vectors in a second.
"""
import json
import os

import nbformat
import pytest
from bleach import html5lib_shim

from autograder import formgrader_csp, sanitize
from autograder.feedback import FEEDBACK_CSP, add_csp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5"
       "ErkJggg==")
M = "ZCMARK"                  # every payload holds it: where it lands decides whether it runs
JS = f"window.{M}=1"


def out(data, kind="display_data", metadata=None):
    o = nbformat.v4.new_output(kind, data=data, metadata=metadata or {})
    if kind == "execute_result":
        o.execution_count = 1
    return o


def code(*outputs):
    return nbformat.v4.new_code_cell("x = 1", outputs=list(outputs))


# name -> cells; the brief's three vectors first, then ones a browser or nbconvert's
# templates would also run.
VECTORS = {
    "html output, img onerror": [code(out({"text/html": f'<img src=x onerror="{JS}">',
                                           "text/plain": "x"}))],
    "javascript output": [code(out({"application/javascript": JS}))],
    "markdown img onerror": [nbformat.v4.new_markdown_cell(f'Answer <img src=x onerror="{JS}">')],
    "markdown javascript: link": [nbformat.v4.new_markdown_cell(f"[click](javascript:{JS})")],
    "markdown entity-encoded javascript: link": [nbformat.v4.new_markdown_cell(
        f'<a href="&#106;avascript:{JS}">x</a>')],
    "markdown script": [nbformat.v4.new_markdown_cell(f"<script>{JS}</script>")],
    "markdown mXSS through noscript": [nbformat.v4.new_markdown_cell(
        f'<noscript><p title="</noscript><img src=x onerror={JS}>">')],
    "markdown iframe srcdoc": [nbformat.v4.new_markdown_cell(
        f'<iframe srcdoc="<script>{JS}</script>"></iframe>')],
    "markdown svg onload": [nbformat.v4.new_markdown_cell(f'<svg onload="{JS}"></svg>')],
    "markdown math xlink": [nbformat.v4.new_markdown_cell(
        f'<math><maction actiontype="statusline" xlink:href="javascript:{JS}">x</maction></math>')],
    "markdown meta refresh and base": [nbformat.v4.new_markdown_cell(
        f'<meta http-equiv="refresh" content="0;url=javascript:{JS}"><base href="//{M}.example/">')],
    "markdown form action": [nbformat.v4.new_markdown_cell(
        f'<form action="javascript:{JS}"><button>go</button></form>')],
    "markdown style import": [nbformat.v4.new_markdown_cell(f"<style>@import '//{M}.css';</style>")],
    "markdown data: html link": [nbformat.v4.new_markdown_cell(
        f'<a href="data:text/html,<script>{JS}</script>">x</a>')],
    "text/javascript output": [code(out({"text/javascript": JS, "text/plain": "x"}))],
    "svg output with script": [code(out({"image/svg+xml": f"<svg><script>{JS}</script></svg>"}))],
    "html output, svg onload": [code(out({"text/html": f'<svg><g onload="{JS}"/></svg>'}))],
    "html output, object and embed": [code(out({"text/html": f'<object data="{M}.swf"></object>'
                                                             f'<embed src="{M}.swf">'}))],
    "markdown output with script": [code(out({"text/markdown": f"hi <script>{JS}</script>"}))],
    "png data breaking out of src": [code(out({"image/png": f'x" onerror="{JS}'}))],
    "png metadata breaking out of width": [code(out(
        {"image/png": PNG}, metadata={"image/png": {"width": f'1 onerror="{JS}"',
                                                    "filenames": {"image/png": f"javascript:{JS}"}}}))],
    "mermaid output breaking out of pre": [code(out(
        {"text/vnd.mermaid": f"</pre><img src=x onerror={JS}>"}))],
    "widget view and widget state": [code(out(
        {"application/vnd.jupyter.widget-view+json": {"model_id": M, "version_major": 2,
                                                      "version_minor": 0}}))],
    "execute_result html": [code(out({"text/html": f"<script>{JS}</script>"}, "execute_result"))],
}


def _notebook(cells, widget_state=False):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.from_dict(json.loads(json.dumps(c))) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if widget_state:
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
            "state": {M: {"model_name": "HTMLModel", "state": {"value": f"<img onerror={JS}>"}}}}}
    return nb


_EXPORTERS = {}


def _render(nb, template):
    from nbconvert import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    if template not in _EXPORTERS:
        css = os.path.join(handlers.static_path, "node_modules", "bootstrap", "dist", "css")
        _EXPORTERS[template] = HTMLExporter(      # as formgrader and nbgrader's feedback make it
            template_name=template, extra_template_basedirs=[handlers.template_path],
            extra_template_paths=[css])
    exporter = _EXPORTERS[template]
    resources = {"base_url": "/", "submission_id": "s", "notebook_id": "n", "assignment_id": "a",
                 "index": 0, "total": 1, "student": "st", "notebook_path": "p",
                 "nbgrader": {"notebook": "n", "score": 0, "max_score": 1, "late_penalty": 0}}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    return body


def _executable_marks(page):
    """Where the marker sits in a place a browser executes, loads or embeds."""
    parser = html5lib_shim.BleachHTMLParser(tags=None, strip=False, consume_entities=False,
                                            namespaceHTMLElements=False)
    found, in_script = [], False
    for tok in html5lib_shim.getTreeWalker("etree")(parser.parseFragment(page)):
        if tok["type"] in ("StartTag", "EmptyTag"):
            attrs = {n: v for (_, n), v in (tok.get("data") or {}).items()}
            if tok["name"] == "script":
                in_script = attrs.get("type", "text/javascript") in ("text/javascript", "module")
            for name, value in attrs.items():
                if M in value and (name.startswith("on") or name in (
                        "href", "src", "action", "formaction", "srcdoc", "data", "content",
                        "xlink:href", "width", "height", "style")):
                    found.append(f"<{tok['name']} {name}=...{M}>")
            if tok["name"] in ("iframe", "object", "embed", "svg", "math", "base", "meta",
                               "form", "style") and M in json.dumps(attrs) + page:
                found.append(f"<{tok['name']}>")
        elif tok["type"] == "EndTag" and tok["name"] == "script":
            in_script = False
        elif tok["type"] in ("Characters", "SpaceCharacters") and in_script and M in tok["data"]:
            found.append("<script> text")
    return found


def _cells_part(page):
    """The notebook's own part of a formgrade/feedback page (the template's head has scripts)."""
    start = page.find('id="notebook-container"')
    assert start > 0, "the template changed: no notebook container"
    return page[start:]


@pytest.mark.parametrize("name", list(VECTORS))
def test_vector_is_inert_after_sanitizing(name):
    nb = _notebook(VECTORS[name], widget_state=name.startswith("widget"))
    raw = _cells_part(_render(_notebook(VECTORS[name], widget_state=name.startswith("widget")),
                              "feedback"))
    notes = sanitize.clean_notebook(nb)
    assert notes, f"{name}: the sanitizer saw nothing to remove"
    for template in ("formgrade", "feedback"):
        page = _cells_part(_render(nb, template))
        assert _executable_marks(page) == [], (name, template, _executable_marks(page))
    # The oracle itself: a vector that reaches the page in a live place is seen (for the ones
    # nbconvert renders at all: svg is base64 in an <img>, mermaid and widgets need a CDN).
    # (html5lib parses <noscript> as a browser without scripts would: the mXSS stays hidden.)
    if name not in ("svg output with script", "widget view and widget state", "text/javascript "
                    "output", "markdown output with script", "markdown style import",
                    "markdown mXSS through noscript"):
        assert _executable_marks(raw) or "mermaid" in name, f"{name}: the unsanitized page is inert"


def test_widget_state_is_dropped():
    nb = _notebook([], widget_state=True)
    sanitize.clean_notebook(nb)
    assert "widgets" not in nb.metadata


def test_course_figures_and_text_pass_unchanged():
    """A PNG figure, its metadata, text and errors come through as they were; every markdown
    cell of every released notebook is left byte for byte (none is shown as text)."""
    fig = out({"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"},
              metadata={"image/png": {"width": 640, "needs_background": "light"}})
    stream = nbformat.v4.new_output("stream", text="loss 0.25 <b>\n")
    err = nbformat.v4.new_output("error", ename="AssertionError", evalue="x < 1", traceback=["tb"])
    cell = code(fig, stream, err)
    before = json.loads(json.dumps(cell))
    assert sanitize.clean_cell(cell) == []
    assert json.loads(json.dumps(cell)) == before
    import glob
    checked = 0
    for path in glob.glob(os.path.join(ROOT, "notebooks", "*", "*.ipynb")):
        for c in nbformat.read(path, as_version=4).cells:
            if c.cell_type == "markdown":
                assert sanitize.safe_markdown(c.source) == (c.source, []), (path, c.source[:200])
                checked += 1
    assert checked > 50


def test_markdown_with_active_content_is_shown_as_text():
    src = "My *answer* ~~~ <img src=x onerror=alert(1)>"
    shown, found = sanitize.safe_markdown(src)
    assert found == ["src= on <img>", "onerror= on <img>"]
    html = sanitize.render_markdown(shown)
    assert "Shown as text by the grader" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert sanitize.active_content(html) == []


def test_html_output_keeps_formatting_loses_handlers():
    o = out({"text/html": '<table class="dataframe"><tr><td><b>1</b></td></tr></table>'
                          '<a href="https://pytorch.org">ok</a><img src=x onerror=alert(1)>'})
    notes = sanitize.clean_output(o)
    assert '<td><b>1</b></td>' in o["data"]["text/html"] and 'href="https://pytorch.org"' in \
        o["data"]["text/html"] and "onerror" not in o["data"]["text/html"]
    assert notes == ["text/html output: removed src= on <img>, onerror= on <img>"]


def test_dropped_output_says_so():
    o = out({"application/javascript": "alert(1)"})
    assert sanitize.clean_output(o) == ["output not shown: application/javascript"]
    assert o["data"] == {"text/plain": "[output not shown (application/javascript): the grader "
                                       "shows no active content]"}


def test_csp_nonces_only_the_servers_own_scripts():
    page = (b'<html><head><script>var a=1</script><script src="/s.js"></script></head><body>'
            b'<div class="container" id="notebook-container"><script>evil()</script></div>')
    stamped = formgrader_csp.stamp(page, "N0NCE", "before-notebook")
    assert stamped.count(b'nonce="N0NCE"') == 2 and b"<script>evil()" in stamped
    assert formgrader_csp.stamp(page.replace(b"notebook-container", b"x"), "N", "before-notebook") \
        == page.replace(b"notebook-container", b"x"), "no marker: no nonce at all"
    assert formgrader_csp.stamp(page, "N", "all").count(b'nonce="N"') == 3
    which = formgrader_csp.own_scripts
    assert which("/formgrader/submissions/abc/", "/") == "before-notebook"
    assert which("/formgrader", "/") == which("/formgrader/gradebook/a/b", "/") == "all"
    assert which("/lab", "/") == which("/lab/tree/x.ipynb", "/") == "all"
    for path in ("/files/feedback/x.html", "/nbconvert/html/a.ipynb", "/formgrader/static/x.js",
                 "/formgrader/api/assignments", "/view/x.html", "/lab/api/settings"):
        assert which(path, "/") is None, path
    assert which("/user/t/formgrader", "/user/t/") == "all" and which("/formgrader", "/user/t/") is None


def test_csp_policy_forbids_inline_script():
    hashes = formgrader_csp.handler_hashes()
    assert len(hashes) == 5, hashes          # toggle_name(true|false), toggleAllNames, 2 modals
    policy = formgrader_csp.policy("/", "N", hashes)
    script = next(d for d in policy.split("; ") if d.startswith("script-src"))
    assert "'unsafe-inline'" not in script and "'nonce-N'" in script and "'self'" in script
    assert "object-src 'none'" in policy and "base-uri 'self'" in policy


def test_feedback_page_gets_its_csp_first():
    page = "<!DOCTYPE html>\n<html>\n<head>\n<meta charset='utf-8'>\n<script src=x></script>"
    secured = add_csp(page)
    assert secured.index(FEEDBACK_CSP) < secured.index("<script")
    assert add_csp(secured) == secured
    assert "'unsafe-inline'" not in FEEDBACK_CSP and "script-src" in FEEDBACK_CSP


def test_formgrader_exporter_configuration_sanitizes():
    """The exporter as formgrader_csp.configure sets it up (c.HTMLExporter.preprocessors)."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    c = Config()
    formgrader_csp.configure(c)
    cells = [cell for name in ("html output, img onerror", "javascript output",
                               "markdown img onerror") for cell in VECTORS[name]]
    page, _ = HTMLExporter(config=c, template_name="lab").from_notebook_node(_notebook(cells))
    assert M in page and _executable_marks(page.split("<body", 1)[1]) == []
    assert "Shown as text by the grader" in page
