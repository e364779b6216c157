"""``python -m benchmarks.projection``: fit the constants, check them against the beds, print the table, and write
docs/projection.md and bench_results/projection/fit.json (``--check``: compare only, exit 1 on a difference)."""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.report.pages.sets import ROOT

from . import fit, page


def outputs() -> dict[str, str]:
    """``{path: text}`` of everything the command writes, from the raw files."""
    fitted = fit.fit_all()
    return {page.PAGE: page.render(fitted), page.FIT_JSON: page.dump(fitted)}


def main(argv=None, quiet: bool = False) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.projection", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when the page or the JSON differs")
    args = p.parse_args(argv)
    stale, texts = 0, outputs()
    for rel, text in texts.items():
        path = os.path.join(ROOT, rel)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old == text:
            print(f"{rel}: up to date")
            continue
        stale += 1
        if not args.check:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        print(f"{rel}: {'differs' if args.check else 'rewritten'}")
    if not quiet:
        print(texts[page.PAGE].split("## The table", 1)[0].split("## Where each method wins", 1)[1])
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
