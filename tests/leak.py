"""The leak test: does a learner-visible file hold a graded answer, even paraphrased?

    python -m tests.leak              # per-notebook table, then every match (file, cell, line)
    python -m tests.leak --all        # also the matches the allowlist accepts

Secrets are the `### BEGIN SOLUTION` .. `### END SOLUTION` and `### BEGIN HIDDEN TESTS` ..
`### END HIDDEN TESTS` regions of every solutions/<id>/<id>.ipynb. Learner-visible is what a
learner can read: every cell (code and markdown) of notebooks/*/*.ipynb, zerocourse/, docs/,
README.md and everything `make handout` ships (autograder/handout.py's lists).

Both sides become token streams that a paraphrase does not change:
- code is read with Python's `tokenize`; comments, whitespace, newlines and (on the secret
  side) docstrings are dropped;
- a local identifier becomes a placeholder; what makes code specific is kept: keywords,
  builtins, attribute and method names (after a `.`), keyword-argument names, every name an
  import binds anywhere (torch, dist, math, zerocourse's helpers) and literals (normalised:
  1e6 == 1000000.0, 'a' == "a");
- grouping parentheses are dropped (call parentheses stay), so `return (a, b)` == `return a, b`
  and `(x + y) * z` keeps its `( )`-free operator sequence;
- on the visible side, prose is read too: markdown cells, docstrings, comments and string
  literals go through a tolerant tokenizer of the same vocabulary (unicode minus and times
  signs read as - and *), so a formula written in a docstring or in a hint is code too.

A window is N_GRAM consecutive tokens with at least MIN_SPECIFIC specific ones (a kept name, a
literal or an arithmetic/comparison operator: punctuation, keywords and placeholders say
nothing). A region matches a visible stream when one of its windows occurs there with the same
keys and the same pattern of placeholders (a window renames its locals in order of first use,
so `a * b + a` matches `x * y + x`, not `x * y + z`); consecutive windows make a run, and the
longest run of each (region, visible file) pair is reported. Idioms the course writes
everywhere (`dist.get_world_size(), dist.get_rank()`, ...) are listed in the allowlist and
masked on both sides first.

The two numbers were measured on main at 3e19c84 (`python -m tests.leak --sweep`, and against
the review's known leaks: G1, G2 in 07 and in shard_holder.py, G5, G7 in 02 and 03, G9):

    window  specific  regions matched  (region, file) pairs  known leaks caught
      9        4            32                 88                  8 of 8
     10        4            28                 69                  8 of 8
     11        4            25                 63                  8 of 8      <- chosen
     12        4            24                 58                  7 (not G5's one-line formula)
     13        4            20                 44                  6 (not G5, not 03's shard_bounds)
     11        3            39                 99                  8 (more boilerplate)
     11        5            16                 23                  7 (not 02's batch slice)

What a token comparison cannot see, by construction: the same algebra written differently
(G9's `sent_formula=(3 if stage == 3 else 2) * psi * f * 2` against 06's `passes * one_pass`;
G7's `batch[rank * B // N : (rank + 1) * B // N]` docstring against `batch[rank * shard:...]`,
whose slice the test does catch in 02's own later cells), a loop against a comprehension
(shard_holder's trainable_ranges; the file is caught on the padded layout next to it), and
formulas in math notation without operators (G3's "4b bytes per token", G6's 2(N−1)·α).

Accepted and known matches live in tests/leak_allowlist.txt: `region | visible file | reason`
(fnmatch patterns; the reason starts with the review's finding id when the match is a known
leak being fixed, NEW: when no finding lists it, ACCEPTED: when it is no answer) and
`idiom | code | reason`. tests/test_leak.py fails on any match the allowlist does not explain;
this CLI lists the entries no match needs any more.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import fnmatch
import io
import json
import keyword
import os
import re
import sys
import tokenize
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOWLIST = os.path.join(ROOT, "tests", "leak_allowlist.txt")
N_GRAM = 11
MIN_SPECIFIC = 4
LOCAL = "·"                     # the placeholder of a local identifier in a token stream
IDIOM = "⟨idiom⟩"               # an accepted course idiom (tests/leak_allowlist.txt), masked

_BEGIN = re.compile(r"^\s*###\s*BEGIN (SOLUTION|HIDDEN TESTS)\b")
_END = re.compile(r"^\s*###\s*END (SOLUTION|HIDDEN TESTS)\b")
_KEEP_ALWAYS = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins))
# The prose tokenizer: numbers, names, Python's operators, brackets and punctuation.
_PROSE = re.compile(r"""
    (?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?) |
    (?P<name>[^\W\d]\w*) |
    (?P<op>\*\*=?|//=?|->|==|!=|<=|>=|<<|>>|[-+*/%@&|^]=|[-+*/%@&|^~<>=()\[\]{},:.;])
""", re.X)
_UNICODE_OPS = str.maketrans({"−": "-", "–": "-", "×": "*", "·": "*", "⋅": "*", "÷": "/"})
# Tokens that make a window specific: operators of arithmetic and comparison (punctuation,
# keywords and locals do not count; kept names and literals do).
_SPECIFIC_OPS = {"+", "-", "*", "/", "//", "%", "**", "@", "==", "!=", "<", ">", "<=", ">=",
                 "<<", ">>", "&", "|", "^", "~"}


@dataclass
class Tok:
    """One normalised token: `key` is what the n-grams compare (LOCAL for a local
    identifier, whose real name is `name`); `line` is 1-based in its cell or file."""
    key: str
    name: str
    line: int


@dataclass
class Region:
    """A secret: one solution or hidden-test region of a solutions notebook."""
    aid: str
    cell: int                   # 0-based cell index (the release copy has the same order)
    grade_id: str
    kind: str                   # "solution" or "hidden"
    where: str                  # the enclosing def/class ("ShardedUnit.__init__"), "<cell>" at
                                # top level, "hidden" for a hidden-test region
    line: int                   # first line of the region in its cell
    toks: list = field(default_factory=list)

    @property
    def key(self) -> str:
        """The allowlist's name of this region: <id>:<grade_id>:<where>, e.g.
        05_zero3:zero3-unit:ShardedUnit.free or 03_zero1:zero1-shard-bounds-hidden:hidden."""
        return f"{self.aid}:{self.grade_id}:{self.where}"


@dataclass
class Stream:
    """A learner-visible token stream: code, or one piece of prose (a docstring, a comment
    block, a string literal, a markdown cell)."""
    path: str                   # relative to ROOT
    cell: int | None            # notebook cell index, None for a plain file
    kind: str                   # "code" or "prose"
    toks: list = field(default_factory=list)


@dataclass
class Match:
    region: Region
    stream: Stream
    length: int                 # tokens in the longest common run
    secret_line: int            # line (in the region's cell) where the run starts
    visible_line: int           # line (in the visible cell or file) where it starts
    snippet: str                # the run, as the secret's tokens (locals by their real names)
    places: int = 1             # cells or prose pieces of that file that share a run

    @property
    def location(self) -> str:
        cell = f" cell {self.stream.cell}" if self.stream.cell is not None else ""
        return f"{self.stream.path}{cell} line {self.visible_line}"


# --- tokenising --------------------------------------------------------------------------------

def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _strip_magics(text: str) -> str:
    """IPython's `%magic` and `!shell` lines as blank lines (line numbers stay)."""
    return "\n".join("" if l.lstrip().startswith(("%", "!")) else l for l in text.split("\n"))


def _literal(text: str) -> str:
    """A number or string literal in one spelling (1e6 == 1000000.0, 'a' == "a")."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return repr(value) if isinstance(value, (int, float, complex, str, bytes)) else text


def _classify(raw: list[tuple[str, str, int]], keep: set[str]) -> list[Tok]:
    """Raw (kind, text, line) tokens -> Tok: names that are local become LOCAL, grouping
    parentheses go (call and subscript brackets stay)."""
    out: list[Tok] = []
    stack: list[bool] = []          # for each open "(": is it a call's (kept) or a group's
    for i, (kind, text, line) in enumerate(raw):
        if kind == "op" and text == "(":
            prev = raw[i - 1] if i else None
            call = prev is not None and ((prev[0] == "name" and not keyword.iskeyword(prev[1]))
                                         or prev[1] in (")", "]"))
            stack.append(call)
            if call:
                out.append(Tok("(", "(", line))
            continue
        if kind == "op" and text == ")":
            if stack.pop() if stack else True:
                out.append(Tok(")", ")", line))
            continue
        if kind == "name":
            prev = raw[i - 1][1] if i else ""
            nxt = raw[i + 1][1] if i + 1 < len(raw) else ""
            is_kwarg = nxt == "=" and bool(stack)
            if text in keep or prev == "." or is_kwarg:
                out.append(Tok(text, text, line))
            else:
                out.append(Tok(LOCAL, text, line))
            continue
        out.append(Tok(text if kind == "op" else _literal(text), text, line))
    return out


def prose_tokens(text: str, keep: set[str], first_line: int = 1) -> list[Tok]:
    """The tolerant tokenizer, for markdown, docstrings, comments and string contents."""
    raw, line, pos = [], first_line, 0
    text = text.translate(_UNICODE_OPS)
    for m in _PROSE.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        kind = m.lastgroup
        raw.append(("op" if kind == "op" else kind, m.group(), line))
    return _classify(raw, keep)


@dataclass
class _Code:
    code: list                      # (kind, text, line) of the code itself
    docstrings: list                # (text, first line) of every bare string statement
    strings: list                   # (text, first line) of every other string literal
    comments: list                  # (text, line)


def _read_code(text: str) -> _Code | None:
    """Python's tokenize on `text`; None when it is not Python (then it is read as prose)."""
    res = _Code([], [], [], [])
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(_strip_magics(text)).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
            tokenize.COMMENT, tokenize.ENCODING}
    significant = [t for t in toks if t.type not in (tokenize.NL, tokenize.COMMENT)]
    bare = set()
    for j, t in enumerate(significant):     # a string that is a whole statement: a docstring
        if t.type == tokenize.STRING:
            before = significant[j - 1].type if j else tokenize.NEWLINE
            after = significant[j + 1].type if j + 1 < len(significant) else tokenize.NEWLINE
            if before in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT) and \
                    after in (tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.DEDENT):
                bare.add(t.start)
    for t in toks:
        if t.type == tokenize.COMMENT:
            res.comments.append((t.string.lstrip("#"), t.start[0]))
        elif t.type == tokenize.ERRORTOKEN:
            if t.string.strip():
                return None
        elif t.type in skip:
            continue
        elif t.type == tokenize.STRING:
            if t.start in bare:
                res.docstrings.append((t.string, t.start[0]))
            else:
                res.strings.append((t.string, t.start[0]))
                res.code.append(("str", t.string, t.start[0]))
        elif t.type == tokenize.NAME:
            res.code.append(("name", t.string, t.start[0]))
        elif t.type == tokenize.NUMBER:
            res.code.append(("num", t.string, t.start[0]))
        else:
            res.code.append(("op", t.string, t.start[0]))
    return res


def _imported_names(text: str) -> set[str]:
    """Names bound by an import statement in `text` (torch, dist, check_close, ...)."""
    names = set()
    for m in re.finditer(r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+)?import[ \t]+\(?([^)#\n]+)", text, re.M):
        for part in m.group(1).split(","):
            words = part.split()
            if words:
                names.add(words[-1] if "as" in words else words[0].split(".")[0])
    return {n for n in names if n.isidentifier()}


# --- the two sides -----------------------------------------------------------------------------

def _enclosing(tree: ast.AST | None, line: int) -> str:
    """Qualified name of the innermost def/class around `line` ("<cell>" if none)."""
    best: list[str] = []

    def visit(node, path):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if child.lineno <= line <= (child.end_lineno or child.lineno):
                    best[:] = path + [child.name]
                    visit(child, path + [child.name])
            else:
                visit(child, path)
    if tree is not None:
        visit(tree, [])
    return ".".join(best) or "<cell>"


def notebooks(kind: str, root: str = ROOT) -> list[tuple[str, dict]]:
    """(id, notebook) of every <kind>/<id>/<id>.ipynb ("solutions" or "notebooks")."""
    base = os.path.join(root, kind)
    out = []
    for aid in sorted(os.listdir(base)):
        path = os.path.join(base, aid, f"{aid}.ipynb")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                out.append((aid, json.load(f)))
    return out


def secret_regions(solutions: list[tuple[str, dict]], keep: set[str]) -> list[Region]:
    """Every solution and hidden-test region of the (id, solutions notebook) pairs, tokenised
    (comments, whitespace and docstrings dropped)."""
    regions = []
    for aid, nb in solutions:
        for ci, cell in enumerate(nb["cells"]):
            if cell.get("cell_type") != "code":
                continue
            text = _source(cell)
            spans, start, kind = [], None, None
            for ln, line in enumerate(text.split("\n"), 1):
                if _BEGIN.match(line):
                    start, kind = ln, "hidden" if "HIDDEN" in line else "solution"
                elif _END.match(line) and start is not None:
                    spans.append((start, ln, kind))
                    start = None
            if not spans:
                continue
            code = _read_code(text)
            try:
                tree = ast.parse(_strip_magics(text))
            except SyntaxError:
                tree = None
            toks = _classify(code.code, keep) if code else prose_tokens(text, keep)
            gid = (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id") or f"cell{ci}"
            for a, b, kind in spans:
                where = "hidden" if kind == "hidden" else _enclosing(tree, a + 1)
                regions.append(Region(aid, ci, gid, kind, where, a,
                                      [t for t in toks if a < t.line < b]))
    return regions


def visible_files(root: str = ROOT) -> list[str]:
    """What a learner can read, relative to root: the notebooks, zerocourse/, docs/, README.md
    and every file `make handout` ships (autograder/handout.py's COPY and AUTOGRADER lists)."""
    if root not in sys.path:
        sys.path.insert(0, root)
    from autograder import handout
    files = {os.path.join("autograder", n) for n in handout.AUTOGRADER}
    files |= {os.path.join("autograder", "handout", n)
              for n in os.listdir(os.path.join(root, "autograder", "handout"))}
    for top in list(handout.COPY) + ["docs", "README.md"]:
        path = os.path.join(root, top)
        if os.path.isfile(path):
            files.add(top)
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
            files |= {os.path.relpath(os.path.join(dirpath, n), root) for n in filenames
                      if not n.endswith((".pyc", ".png", ".jpg", ".svg", ".gif", ".pdf"))}
    return sorted(files)


def _code_streams(text: str, path: str, cell: int | None, keep: set[str]) -> list[Stream]:
    """A code cell or file: its code, and each docstring, comment block and string as prose."""
    code = _read_code(text)
    if code is None:
        return [Stream(path, cell, "prose", prose_tokens(text, keep))]
    out = [Stream(path, cell, "code", _classify(code.code, keep))]
    for s, line in code.docstrings + code.strings:
        body = s.lstrip("rbuRBUfF")
        quote = 3 if body[:3] in ('"""', "'''") else 1
        out.append(Stream(path, cell, "prose", prose_tokens(body[quote:-quote], keep, line)))
    blocks: list[list] = []
    last = -2
    for c, line in code.comments:           # consecutive comment lines read as one text
        if line == last + 1 and blocks:
            blocks[-1][0] += "\n" + c
        else:
            blocks.append([c, line])
        last = line
    out += [Stream(path, cell, "prose", prose_tokens(c, keep, line)) for c, line in blocks]
    return out


def visible_streams(texts: dict[str, str], keep: set[str]) -> list[Stream]:
    """{relative path: file text} as token streams: a notebook cell by cell (outputs too),
    a .py file as code, anything else as prose."""
    out = []
    for rel, text in texts.items():
        if rel.endswith(".ipynb"):
            for ci, cell in enumerate(json.loads(text).get("cells", [])):
                src = _source(cell)
                if cell.get("cell_type") == "code":
                    out += _code_streams(src, rel, ci, keep)
                    for o in cell.get("outputs", []):
                        shown = o.get("text") or (o.get("data") or {}).get("text/plain") or ""
                        shown = "".join(shown) if isinstance(shown, list) else shown
                        if shown:
                            out.append(Stream(rel, ci, "prose", prose_tokens(shown, keep)))
                else:
                    out.append(Stream(rel, ci, "prose", prose_tokens(src, keep)))
        elif rel.endswith(".py"):
            out += _code_streams(text, rel, None, keep)
        else:
            out.append(Stream(rel, None, "prose", prose_tokens(text, keep)))
    return out


def read_texts(files: list[str], root: str = ROOT) -> dict[str, str]:
    """{relative path: text} of the files that are text (others are skipped)."""
    out = {}
    for rel in files:
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                out[rel] = f.read()
        except (OSError, UnicodeDecodeError):
            continue
    return out


def keep_names(texts: list[str]) -> set[str]:
    """Names kept as themselves: keywords, builtins and every name an import binds in `texts`
    (torch, dist, F, math, check_close, launch, ...); `self` is a local like any other."""
    names = set(_KEEP_ALWAYS)
    for t in texts:
        names |= _imported_names(t)
    return names - {"self"}


def idiom_tokens(code: str, keep: set[str]) -> list[Tok]:
    """An idiom's tokens, read as if it stood inside a call's parentheses (so `op=...` is a
    keyword argument, as it is where the idiom occurs); a statement is read as it is."""
    try:
        ast.parse(f"_({code})", mode="eval")
        return _classify(_read_code(f"_({code})").code, keep)[2:-1]
    except SyntaxError:
        pass
    plain = _read_code(code)
    return _classify(plain.code, keep) if plain else prose_tokens(code, keep)


def mask_idioms(toks: list[Tok], idioms: list[list[Tok]]) -> list[Tok]:
    """Each occurrence of an accepted idiom (same keys, same pattern of locals) becomes one
    IDIOM token, which no window counts as specific."""
    for idiom in idioms:
        m, first = len(idiom), idiom[0].key
        if not m:
            continue
        want, out, i = _canon(idiom), [], 0
        while i < len(toks):
            if toks[i].key == first and _canon(toks[i:i + m]) == want:
                out.append(Tok(IDIOM, IDIOM, toks[i].line))
                i += m
            else:
                out.append(toks[i])
                i += 1
        toks = out
    return toks


# --- matching ----------------------------------------------------------------------------------

def specific(tok: Tok) -> bool:
    """Does this token say something (a kept name, a literal, an operator), unlike a
    placeholder, a keyword or punctuation?"""
    k = tok.key
    if k in (LOCAL, IDIOM) or keyword.iskeyword(k) or keyword.issoftkeyword(k):
        return False
    return k in _SPECIFIC_OPS or k[0].isalnum() or k[0] in "_'\"" or k[:2] in ("b'", 'b"')


def _canon(toks: list[Tok]) -> tuple:
    """A window's keys with its locals renamed in order of first use (·0, ·1, ...)."""
    names: dict[str, int] = {}
    return tuple(f"{LOCAL}{names.setdefault(t.name, len(names))}" if t.key == LOCAL else t.key
                 for t in toks)


def find_matches(regions: list[Region], streams: list[Stream], n: int = N_GRAM,
                 min_specific: int = MIN_SPECIFIC) -> list[Match]:
    """For each (region, visible file) pair that shares one, the longest common run of tokens:
    a run is made of windows of n tokens with the same keys and the same pattern of locals,
    each window with at least min_specific specific() tokens. `Match.places` counts the cells
    (or prose pieces) of the file that share a run with the region."""
    index: dict[tuple, list[tuple[int, int]]] = {}
    for ri, r in enumerate(regions):
        keys = [t.key for t in r.toks]
        spec = [specific(t) for t in r.toks]
        for j in range(len(keys) - n + 1):
            if sum(spec[j:j + n]) >= min_specific:
                index.setdefault(tuple(keys[j:j + n]), []).append((ri, j))
    best: dict[tuple[int, str], Match] = {}
    places: dict[tuple[int, str], set] = {}
    for si, s in enumerate(streams):
        keys = [t.key for t in s.toks]
        hits: dict[tuple[int, int], list[int]] = {}      # (region, diagonal j - i) -> [i]
        for i in range(len(keys) - n + 1):
            for ri, j in index.get(tuple(keys[i:i + n]), ()):
                if _canon(regions[ri].toks[j:j + n]) == _canon(s.toks[i:i + n]):
                    hits.setdefault((ri, j - i), []).append(i)
        for (ri, diag), starts in hits.items():
            places.setdefault((ri, s.path), set()).add(si)
            run_start = prev = starts[0]
            for i in starts[1:] + [None]:
                if i is not None and i == prev + 1:
                    prev = i
                    continue
                length = prev - run_start + n
                old = best.get((ri, s.path))
                if old is None or length > old.length:
                    r, j = regions[ri], run_start + diag
                    best[(ri, s.path)] = Match(r, s, length, r.toks[j].line,
                                               s.toks[run_start].line,
                                               " ".join(t.name for t in r.toks[j:j + length]))
                if i is not None:
                    run_start = prev = i
    for key, m in best.items():
        m.places = len(places[key])
    return sorted(best.values(), key=lambda m: (m.region.aid, m.region.cell, m.region.line,
                                                m.stream.path))


# --- the allowlist -----------------------------------------------------------------------------

@dataclass
class Allowed:
    """One allowlist line: a (region, file) pair whose match is explained by `reason`."""
    region: str                 # fnmatch pattern on Region.key
    path: str                   # fnmatch pattern on the visible file (relative path)
    reason: str
    line: int                   # in the allowlist file

    def covers(self, m: Match) -> bool:
        return fnmatch.fnmatchcase(m.region.key, self.region) and \
            fnmatch.fnmatchcase(m.stream.path, self.path)


@dataclass
class Allowlist:
    entries: list               # [Allowed]
    idioms: list                # [(code, reason, line)]: masked everywhere before matching


def read_allowlist(path: str = ALLOWLIST) -> Allowlist:
    """`region | visible file | reason` and `idiom | code | reason` lines; `#` comments."""
    entries, idioms = [], []
    with open(path, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = [p.strip() for p in line.split(" | ")]
            if len(parts) != 3 or not all(parts):
                raise ValueError(f"{path}:{ln}: expected 'region | visible file | reason' or "
                                 f"'idiom | code | reason' (separated by ' | '), got {line.strip()!r}")
            if parts[0] == "idiom":
                idioms.append((parts[1], parts[2], ln))
            else:
                entries.append(Allowed(*parts, ln))
    return Allowlist(entries, idioms)


def unexplained(matches: list[Match], allowed: Allowlist) -> list[Match]:
    return [m for m in matches if not any(a.covers(m) for a in allowed.entries)]


def unused(matches: list[Match], allowed: Allowlist) -> list[Allowed]:
    """Entries no match needs any more (a leak was fixed: the integrator removes them)."""
    return [a for a in allowed.entries if not any(a.covers(m) for m in matches)]


# --- the scan ----------------------------------------------------------------------------------

def scan_texts(solutions: list[tuple[str, dict]], texts: dict[str, str],
               allowed: Allowlist | None = None, n: int = N_GRAM,
               min_specific: int = MIN_SPECIFIC) -> tuple[list[Region], list[Match]]:
    """The regions of `solutions` and their matches in the visible `texts` ({path: text})."""
    sources = [_source(c) for _, nb in solutions for c in nb["cells"] if c.get("cell_type") == "code"]
    sources += [t for p, t in texts.items() if p.endswith(".py")]
    sources += [_source(c) for p, t in texts.items() if p.endswith(".ipynb")
                for c in json.loads(t).get("cells", []) if c.get("cell_type") == "code"]
    keep = keep_names(sources)
    regions = secret_regions(solutions, keep)
    streams = visible_streams(texts, keep)
    if allowed is not None and allowed.idioms:
        idioms = [idiom_tokens(code, keep) for code, _, _ in allowed.idioms]
        for x in regions + streams:
            x.toks = mask_idioms(x.toks, idioms)
    return regions, find_matches(regions, streams, n, min_specific)


def scan(root: str = ROOT, allowed: Allowlist | None = None, n: int = N_GRAM,
         min_specific: int = MIN_SPECIFIC) -> tuple[list[Region], list[Match]]:
    """The course at `root`: solutions/ against every learner-visible file."""
    return scan_texts(notebooks("solutions", root), read_texts(visible_files(root), root),
                      allowed, n, min_specific)


def table(regions: list[Region], matches: list[Match], allowed: Allowlist | None = None) -> str:
    """Per notebook: its solution and hidden-test regions, how many share a run with a visible
    file, how many of those the allowlist does not explain, and which files they are in."""
    rows = [("notebook", "solution", "matched", "hidden", "matched", "unexplained", "matched in")]
    total = [0] * 5
    for aid in sorted({r.aid for r in regions}):
        mine = [m for m in matches if m.region.aid == aid]
        hit = {id(m.region) for m in mine}
        bad = {id(m.region) for m in (unexplained(mine, allowed) if allowed else mine)}
        sol = [r for r in regions if r.aid == aid and r.kind == "solution"]
        hid = [r for r in regions if r.aid == aid and r.kind == "hidden"]
        counts = [len(sol), sum(id(r) in hit for r in sol), len(hid), sum(id(r) in hit for r in hid),
                  len(bad)]
        total = [a + b for a, b in zip(total, counts)]
        where = sorted({_short(m.stream.path) for m in mine})
        rows.append((aid, *map(str, counts), ", ".join(where) or "-"))
    rows.append(("total", *map(str, total), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def _short(path: str) -> str:
    return path.split("/")[1] if path.startswith("notebooks/") else path


def describe(m: Match) -> str:
    more = f" (+{m.places - 1} more in this file)" if m.places > 1 else ""
    return (f"{m.region.key} [cell {m.region.cell} line {m.secret_line}] -> {m.location}{more}: "
            f"{m.length} tokens: {m.snippet[:150]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also list the allowed matches")
    parser.add_argument("-n", type=int, default=N_GRAM, help=f"window length (default {N_GRAM})")
    parser.add_argument("--min-specific", type=int, default=MIN_SPECIFIC,
                        help=f"specific tokens a window needs (default {MIN_SPECIFIC})")
    parser.add_argument("--root", default=ROOT, help="the course checkout to scan")
    parser.add_argument("--sweep", action="store_true",
                        help="regions matched for several window lengths (how N_GRAM was chosen)")
    args = parser.parse_args(argv)
    allowed = read_allowlist()
    if args.sweep:
        for n in (8, 10, 11, 12, 13, 14, 16, 20, 25, 30):
            regions, ms = scan(args.root, allowed, n, args.min_specific)
            bad = unexplained(ms, allowed)
            print(f"n = {n:2d}: {len({id(m.region) for m in ms}):3d} of {len(regions)} regions share "
                  f"a run with {len(ms):3d} (region, file) pairs; {len(bad):3d} pairs unexplained")
        return 0
    regions, matches = scan(args.root, allowed, args.n, args.min_specific)
    print(f"{len(regions)} secret regions of {args.root}/solutions against every learner-visible "
          f"file; window {args.n} tokens, >= {args.min_specific} specific\n")
    print(table(regions, matches, allowed))
    bad = unexplained(matches, allowed)
    shown = matches if args.all else bad
    if shown:
        print(f"\n{'every match' if args.all else 'unexplained matches'} ({len(shown)} (region, file) pairs):")
        bad_ids = {id(m) for m in bad}
        for m in shown:
            print(("  " if id(m) in bad_ids else "  [allowed] ") + describe(m))
    stale = unused(matches, allowed)
    if stale:
        print("\nallowlist entries no match needs any more (remove them): "
              + ", ".join(f"line {a.line} ({a.region} | {a.path})" for a in stale))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
