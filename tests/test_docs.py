"""The docs say what the code and the raw files say: no typed number goes stale, no field goes undocumented,
no link dangles. Pure file reads (and the report's arithmetic over the committed results files).

README.md is a landing page and BENCHMARKS.md holds current results only (line limits); every table of
both is regenerated from ``bench_results/`` (:mod:`benchmarks.report.pages`) and docs/configuration.md
from the schema's docstrings (:mod:`ds_acco.config.reference`); every relative link and anchor in the
pages resolves, none leaves the repository; result folders are named by what they measure and indexed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import Field

from benchmarks import results_file
from benchmarks.report import repeats
from benchmarks.report.pages import sets, write
from benchmarks.sweep.configs import TORCHFT_CONFIGS
from ds_acco.config import reference
from ds_acco.config.blocks import _Block

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "bench_results" / "INDEX.md",
         *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def prose(path: Path) -> str:
    """A page without its fenced code blocks (a ``# comment`` there is no heading, a ``[x](y)`` no link)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose(path), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def test_readme_is_a_landing_page_that_answers_on_its_first_screen():
    """At most 250 lines; the headline (seconds to a loss) and the mode table are in its first 60 lines."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, len(lines)
    first = "\n".join(lines[:60])
    assert "<!-- generated:headline -->" in first and "<!-- generated:which_mode -->" in first
    assert "python3 -m pytest -q" in "\n".join(lines) and "python3 tests/build_deepspeed_ops.py" in "\n".join(lines)


def test_benchmarks_holds_current_results_only():
    assert len((REPO / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()) <= 300


def test_every_table_is_what_the_raw_files_say():
    """`python -m benchmarks report --check`: each generated block equals its recomputation from bench_results/."""
    pages = write.regenerate()
    assert {Path(p).name for p in pages} == {"README.md", "BENCHMARKS.md", "benchmarks-more.md", "long-runs.md",
                                                "gpu.md", "lowbit-and-streaming.md"}
    for path, (now, new) in pages.items():
        assert now == new, f"{path}: a table differs from bench_results/; run python -m benchmarks report"


def test_a_stale_number_is_caught_and_a_misplaced_marker_refused():
    """The check can fail: a changed figure inside a block is rewritten; an unknown table or an unclosed block
    is an error, not a silent skip."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    stale = text.replace("| 95.4 s |", "| 94.5 s |", 1)
    assert stale != text and write.fill(stale) == text
    with pytest.raises(KeyError, match="no generated table"):
        write.fill("<!-- generated:nonesuch -->\n<!-- /generated -->\n")
    with pytest.raises(ValueError, match="generated blocks open"):
        write.fill("<!-- generated:headline -->\n| x |\n")


def test_headline_roles_and_sets_resolve():
    """Every set's globs match sweep folders; every headline role names configs; an unmeasured peer says so."""
    index = json.loads((REPO / "bench_results" / "sets.json").read_text(encoding="utf-8"))
    for name in index["sets"]:
        assert sets.folders(name) and all(results_file.exists(f) for f in sets.folders(name))
    assert set(index["roles"]) >= {"fair_baseline", "tuned_sync", "ds_acco", "external_peer"}
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    if not index["roles"]["external_peer"]:
        assert "not measured yet" in readme
    else:  # every headline bed names the peer config that was fastest there
        rows = [r for r in readme.split("<!-- generated:headline -->", 1)[1].split("<!-- /generated -->")[0].splitlines()
                if r.startswith("| ") and "---" not in r][1:]
        assert rows and all("(torchft" in r.rsplit("|", 2)[1] for r in rows), rows


def test_configuration_reference_is_the_schema():
    """docs/configuration.md is what ``python -m ds_acco.config.reference`` writes from the docstrings."""
    assert (REPO / "docs" / "configuration.md").read_text(encoding="utf-8") == reference.render()


def test_every_field_of_the_block_is_documented():
    assert reference.missing_docs() == []
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    for name, model in reference.BLOCKS:
        section = page.split(f"## `{name}`\n", 1)[1].split("\n## ", 1)[0]
        for field in model.model_fields:
            assert f"| `{field}` |" in section, f"{name}.{field} missing from docs/configuration.md"


def test_a_field_without_a_docstring_is_found():
    class Probe(_Block):
        documented: int = Field(default=1, ge=0)
        """Says what it changes."""
        silent: bool = False

    assert reference.field_docs(Probe) == {"documented": "Says what it changes."}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # external: test_no_link_leaves_the_repository keeps those out of README and docs
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no {path}")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_a_dangling_link_or_anchor_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Modes: `auto.streaming`\n\n[here](#modes-autostreaming) [gone](#nope) [file](missing.md)\n"
                    "```\n# not a heading\n[not](a-link.md)\n```\n", encoding="utf-8")
    assert broken_links(page) == ["#nope: no heading #nope in page.md", "missing.md: no missing.md"]


def test_no_link_leaves_the_repository():
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        assert not re.search(r"https?://", page.read_text(encoding="utf-8")), page


def test_result_folders_are_named_by_what_they_measure_and_indexed():
    root = REPO / "bench_results"
    work_named = [str(p.relative_to(root)) for p in root.rglob("*") if re.search(r"issue|session", p.name, re.I)]
    assert work_named == []
    index = (root / "INDEX.md").read_text(encoding="utf-8")
    missing = [p.name for p in root.iterdir() if p.name != "INDEX.md" and p.name not in index
               and not (p.suffix == ".png" and "*.png" in index)]
    assert missing == []


def test_the_peer_target_compares_ds_accos_best_with_torchfts_best():
    """At 25 Mbit/s the target is ds_acco's fastest config (stock ZeRO-1 aside) over torchft's fastest, from the
    medians the tables show; it is not set on other links, and a sweep without torchft has none."""
    block = sets.summary("five_beds")[("real", "25mbit")]
    med = {r["config"]: r["median_s"] for r in block["rows"]}
    peer = min(med[c] for c in TORCHFT_CONFIGS if med.get(c))  # at half the batch too, where it ran
    mine = min(v for c, v in med.items() if v and not c.startswith("torchft"))
    found = [t for t in repeats._targets("real", "25mbit", med) if "torchft" in t["target"]]
    assert len(found) == 1 and found[0]["value"] == round(mine / peer, 4) and found[0]["threshold"] == 0.9
    assert not [t for t in repeats._targets("real", "100mbit", med) if "torchft" in t["target"]]
    assert not [t for t in repeats._targets("real", "25mbit", {"sync": 1.0, "sync_lowbit": 0.5})
                if "torchft" in t["target"]]
