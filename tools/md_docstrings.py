"""Rewrite Sphinx/RST markup in docstrings and comments as Markdown for mkdocstrings.

Usage::

    python tools/md_docstrings.py [--check] PATH [PATH ...]

PATH is a ``.py`` file or a directory (searched recursively for ``.py`` files). Only
docstrings (every statement that is a bare string literal: module, class, function and
attribute docstrings) and ``#`` comments are touched, never code or other strings:

* Python-domain roles become code spans: ``:func:`~a.b.c``` -> ```c``` (tilde: last
  component), ``:meth:`.x.y``` -> ```x.y``` (leading dots dropped), ``:class:`a.b``` ->
  ```a.b```; ``:role:`title <target>``` -> ```title```. A role whose target was wrapped
  over two lines is put back on one. A role right after a backtick (quoted, as here) is kept.
* ``.. math::`` directives (the text on the directive line and the indented body) become
  ``$$`` display-math blocks (pymdownx.arithmatex), one per blank-line-separated equation.

The rewrite is idempotent. With ``--check`` nothing is written and the exit status is 1
when some file would change. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

ROLES = r"(?:py:)?(?:class|func|meth|mod|data|attr|obj|exc|const|type)"
# A role whose target runs over a line break, with what is glued to its end (punctuation) and
# the single space after that: the break is re-made after the glued text.
WRAPPED_ROLE = re.compile(
    rf"(?P<pre>[ \t]*)(?<!`):{ROLES}:`(?P<target>[^`\n]*\n(?P<indent>[ \t]*)[^`\n]*)`"
    r"(?P<tail>[^\s:`]*)(?P<space> ?)"
)
ROLE = re.compile(rf"(?<!`):{ROLES}:`(?P<target>[^`]+)`")
TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)
MATH = re.compile(r"^(?P<indent>[ \t]*)\.\. math::(?P<rest>.*)$")
OPTION = re.compile(r"^\s*:[\w-]+:")  # directive options (:label:, :nowrap:): dropped


def _code(target: str) -> str:
    """Markdown code span for a role's target."""
    titled = TITLED.match(target)
    if titled and titled["title"]:
        return "`" + " ".join(titled["title"].split()) + "`"
    target = re.sub(r"\s*\n\s*", "", target).strip().lstrip("!")
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return "`" + target.lstrip(".") + "`"


def _wrapped(m: re.Match[str]) -> str:
    out = m["pre"] + _code(m["target"]) + m["tail"]
    return out + ("\n" + m["indent"] if m["space"] else "")


def convert_roles(text: str) -> str:
    return ROLE.sub(lambda m: _code(m["target"]), WRAPPED_ROLE.sub(_wrapped, text))


def _width(line: str) -> int:
    return len(line) - len(line.lstrip())


def convert_math(text: str) -> str:
    """``.. math::`` directives -> ``$$`` blocks at the directive's indentation."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = MATH.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent = m["indent"]
        body = [m["rest"].strip()] if m["rest"].strip() else []
        i += 1
        # The directive's body: the lines indented more than the directive, blank ones between.
        j = i
        while j < len(lines) and (not lines[j].strip() or _width(lines[j]) > len(indent)):
            j += 1
        while j > i and not lines[j - 1].strip():
            j -= 1
        block = [ln for ln in lines[i:j] if not OPTION.match(ln)]
        nonblank = [ln for ln in block if ln.strip()]
        cut = min((_width(ln) for ln in nonblank), default=0)
        body += [ln[cut:].rstrip() for ln in block]
        i = j
        # One $$ block per equation (blank-line separated, as in the RST directive).
        equations: list[list[str]] = [[]]
        for ln in body:
            if ln:
                equations[-1].append(ln)
            elif equations[-1]:
                equations.append([])
        equations = [eq for eq in equations if eq]
        for n, eq in enumerate(equations):
            if n:
                out.append("")
            out += [indent + "$$"] + [indent + ln for ln in eq] + [indent + "$$"]
        if i < len(lines) and lines[i].strip():
            out.append("")
    return "\n".join(out)


def convert_docstring(text: str) -> str:
    return convert_math(convert_roles(text))


def _docstring_spans(tree: ast.AST) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions of every statement that is a bare string literal."""
    spans = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            v = node.value
            spans.append(((v.lineno, v.col_offset), (v.end_lineno, v.end_col_offset)))
    return spans


def convert_source(source: str) -> str:
    """The source with its docstrings and comments converted; code is left as it is."""
    tree = ast.parse(source)
    spans = _docstring_spans(tree)
    # ast columns are UTF-8 byte offsets, tokenize's are characters: compare in bytes.
    lines = source.splitlines(keepends=True)

    def to_bytes(pos: tuple[int, int]) -> tuple[int, int]:
        row, col = pos
        return row, len(lines[row - 1][:col].encode()) if row <= len(lines) else col

    edits = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            new = convert_roles(tok.string)
        elif tok.type == tokenize.STRING and any(
            s <= to_bytes(tok.start) and to_bytes(tok.end) <= e for s, e in spans
        ):
            new = convert_docstring(tok.string)
        else:
            continue
        if new != tok.string:
            edits.append((tok.start, tok.end, new))

    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for (r0, c0), (r1, c1), new in reversed(edits):
        a, b = offsets[r0 - 1] + c0, offsets[r1 - 1] + c1
        source = source[:a] + new + source[b:]
    return source


def _files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        found += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("paths", nargs="+", help=".py files or directories")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on change")
    args = parser.parse_args(argv)
    changed = 0
    for path in _files(args.paths):
        old = path.read_text(encoding="utf-8")
        new = convert_source(old)
        if new != old:
            changed += 1
            print(("would rewrite " if args.check else "rewrote ") + str(path))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
