"""Content-Security-Policy for the Jupyter server that shows formgrader: no inline script runs
but the server's own (a Jupyter server extension, enabled by autograder/formgrader_config.py).

Every response gets one more Content-Security-Policy header (browsers enforce every such
header, so the server's own `frame-ancestors`, and the `sandbox` of /files/, still hold):

    script-src 'self' [nonce] 'unsafe-hashes' <hashes>; object-src 'none'; base-uri 'self';
    form-action 'self'; report-uri <base>/api/security/csp-report

Scripts load only from the server (JupyterLab's bundles, formgrader's static files): a
learner's `<script>`, `on...=` handler, `javascript:` URL or `application/javascript` output
never runs, even where the sanitizer (autograder/sanitize.py) missed it.

What needed more than that, found by loading each page under this policy in Chromium
(tests/test_browser.py::test_formgrader_and_feedback_run_nothing_learner_authored):
- nbgrader's formgrader pages (Manage Assignments, Gradebook, Manage Students and the
  submission view) set their globals (`base_url`, `submission_id`, ...) and start their
  scripts in inline `<script>` blocks: without them every formgrader page is blank. The
  server's own inline scripts get a fresh nonce per response: on formgrader's pages and
  JupyterLab's (its page removes `?token=` from the address bar inline), every `<script`
  tag of the page, and on a submission view only those before `id="notebook-container"`,
  where the notebook starts: scripts of the notebook itself never get one. A submission view
  without that marker gets no nonce at all (a blank page, never a script of the notebook).
- three inline event handlers in nbgrader's templates (the show/hide student name toggles):
  allowed by their hashes ('unsafe-hashes'), computed from nbgrader's templates at start-up.
"""
from __future__ import annotations

import base64
import glob
import hashlib
import os
import re
import secrets

from tornado.web import OutputTransform

SCRIPT_TAG = re.compile(rb"<script(?=[\s>])", re.I)
NOTEBOOK_START = b'id="notebook-container"'


def handler_hashes() -> list[str]:
    """CSP hashes of the inline event handlers in nbgrader's formgrader templates."""
    import nbgrader.server_extensions.formgrader as fg
    found = set()
    for path in glob.glob(os.path.join(os.path.dirname(fg.__file__), "templates", "**", "*"),
                          recursive=True):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                found |= set(re.findall(r'\son[a-z]+="([^"{}]*)"', f.read(), flags=re.I))
    return sorted("'sha256-%s'" % base64.b64encode(hashlib.sha256(h.encode()).digest()).decode()
                  for h in found)


def policy(base_url: str, nonce: str | None, hashes: list[str]) -> str:
    script = ["'self'", "'unsafe-eval'"] + ([f"'nonce-{nonce}'"] if nonce else []) + \
        (["'unsafe-hashes'"] + hashes if hashes else [])
    return "; ".join([f"script-src {' '.join(script)}", "object-src 'none'", "base-uri 'self'",
                      "form-action 'self'",
                      f"report-uri {base_url.rstrip('/')}/api/security/csp-report"])


def own_scripts(path: str, base_url: str) -> str | None:
    """Which of a page's inline scripts are the server's own: "all", "before-notebook", or
    None (no page of ours: notebooks converted on the fly, files, API answers)."""
    rel = path[len(base_url):] if path.startswith(base_url) else None
    if rel is None:
        return None
    if rel.startswith("formgrader/submissions/"):
        return "before-notebook"
    if rel == "formgrader" or (rel.startswith("formgrader/") and
                               not rel.startswith(("formgrader/static/", "formgrader/api/"))):
        return "all"
    if rel == "lab" or (rel.startswith("lab/") and
                        not rel.startswith(("lab/api/", "lab/extensions/", "lab/static/"))):
        return "all"
    return None


def stamp(page: bytes, nonce: str, which: str) -> bytes:
    """`page` with nonce="..." on the server's own <script> tags (see own_scripts)."""
    end = len(page)
    if which == "before-notebook":
        end = page.find(NOTEBOOK_START)
        if end < 0:
            return page
    head = SCRIPT_TAG.sub(b'<script nonce="' + nonce.encode() + b'"', page[:end])
    return head + page[end:]


def make_transform(base_url: str, hashes: list[str]):
    class ContentSecurityPolicy(OutputTransform):
        """Adds the policy to every response; nonces the server's own inline scripts."""

        def __init__(self, request):
            super().__init__(request)
            self.which = own_scripts(request.path, base_url)

        def transform_first_chunk(self, status_code, headers, chunk, finishing):
            nonce = None
            html = headers.get("Content-Type", "").startswith("text/html")
            if self.which and html and finishing and SCRIPT_TAG.search(chunk):
                nonce = secrets.token_urlsafe(18)
                chunk = stamp(chunk, nonce, self.which)
                if "Content-Length" in headers:
                    headers["Content-Length"] = str(len(chunk))
            headers.add("Content-Security-Policy", policy(base_url, nonce, hashes))
            return status_code, headers, chunk

    return ContentSecurityPolicy


def configure(c) -> None:
    """The settings of a server that shows submissions (`make formgrader`, the hub's instructor):
    formgrader's exporter sanitizes every notebook it renders, and this extension's policy."""
    c.HTMLExporter.preprocessors = ["autograder.sanitize.SanitizeLearnerContent"]
    c.ServerApp.jpserver_extensions.update({"autograder.formgrader_csp": True})


def _jupyter_server_extension_points():
    return [{"module": "autograder.formgrader_csp"}]


def _load_jupyter_server_extension(serverapp):
    base_url = serverapp.web_app.settings.get("base_url", "/")
    serverapp.web_app.add_transform(make_transform(base_url, handler_hashes()))
    serverapp.log.info("formgrader CSP: no inline script but the server's own (%s)", __name__)
