"""The README's figures, and those of the guides its reference moved to, are the ones the
documents they cite hold today.

The rule, which this test applies to ``README.md`` and the guides of ``PAGES`` as committed:

1. **Blocks.** The README is split into blocks at blank lines. Code (fenced blocks and blocks
   indented by four spaces) and headings are skipped. A table block inherits the citations of
   the block just before it (the paragraph that introduces it).
2. **Citations.** A block cites a document when it names a path under ``docs/`` (in backticks or
   as a link target): a ``.md`` file is that file, a folder (``docs/records/benchmarks/decode/``) is
   every ``.md`` file under it. Images and other files are not documents. A block citing no
   document is not checked (its figures are the README's own: counts, defaults, examples).
3. **Figures.** In a block that cites, a figure is a number written with a unit or as a ratio:
   followed by ``µs``/``us``, ``ms``, ``s``, ``x``, ``%``, ``TFLOP/s``, ``GB/s``, ``MHz``,
   ``KB``/``MiB`` or ``rows/s`` (``0.81x``, ``63 µs``, ``31%``), or any number with a decimal
   point (``regret 1.004``). Both ends of a range share its unit (``1.16-1.47x``, ``78-82%``).
   Integers without a unit (``18 shapes``, ``S_q = 64``) and numbers inside words (``sm_90``,
   ``H100``, ``64x128``, a commit such as ``523527e``) are not figures.
4. **Match.** A figure passes when one of the cited documents holds a number that, rounded to
   the figure's decimals, equals it: the README may round a document's ``111.7`` to ``112`` or
   its ``10.90`` to ``10.9``, never change it. Units are not compared (tables carry theirs in a
   header), and ``µs``/``us``, ``x``/``×`` and ``%`` spellings are all one. A table row copies
   a row: its figures must all be held by one line of a cited document.

What it cannot see: a figure that is stale but still quoted elsewhere in the same document (an
earlier run's regret that the document keeps for comparison) passes; the check is presence,
not meaning.

A figure that is not in the cited documents fails with its block and the documents: correct
the README to the document, or cite the document instead of copying its number.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_NUMBER = r"\d+(?:\.\d+)?"
_UNIT = r"(?:µs|us|ms|s|x|×|%|TFLOP/s|GB/s|MHz|KB|MiB|rows/s)"
#: a number, or a range ``a-b`` / ``a–b``, then an optional unit; not inside a word or number
_FIGURE = re.compile(rf"(?<![\w.\-/])({_NUMBER}(?:\s*[-–]\s*{_NUMBER})?)(\s*{_UNIT})?(?![\w.]*\d)"
                     rf"(?![A-Za-z_])")
_DOC_CITATION = re.compile(r"(?<![\w/])(docs/[\w./-]*)")
_DOC_NUMBER = re.compile(rf"(?<![\w.]){_NUMBER}")


def blocks(text: str) -> list[str]:
    """The README's prose and table blocks (rule 1), code and headings left out."""
    text = re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.M | re.S)
    found = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines or all(line.startswith("    ") for line in lines):
            continue
        if lines[0].startswith("#"):
            continue
        found.append("\n".join(lines))
    return found


def cited_documents(block: str, root: Path = ROOT) -> list[Path]:
    """The documents a block cites (rule 2)."""
    docs: list[Path] = []
    for ref in _DOC_CITATION.findall(block):
        ref = ref.rstrip(".,;:)")
        path = root / ref
        if path.is_dir():
            docs += sorted(path.rglob("*.md"))
        elif path.suffix == ".md" and path.is_file():
            docs.append(path)
        elif path.suffix == ".md":
            raise AssertionError(f"README cites {ref}, which does not exist")
    return docs


def figures(block: str) -> list[str]:
    """The figures of a block (rule 3), as written (``"1.47"``, ``"63"``)."""
    prose = re.sub(r"`[^`]*`", " ", block)  # commands, paths and code in backticks
    found = []
    for match in _FIGURE.finditer(prose):
        numbers, unit = re.split(r"\s*[-–]\s*", match.group(1)), match.group(2)
        if unit or any("." in n for n in numbers):
            found += numbers
    return found


def held(figure: str, numbers: set[str]) -> bool:
    """Whether a document number rounds to ``figure`` at its decimals (rule 4)."""
    places = len(figure.partition(".")[2])
    quantum = Decimal(1).scaleb(-places)
    want = Decimal(figure)
    return any(len(n.partition(".")[2]) >= places
               and Decimal(n).quantize(quantum, rounding=ROUND_HALF_UP) == want
               for n in numbers)


def stale_figures(readme: str, root: Path = ROOT) -> list[str]:
    """One line per figure of ``readme`` that its cited documents do not hold."""
    problems = []
    previous: list[Path] = []
    for block in blocks(readme):
        is_table = block.lstrip().startswith("|")
        docs = cited_documents(block, root) or (previous if is_table else [])
        previous = docs
        if not docs:
            continue
        numbers = set()
        for doc in docs:
            numbers |= set(_DOC_NUMBER.findall(doc.read_text(encoding="utf-8")))
        names = ", ".join(str(d.relative_to(root)) for d in docs)
        if is_table:
            lines = [set(_DOC_NUMBER.findall(line)) for doc in docs
                     for line in doc.read_text(encoding="utf-8").splitlines()]
            for row in block.splitlines()[2:]:  # after the header and the |---| line
                found = figures(row)
                if found and not any(all(held(f, line) for f in found) for line in lines):
                    problems.append(f"table row {row.strip()!r}: no line of {names} holds "
                                    f"{', '.join(found)}")
            continue
        for figure in figures(block):
            if not held(figure, numbers):
                problems.append(f"{figure} (in {block[:70]!r}...) is not in {names}")
    return problems


#: the README and the guides its reference material moved to (issue 46): the pages whose figures
#: are copied from the records they cite
PAGES = ("README.md", "docs/usage.md", "docs/results.md", "docs/cli.md", "docs/lookup.md")
TEXT = {page: (ROOT / page).read_text(encoding="utf-8") for page in PAGES}


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_is_in_the_documents_it_cites(page):
    assert stale_figures(TEXT[page]) == []


def test_the_pages_have_figures_to_check():
    """The rule must see the cited figures, not vacuously pass."""
    checked = {page: [f for b in blocks(text) if cited_documents(b) for f in figures(b)]
               for page, text in TEXT.items()}
    assert len(checked["README.md"]) >= 20
    assert sum(map(len, checked.values())) >= 80
    assert {"10.9", "15.1", "1.007", "1.013", "1.003", "3.5"} <= set(checked["README.md"])
    assert {"0.94", "92.26", "43.57"} <= set(checked["docs/usage.md"])


@pytest.mark.parametrize("page, stale, fresh, figure", [
    ("README.md", "10.9 µs of host time", "19.7 µs of host time", "19.7"),  # issue 30's overhead
    ("docs/usage.md", "43.57 µs with", "42 µs with", "42"),                  # its decode step
    ("docs/cli.md", "1.16-1.47x faster than one worker", "1.16-1.57x faster than one worker",
     "1.57"),  # one end of a range
    ("README.md", "| 128 | causal | 0.99 | 1.85 | 1.00 |", "| 128 | causal | 1.04 | 1.85 | 1.00 |",
     "1.04"),  # a table cell: 1.04 is in the summary, not in the row the README copies
], ids=["overhead", "decode-step", "range-end", "table-cell"])
def test_a_planted_stale_figure_fails(page, stale, fresh, figure):
    assert stale in TEXT[page], f"the planted check needs {stale!r} in {page}"
    [problem] = stale_figures(TEXT[page].replace(stale, fresh, 1))
    assert figure in problem


def test_figures_and_rounding_follow_the_rule():
    assert figures("took 108 µs, 1.16-1.47x, 31% to 92%, regret 1.004, 18 shapes, sm_90, "
                   "64x128 tiles, commit 523527e, S_q = 64, H100, 10.90us") == \
        ["108", "1.16", "1.47", "31", "92", "1.004", "10.90"]
    assert figures("`tiledtune bench --interleave 30` at 0.81x") == ["0.81"]
    assert held("112", {"111.7"}) and held("10.9", {"10.90"}) and held("63", {"63.2"})
    assert not held("112", {"113.2"}) and not held("1.005", {"1.004"})
    assert not held("10.90", {"10.9"})  # a README figure more precise than its source


def test_a_table_inherits_the_citation_of_the_paragraph_before_it(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "bench.md").write_text("| a | 1.57 |\n")
    readme = "Results: `docs/bench.md`.\n\n| D | ratio |\n|---|---|\n| 64 | 1.57 |\n"
    assert stale_figures(readme, tmp_path) == []
    assert len(stale_figures(readme.replace("| 64 | 1.57 |", "| 64 | 1.58 |"), tmp_path)) == 1
    # an uncited paragraph's figures are the README's own
    assert stale_figures("About 3.5x faster.\n", tmp_path) == []
