"""Learner-authored HTML made inert before a browser shows it (formgrader, feedback pages).

nbconvert copies a notebook's text/html and application/javascript outputs and the HTML in its
markdown into the page verbatim, and formgrader serves that page at the Jupyter server's
origin: a learner's `<img onerror=...>` would run as the instructor, with the contents and
kernels API at hand. `SanitizeLearnerContent` rewrites a notebook so that nothing in it can
run in a browser, whatever renders it:

- outputs keep only inert data: text, PNG/JPEG images (base64 checked, so the data cannot end
  the `src` attribute it is written into), LaTeX, and HTML or markdown reduced to an
  allow-list of formatting tags (no script, iframe, object, embed, svg, math, form, style; no
  event handler, `style`, `data-*` or `javascript:` URL; images only as data: PNG/JPEG/GIF);
  javascript, SVG, widget views and every other type are dropped, with a line saying so;
- a markdown cell (or markdown output) whose rendered HTML holds anything outside the
  allow-list is shown as literal text under a note naming what was found: a grader reads
  exactly what the learner wrote, and nothing renders; markdown without such content is
  left byte for byte as it was;
- tags, cell ids, attachments and notebook metadata that templates write into attributes are
  reduced to plain values.

It runs at the end of autograding (so OUT/autograded/, which formgrader shows, is clean), in
feedback generation, and in formgrader's own exporter (autograder/formgrader_config.py).
The course's figures are PNG display_data: they pass unchanged.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import html
import re

import bleach
from bleach import html5lib_shim
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

# Formatting that cannot run code. No `style` (CSS can overlay formgrader's own controls),
# no forms, no media but data: images.
TAGS = frozenset("""a abbr b blockquote br caption cite code col colgroup dd del details dfn div
dl dt em figcaption figure h1 h2 h3 h4 h5 h6 hr i img ins kbd li mark ol p pre q s samp small
span strike strong sub summary sup table tbody td tfoot th thead tr u ul var""".split())
GLOBAL_ATTRS = {"class", "title", "lang", "dir"}
TAG_ATTRS = {"a": {"href"}, "img": {"src", "alt", "width", "height"},
             "td": {"colspan", "rowspan", "align"}, "th": {"colspan", "rowspan", "align", "scope"},
             "table": {"border"}, "ol": {"start"}, "col": {"span"}, "colgroup": {"span"},
             **{f"h{n}": {"id"} for n in range(1, 7)}}     # markdown headings' anchors
LINK_SCHEMES = ("http:", "https:", "mailto:")
DATA_IMAGE = re.compile(r"^data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*$", re.I)
SAFE_WORD = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OUTPUT_TYPES = ("text/plain", "text/html", "text/markdown", "text/latex", "image/png", "image/jpeg")


def _url_ok(tag: str, name: str, value: str) -> bool:
    """Links: http(s), mailto, in-page and relative; images: data: PNG/JPEG/GIF only."""
    v = re.sub(r"[\x00-\x20]", "", value)      # browsers ignore these inside a scheme
    if name == "src":
        return bool(DATA_IMAGE.match(value.strip()))
    if v.startswith("//"):
        return False
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", v)
    return scheme is None or (scheme.group(1).lower() + ":") in LINK_SCHEMES


def _attr_ok(tag: str, name: str, value: str) -> bool:
    if name not in GLOBAL_ATTRS and name not in TAG_ATTRS.get(tag, ()):
        return False
    if name in ("href", "src"):                  # the parser keeps entities: a browser doesn't
        return _url_ok(tag, name, html.unescape(value))
    return True


_CLEANER = bleach.Cleaner(tags=TAGS, attributes=_attr_ok,
                          protocols=["http", "https", "mailto", "data"], strip=True,
                          strip_comments=True)
# The same html5lib parse as the cleaner (a browser's), without its filtering: what is there.
_PARSER = html5lib_shim.BleachHTMLParser(tags=None, strip=False, consume_entities=False,
                                         namespaceHTMLElements=False)
_WALKER = html5lib_shim.getTreeWalker("etree")


def clean_html(markup: str) -> str:
    """`markup` reduced to the allow-list (disallowed tags removed, their text kept)."""
    return _CLEANER.clean(markup) if markup else ""


def _word(text: str) -> str:
    """A tag or attribute name as it may appear in a note (no markup, no backticks)."""
    return re.sub(r"[^a-z0-9:_./+-]", "?", str(text).lower())[:40]


def active_content(markup: str) -> list[str]:
    """What in `markup` falls outside the allow-list, e.g. ['<script>', 'onerror= on <img>']."""
    found = []
    for token in _WALKER(_PARSER.parseFragment(markup)):
        if token["type"] not in ("StartTag", "EmptyTag"):
            continue
        tag = token["name"]
        if tag not in TAGS:
            found.append(f"<{_word(tag)}>")
            continue
        for (_, name), value in (token.get("data") or {}).items():
            if not _attr_ok(tag, name, value):
                found.append(f"{_word(name)}= on <{tag}>")
    return list(dict.fromkeys(found))


def render_markdown(source: str, attachments: dict | None = None) -> str:
    """Markdown to HTML exactly as nbconvert's HTMLExporter renders a markdown cell."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
    renderer = IPythonRenderer(escape=False, attachments=attachments or {}, embed_images=False,
                               path="", anchor_link_text="¶", exclude_anchor_links=False)
    return MarkdownWithMath(renderer=renderer).render(source)


def as_literal(source: str, found: list[str]) -> str:
    """Markdown that shows `source` as text, under a note naming what was not rendered."""
    fence = "~" * max(4, 1 + max((len(m) for m in re.findall(r"~+", source)), default=0))
    what = ", ".join(f"`{f}`" for f in found[:8]) + (" …" if len(found) > 8 else "")
    return (f"> ⚠ **Shown as text by the grader:** this markdown holds content a browser would "
            f"run or load ({what}); it is never rendered. The learner's source:\n\n"
            f"{fence}text\n{source}\n{fence}\n")


def safe_markdown(source: str, attachments: dict | None = None) -> tuple[str, list[str]]:
    """(markdown to show, what was found): `source` itself when its rendering is inert."""
    found = active_content(render_markdown(source, attachments))
    if not found:
        return source, []
    literal = as_literal(source, found)
    if active_content(render_markdown(literal)):        # cannot happen; never show it then
        return "> ⚠ **Removed by the grader:** this markdown held active content.", found
    return literal, found


def _text(value) -> str:
    """nbformat multiline strings may be lists; anything else is not text."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return value if isinstance(value, str) else ""


def _image(value) -> str | None:
    """Base64 image data, or None when it is not plain base64."""
    data = _text(value)
    try:
        base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        return None
    return data


def _image_metadata(meta) -> dict:
    out = {}
    if isinstance(meta, dict):
        for key in ("width", "height"):
            if isinstance(meta.get(key), int) and not isinstance(meta.get(key), bool):
                out[key] = meta[key]
        if meta.get("needs_background") in ("light", "dark"):
            out["needs_background"] = meta["needs_background"]
        if meta.get("unconfined") is True:
            out["unconfined"] = True
    return out


def clean_output(output: dict) -> list[str]:
    """Make one output inert in place; returns notes on what was removed."""
    notes, kind = [], output.get("output_type")
    if kind == "stream":
        output["name"] = "stderr" if output.get("name") == "stderr" else "stdout"
        output["text"] = _text(output.get("text"))
        return notes
    if kind == "error":
        output["ename"], output["evalue"] = _text(output.get("ename")), _text(output.get("evalue"))
        tb = output.get("traceback")
        output["traceback"] = [t for t in tb if isinstance(t, str)] if isinstance(tb, list) else []
        return notes
    data = output.get("data") if isinstance(output.get("data"), dict) else {}
    meta = output.get("metadata") if isinstance(output.get("metadata"), dict) else {}
    kept, kept_meta, dropped = {}, {}, []
    for mime, value in data.items():
        if mime not in OUTPUT_TYPES:
            dropped.append(mime)
        elif mime.startswith("image/"):
            image = _image(value)
            if image is None:
                dropped.append(f"{mime}, not base64")
            else:
                kept[mime] = image
                if _image_metadata(meta.get(mime)):
                    kept_meta[mime] = _image_metadata(meta.get(mime))
                if meta.get(mime) not in (None, kept_meta.get(mime)):
                    notes.append(f"{mime} metadata reduced to width, height, background")
        elif mime == "text/html":
            markup = _text(value)
            kept[mime] = clean_html(markup)
            found = active_content(markup)
            if found:
                notes.append(f"text/html output: removed {', '.join(found[:5])}")
        elif mime == "text/markdown":
            kept[mime], found = safe_markdown(_text(value))
            if found:
                notes.append(f"text/markdown output shown as text: {', '.join(found[:5])}")
        else:
            kept[mime] = _text(value)
    if dropped:
        what = "; ".join(re.sub(r"[^A-Za-z0-9:_./+, -]", "?", d)[:60] for d in dropped[:5])
        notes.append(f"output not shown: {what}")
        if "text/plain" not in kept:
            kept["text/plain"] = f"[output not shown ({what}): the grader shows no active content]"
    output["data"], output["metadata"] = kept, kept_meta
    if kind == "execute_result" and not isinstance(output.get("execution_count"), int):
        output["execution_count"] = None
    return notes


def clean_cell(cell: dict) -> list[str]:
    """Make one cell inert in place (outputs, markdown, attachments, tags, id); returns notes."""
    notes = []
    meta = cell.get("metadata")
    if isinstance(meta, dict) and "tags" in meta:
        tags = meta["tags"] if isinstance(meta["tags"], list) else []
        meta["tags"] = [t for t in tags if isinstance(t, str) and SAFE_WORD.match(t)]
    if "id" in cell and not (isinstance(cell["id"], str) and SAFE_WORD.match(cell["id"])):
        cell["id"] = hashlib.sha256(repr(cell["id"]).encode()).hexdigest()[:16]
    if "attachments" in cell:
        att = cell["attachments"] if isinstance(cell["attachments"], dict) else {}
        cell["attachments"] = {
            name: {m: _image(d) for m, d in bundle.items()
                   if m in ("image/png", "image/jpeg") and _image(d) is not None}
            for name, bundle in att.items() if isinstance(bundle, dict) and SAFE_WORD.match(
                re.sub(r"[.]", "_", str(name)))}
    kind = cell.get("cell_type")
    if kind == "markdown":
        cell["source"], found = safe_markdown(_text(cell.get("source")), cell.get("attachments"))
        if found:
            notes.append(f"markdown shown as text: {', '.join(found[:5])}")
    elif kind == "raw":
        cell["source"] = _text(cell.get("source"))
    elif kind == "code":
        outputs = cell.get("outputs") if isinstance(cell.get("outputs"), list) else []
        cell["outputs"] = [o for o in outputs if isinstance(o, dict)]
        for out in cell["outputs"]:
            notes += clean_output(out)
    return notes


def clean_notebook(nb: dict) -> list[str]:
    """Make a whole notebook inert in place; returns notes on what was removed."""
    meta = nb.get("metadata")
    if isinstance(meta, dict):
        meta.pop("widgets", None)        # widget state renders HTML through a CDN script
        meta.pop("title", None)
    notes = []
    for i, cell in enumerate(nb.get("cells") or []):
        if isinstance(cell, dict):
            notes += [f"cell {i}: {n}" for n in clean_cell(cell)]
    return notes


class SanitizeLearnerContent(Preprocessor):
    """nbconvert/nbgrader preprocessor: `clean_notebook` on the notebook being converted."""

    enabled = Bool(True).tag(config=True)   # nbconvert preprocessors are off by default

    def preprocess(self, nb, resources):
        import nbformat
        for note in clean_notebook(nb):
            self.log.warning("sanitized: %s", note)
        return nbformat.from_dict(nb), resources    # attribute access again, for templates
