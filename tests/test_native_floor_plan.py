"""The native engine's floor plan (docs/ARCHITECTURE.md): calls only point down, the public API file
holds only the API, and C reads no environment variable.

Each C source of the extension is compiled on its own and its object's symbols are read with
``nm``: a file's undefined symbols that another file defines are the calls it makes.  The order is
``build_native.CPU_SOURCES`` (also the list at the top of ``ds4tui/native/internal.h``): a file may
call only files after it, so a call circle cannot come back unnoticed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "ds4tui" / "native"
sys.path.insert(0, str(ROOT))
import build_native  # noqa: E402

sys.path.remove(str(ROOT))

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")) or not shutil.which("nm"),
                                reason="needs a C compiler and nm")


def _symbols(tmp_path: Path) -> dict[str, tuple[set[str], set[str]]]:
    """{source: (defined global symbols, undefined symbols)} for every extension source."""
    if not (NATIVE / "cpu" / "iq2xxs_tables.h").exists():
        build_native.write_iq2xxs_tables(NATIVE / "cpu" / "iq2xxs_tables.h")
    cc = shutil.which("cc") or shutil.which("gcc")
    out = {}
    for src in build_native.CPU_SOURCES:
        obj = tmp_path / (src.replace("/", "_") + ".o")
        subprocess.run([cc, "-c", "-O1", "-std=c11", "-D_GNU_SOURCE", "-o", str(obj), str(NATIVE / src)], check=True,
                       capture_output=True, text=True)
        defined, undefined = set(), set()
        for line in subprocess.run(["nm", str(obj)], check=True, capture_output=True, text=True).stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                undefined.add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRC":
                defined.add(parts[2])
        out[src] = (defined, undefined)
    return out


@pytest.fixture(scope="module")
def symbols(tmp_path_factory) -> dict[str, tuple[set[str], set[str]]]:
    return _symbols(tmp_path_factory.mktemp("floor_plan"))


def _calls(symbols) -> dict[tuple[str, str], set[str]]:
    owner = {}
    for src, (defined, _) in symbols.items():
        for name in defined:
            assert name not in owner, f"{name} is defined in both {owner[name]} and {src}"
            owner[name] = src
    edges: dict[tuple[str, str], set[str]] = {}
    for src, (_, undefined) in symbols.items():
        for name in undefined:
            if name in owner and owner[name] != src:
                edges.setdefault((src, owner[name]), set()).add(name)
    return edges


def test_calls_only_point_down(symbols):
    order = {src: i for i, src in enumerate(build_native.CPU_SOURCES)}
    edges = _calls(symbols)
    up = [f"{a} calls {b} ({', '.join(sorted(names))}), which is above it"
          for (a, b), names in sorted(edges.items()) if order[b] < order[a]]
    assert not up, "calls that point up in the floor plan:\n" + "\n".join(up)
    # the check has something to check: the API file calls down into the layers below it
    assert ("engine.c", "forward.c") in edges and ("dspark.c", "forward.c") in edges
    assert ("cpu/matmul.c", "types.c") in edges and ("types.c", "cpu/dot.c") in edges


def test_a_circle_is_caught(symbols):
    """The check itself: a file that calls up (as util.c calling engine.c would) is reported."""
    fake = dict(symbols)
    defined, undefined = fake["util.c"]
    fake["util.c"] = (defined, undefined | {"ds4_engine_open"})
    order = {src: i for i, src in enumerate(build_native.CPU_SOURCES)}
    up = [(a, b) for (a, b) in _calls(fake) if order[b] < order[a]]
    assert ("util.c", "engine.c") in up


def test_the_api_file_holds_only_the_api(symbols):
    cdef = build_native.extract_cdef((NATIVE / "ds4_engine.h").read_text())
    declared = set(re.findall(r"\b(ds4_\w+)\s*\(", cdef))
    defined, _ = symbols["engine.c"]
    extra = sorted(defined - declared)
    assert not extra, f"engine.c defines functions that are not the public API (ds4_engine.h): {extra}"
    assert "ds4_engine_open" in defined and "ds4_session_step" in defined


def test_c_reads_no_environment(symbols):
    readers = {"getenv", "secure_getenv", "__secure_getenv", "environ"}
    found = {src: sorted(undefined & readers) for src, (_, undefined) in symbols.items() if undefined & readers}
    assert not found, f"C code reads the environment (options come in through the API): {found}"
    hip = [p.name for p in (NATIVE / "hip").glob("*") if re.search(r"\bgetenv\s*\(", p.read_text())]
    assert not hip, f"GPU sources read the environment: {hip}"


def test_every_source_is_in_the_order():
    on_disk = sorted(str(p.relative_to(NATIVE)) for p in NATIVE.rglob("*.c"))
    assert sorted(build_native.CPU_SOURCES) == on_disk
    listed = re.findall(r"^ \*   (\S+\.c)", (NATIVE / "internal.h").read_text(), re.M)
    assert listed[: len(listed)] == [s for s in build_native.CPU_SOURCES if s in listed]
