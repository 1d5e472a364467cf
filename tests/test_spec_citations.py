"""Every spec citation in the repository points at a section that exists in docs/spec/.

The code and documents cite the specification as ``spec ds4.md §2.9.4``, ``dspark.md §7.3``,
``(spec platform.md §0.3, §4)``, ``§2–§3``, ``§2.3-§2.4``, ``§1.2, Appendix B`` and so on.  The
rules this test applies:

* A spec file is named by ``ds4.md``, ``dspark.md``, ``platform.md`` or ``ux.md``, optionally
  behind a path ending in ``spec/`` (``docs/spec/ds4.md``).
* Section references that follow a name, joined only by separators (spaces, ``,`` ``/`` ``;``
  ``–`` ``-`` ``—`` ``and`` ``or`` ``to`` ``(``), belong to that name: ``ds4.md §3.2, §4``.
  A range ``§2.1–2.3`` or ``§2–§3`` (no spaces around the dash) checks both ends.
  ``Appendix X`` in such a chain must be an appendix heading.
* A bare ``§N`` elsewhere belongs to the spec file named last before it in the same file; inside
  ``docs/spec/X.md`` a bare ``§N`` always means X.md itself.  A bare ``§`` right after the word
  "paper" cites the DSpark paper and is not checked.  A bare ``§`` in a file that names no spec
  file before it is an error (the reader cannot tell which spec is meant).
* A section ``N[.N…]`` exists when docs/spec/X.md has a heading ``#… N[.N…] Title``.

Headings of the spec files follow one convention (checked below): ``# Title`` once, then
``## N Title``, ``### N.M Title``, ``#### N.M.K Title`` (one more ``#`` per number, no dot
after the number), ``## Appendix X — Title``, and a final ``## Changes from the first edition``.
"""

from __future__ import annotations

import bisect
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT / "docs" / "spec"
SPEC_NAMES = ("ds4", "dspark", "platform", "ux")
THIS_FILE = Path(__file__).resolve()

#: Citations in files owned elsewhere that the spec cannot resolve, as (path, line, citation text);
#: they are matched by path and text, the line is for the reader.  The owner of those files fixes
#: them, and each entry must disappear from here in the same change that fixes the citation (a
#: stale entry fails the test), so the list is empty once they are all fixed.
UNRESOLVED_CITATIONS_OWNED_ELSEWHERE: tuple[tuple[str, int, str], ...] = ()

#: Files larger than this are data, not text with citations.
MAX_BYTES = 2_000_000

_NUM = r"\d+(?:\.\d+)*"
_NAME = re.compile(r"(?<![\w.\-/])(?:[\w.\-/]*spec/)?(" + "|".join(SPEC_NAMES) + r")\.md\b")
_REF = re.compile(r"§\s?(" + _NUM + r")(?:[–-]§?(" + _NUM + r"))?")
_APPENDIX = re.compile(r"Appendix\s+([A-Z])\b")
_SEP = re.compile(r"[\s,/;()–—\-]*(?:(?:and|or|to)\b[\s,/;()–—\-]*)?")
_EXTERNAL = re.compile(r"\bpaper\s*$", re.I)

_HEADING_NUM = re.compile(r"^(#{2,6}) (" + _NUM + r") \S")
_HEADING_APPENDIX = re.compile(r"^## Appendix ([A-Z]) — \S")
_HEADING_CHANGES = "## Changes from the first edition"


@dataclass(frozen=True)
class Citation:
    path: str
    line: int
    text: str       # what the source says, e.g. "§2.1–2.3" or "Appendix B"
    spec: str | None  # "ds4", ...; None: no spec file named before a bare §
    target: str     # the section number or "Appendix X" that must exist


def tracked_text_files() -> list[Path]:
    """The repository's tracked files that are text (UTF-8, no NUL) and not large data."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        paths = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        skip = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache"}
        paths = [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    paths += [SPEC_DIR / f"{name}.md" for name in SPEC_NAMES]  # checked even before they are committed
    files = []
    for p in sorted(set(paths)):
        if p.resolve() == THIS_FILE or not p.is_file() or p.stat().st_size > MAX_BYTES:
            continue
        data = p.read_bytes()
        if b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        files.append(p)
    return files


def citations(path: Path, text: str) -> list[Citation]:
    """Every spec citation in ``text`` (the contents of ``path``), in order."""
    rel = path.relative_to(ROOT).as_posix()
    own = path.stem if path.parent.resolve() == SPEC_DIR.resolve() and path.stem in SPEC_NAMES else None
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_of(pos: int) -> int:
        return bisect.bisect_right(line_starts, pos)

    tokens = sorted([(m.start(), m.end(), "name", m) for m in _NAME.finditer(text)]
                    + [(m.start(), m.end(), "ref", m) for m in _REF.finditer(text)]
                    + [(m.start(), m.end(), "appendix", m) for m in _APPENDIX.finditer(text)],
                    key=lambda t: t[0])
    out: list[Citation] = []
    last_named: str | None = None  # the spec file named last (bare § in code files)
    chain: str | None = None       # the spec file of the chain that ended at chain_end
    chain_end = -1
    for start, end, kind, m in tokens:
        joined = chain is not None and _SEP.fullmatch(text[chain_end:start]) is not None
        if kind == "name":
            last_named = chain = m.group(1)
            chain_end = end
            continue
        if kind == "appendix":
            if joined:
                out.append(Citation(rel, line_of(start), m.group(0), chain, f"Appendix {m.group(1)}"))
                chain_end = end
            continue
        if joined:
            spec = chain
        elif _EXTERNAL.search(text[max(0, start - 40):start]):
            chain = None
            continue
        else:
            spec = own or last_named
            chain = spec
        chain_end = end
        for target in filter(None, (m.group(1), m.group(2))):
            out.append(Citation(rel, line_of(start), m.group(0), spec, target))
    return out


def spec_sections(name: str) -> set[str]:
    """Section numbers and ``Appendix X`` labels that docs/spec/<name>.md has as headings."""
    found: set[str] = set()
    for line in (SPEC_DIR / f"{name}.md").read_text(encoding="utf-8").splitlines():
        if m := _HEADING_NUM.match(line):
            found.add(m.group(2))
        elif m := _HEADING_APPENDIX.match(line):
            found.add(f"Appendix {m.group(1)}")
    return found


def all_citations() -> list[Citation]:
    cites: list[Citation] = []
    for p in tracked_text_files():
        text = p.read_text(encoding="utf-8")
        if "§" in text or "Appendix" in text:
            cites += citations(p, text)
    return cites


def test_spec_files_exist():
    for name in SPEC_NAMES:
        assert (SPEC_DIR / f"{name}.md").is_file(), f"docs/spec/{name}.md is missing"


def test_every_spec_citation_resolves():
    sections = {name: spec_sections(name) for name in SPEC_NAMES}
    allowed = {(p, t) for p, _, t in UNRESOLVED_CITATIONS_OWNED_ELSEWHERE}
    cites = all_citations()
    assert len(cites) > 150, f"only {len(cites)} citations found: is the scanner broken?"
    missing = []
    for c in cites:
        if (c.path, c.text) in allowed:
            continue
        if c.spec is None:
            missing.append(f"{c.path}:{c.line}: {c.text!r} names no spec file (write e.g. 'spec ds4.md {c.text}')")
        elif c.target not in sections[c.spec]:
            missing.append(f"{c.path}:{c.line}: {c.text!r} cites docs/spec/{c.spec}.md, which has no section "
                           f"{c.target}")
    assert not missing, "spec citations that do not resolve:\n" + "\n".join(missing)


def test_allow_list_has_no_stale_entries():
    sections = {name: spec_sections(name) for name in SPEC_NAMES}
    cites = all_citations()
    unresolved = {(c.path, c.text) for c in cites if c.spec is None or c.target not in sections[c.spec]}
    stale = [e for e in UNRESOLVED_CITATIONS_OWNED_ELSEWHERE if (e[0], e[2]) not in unresolved]
    assert not stale, ("these allow-listed citations are gone or resolve now; remove them from "
                       f"UNRESOLVED_CITATIONS_OWNED_ELSEWHERE: {stale}")


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_spec_headings_follow_the_convention(name):
    lines = (SPEC_DIR / f"{name}.md").read_text(encoding="utf-8").splitlines()
    problems = []
    in_code = False
    titles = 0
    previous: tuple[int, ...] = ()
    seen: set[str] = set()
    changes_at = None
    for i, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code or not re.match(r"#{1,6} ", line):
            continue  # not an ATX heading ("#25173" at the start of a line is text)
        if line.startswith("# "):
            titles += 1
            if i != 1:
                problems.append(f"{i}: the '# ' title must be the first line")
            continue
        if changes_at is not None:
            problems.append(f"{i}: heading after '{_HEADING_CHANGES}': {line!r}")
        if m := _HEADING_NUM.match(line):
            num = m.group(2)
            parts = tuple(int(x) for x in num.split("."))
            if len(m.group(1)) != len(parts) + 1:
                problems.append(f"{i}: section {num} needs {'#' * (len(parts) + 1)}: {line!r}")
            if num in seen:
                problems.append(f"{i}: section {num} appears twice")
            if previous and parts <= previous:
                problems.append(f"{i}: section {num} comes after {'.'.join(map(str, previous))}")
            seen.add(num)
            previous = parts
        elif _HEADING_APPENDIX.match(line):
            previous = (10**6,)  # appendices follow the numbered sections
        elif line == _HEADING_CHANGES:
            changes_at = i
        else:
            problems.append(f"{i}: heading is not '## N Title', '### N.M Title', ..., "
                            f"'## Appendix X — Title' or '{_HEADING_CHANGES}': {line!r}")
    if titles != 1:
        problems.append(f"{titles} '# ' titles (want exactly one)")
    if changes_at is None:
        problems.append(f"no final '{_HEADING_CHANGES}' section")
    assert not problems, f"docs/spec/{name}.md:\n" + "\n".join(problems)


def test_no_file_points_at_the_old_spec_folder():
    bad = [p.relative_to(ROOT).as_posix() for p in tracked_text_files()
           if "shared/spec" in p.read_text(encoding="utf-8")]
    assert not bad, f"these files still point at ../shared/spec instead of docs/spec: {bad}"


def test_scanner_reads_the_forms_in_use():
    """The citation forms the repository uses, read the way the docstring says."""
    here = SPEC_DIR / "ds4.md"
    text = ("x (spec platform.md §0.3, §4) and dspark.md §2–§3, §2.3-§2.4; §1/§3.2 then §2.1–2.3\n"
            "the DSpark paper §3.3 and ds4.md §6 tests 1–3; platform.md §1.2, Appendix B\n")
    got = [(c.spec, c.target) for c in citations(ROOT / "README.md", text)]
    assert got == [("platform", "0.3"), ("platform", "4"), ("dspark", "2"), ("dspark", "3"),
                   ("dspark", "2.3"), ("dspark", "2.4"), ("dspark", "1"), ("dspark", "3.2"),
                   ("dspark", "2.1"), ("dspark", "2.3"), ("ds4", "6"), ("platform", "1.2"),
                   ("platform", "Appendix B")]
    # inside a spec file a bare § is that file, even after another file was named
    got = [(c.spec, c.target) for c in citations(here, "see dspark.md §2.5.  Later §3.2.\n")]
    assert got == [("dspark", "2.5"), ("ds4", "3.2")]
    # a bare § with no spec file named before it
    assert [c.spec for c in citations(ROOT / "README.md", "the chat template (spec §4.3)")] == [None]
