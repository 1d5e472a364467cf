"""Layering rules of ARCHITECTURE.md / STYLE.md that a test can hold."""

from __future__ import annotations

import ast
from pathlib import Path

import ds4tui

PKG = Path(ds4tui.__file__).parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_engine_never_imports_the_ui():
    files = sorted((PKG / "engine").rglob("*.py"))
    assert len(files) >= 5
    for f in files:
        bad = {n for n in _imports(f) if n.split(".")[0] == "textual" or n.startswith(("ds4tui.widgets", "ds4tui.app"))}
        assert not bad, f"{f.relative_to(PKG)} imports UI modules: {sorted(bad)}"


def test_native_library_is_built_and_reports_its_version():
    from ds4tui._native import ffi, lib

    assert ffi.string(lib.ds4_version()).decode() == f"ds4tui-native {ds4tui.__version__} (cpu)"


def test_public_header_is_the_whole_cdef():
    import re

    text = (PKG / "native" / "ds4_engine.h").read_text()
    block = re.search(r"/\* CDEF BEGIN \*/(.*?)/\* CDEF END \*/", text, re.S).group(1)
    for fn in ("ds4_version", "ds4_type_row_bytes", "ds4_dequantize"):
        assert fn in block


def test_engine_exceptions_are_defined_once_in_the_errors_module():
    """Every exception class of the engine layer lives in ds4tui/engine/errors.py, no exception
    class name is defined twice in ds4tui, and no class shadows a builtin name (a class called
    ReferenceError hid Python's own)."""
    import builtins
    import importlib

    from ds4tui.engine import errors

    defined: dict[str, list[str]] = {}
    for f in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(str(f.relative_to(PKG).with_suffix("")))
    for name, files in defined.items():
        if len(files) > 1:
            for rel in files:
                cls = getattr(importlib.import_module("ds4tui." + rel.replace("/", ".")), name, None)
                assert not (isinstance(cls, type) and issubclass(cls, BaseException)), \
                    f"the exception class {name} is defined more than once: {files}"
    shadowing = sorted(n for n in defined if hasattr(builtins, n))
    assert not shadowing, f"classes named like Python builtins: {shadowing}"
    for f in sorted((PKG / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ClassDef) and f.name != "errors.py":
                cls = getattr(__import__(f"ds4tui.engine.{f.stem}", fromlist=["x"]), node.name, None)
                assert not (isinstance(cls, type) and issubclass(cls, BaseException)), \
                    f"{f.relative_to(PKG)} defines the exception {node.name}: move it to engine/errors.py"
    assert errors.NonFiniteError.__mro__.count(errors.EngineError) == 1


def test_the_engine_layer_reads_no_environment_variable():
    """Configuration comes in as arguments: the command line reads the variables
    (ds4tui/commands/environment.py) and passes what they set."""
    for f in sorted((PKG / "engine").rglob("*.py")):
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            assert name not in ("environ", "getenv", "environb", "putenv"), \
                f"{f.relative_to(PKG)}:{node.lineno} reads the environment ({name})"
