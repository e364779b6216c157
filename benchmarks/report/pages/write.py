"""Writes the generated tables into the pages of :data:`PAGES`, between their markers.

A page holds ``<!-- generated:NAME -->`` and, below it, ``<!-- /generated -->``; everything between them is
:data:`benchmarks.report.pages.tables.TABLES` ``[NAME]()``, and nothing else in the page is touched. Run
``python -m benchmarks report`` after a new measurement (or a change to a table's code); ``--check`` only
compares, as ``tests/test_docs.py`` does. It also rewrites docs/projection.md (``python -m benchmarks.projection``).
"""

from __future__ import annotations

import difflib
import os
import re

from .sets import ROOT
from .tables import TABLES

PAGES = ("README.md", "BENCHMARKS.md", "docs/benchmarks-more.md", "docs/long-runs.md", "docs/gpu.md",
         "docs/lowbit-and-streaming.md")
MARK = re.compile(r"^(<!-- generated:(?P<name>[\w:.@%-]+) -->\n)(?P<body>(?:(?!<!-- generated:).*\n)*?)"
                  r"(<!-- /generated -->)$", re.M)
"""A marked block: its opening line, the lines between (none, or any that open no other block), its closing line."""


def fill(text: str, where: str = "page") -> str:
    """``text`` with every marked block regenerated; an unknown table name is an error."""
    def one(m: re.Match) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise KeyError(f"{where}: no generated table {name!r} (known: {', '.join(sorted(TABLES))})")
        return m.group(1) + TABLES[name]() + "\n" + m.group(4)
    new, found = MARK.subn(one, text)
    if found != text.count("<!-- generated:"):
        raise ValueError(f"{where}: {text.count('<!-- generated:')} generated blocks open, {found} close as they should "
                         "(each opening line needs its own <!-- /generated --> line, no block inside another)")
    return new


def regenerate(root: str = ROOT) -> dict[str, tuple[str, str]]:
    """``{path: (as committed, as the raw files say)}`` for every page that has markers."""
    out = {}
    for page in PAGES:
        path = os.path.join(root, page)
        with open(path, encoding="utf-8") as f:
            now = f.read()
        if MARK.search(now):
            out[path] = (now, fill(now, page))
    return out


def main(check: bool = False) -> int:
    stale = 0
    for path, (now, new) in regenerate().items():
        rel = os.path.relpath(path, ROOT)
        if now == new:
            print(f"{rel}: up to date")
            continue
        stale += 1
        if check:
            print("".join(difflib.unified_diff(now.splitlines(True), new.splitlines(True), rel, rel + " (regenerated)")))
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            print(f"{rel}: tables rewritten from bench_results/")
    from benchmarks.projection.__main__ import main as projection  # docs/projection.md and its fit, alike

    stale += projection(["--check"] if check else [], quiet=True)
    return 1 if check and stale else 0
