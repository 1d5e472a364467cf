"""The bundled demo pair: a small DeepSeek V4 model trained on permissively licensed Python source and its DSpark drafter.

The package ships the two GGUFs xz-compressed (``model.gguf.xz``, ``support.gguf.xz``) with
``demo.json`` (sizes and sha256 of the uncompressed files, how they were made, what they measure),
``train_log.json`` (the full log of the training runs that made them) and ``corpus_sources.json`` (every
source of the training text with its licence).  On first use
:func:`demo_pair` unpacks them into the user cache — ``$DS4TUI_DEMO_DIR`` if set, else
``$XDG_CACHE_HOME/ds4tui/demo`` (default ``~/.cache/ds4tui/demo``; a relative XDG_CACHE_HOME is
ignored, as for every ds4tui cache: ``ds4tui.commands.environment.xdg_cache_home``) — in a folder named after the
model's sha256, checking every byte against ``demo.json``.  A ``.verified`` note beside each file
records the size, mtime and sha256 that were checked; a later start hashes the file again only
when its size or mtime changed (and unpacks it again when the hash no longer matches, saying which
file and why: :attr:`DemoPair.repaired`) — damage that keeps both goes unnoticed, as with any
size-and-mtime check.  Unpacking
writes to a temporary file in the same folder and renames it into place, so an interrupted first
run leaves nothing half-written behind; temporary files that a killed run left are removed after
an hour.  To start afresh, delete the folder.

How the pair was made (``tools/demo_corpus.py``, ``tools/train_demo.py``) and what it measures is in
``demo.json`` and in the README.
"""

from __future__ import annotations

import errno
import hashlib
import json
import lzma
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

PACKAGE_DIR = Path(__file__).resolve().parent
"""Where the compressed pair and ``demo.json`` live (package data)."""

CHUNK = 1 << 20
PROGRESS_EVERY = 8 << 20
"""Bytes between two progress calls while unpacking."""
STALE_PART_S = 3600
"""Temporary files of an unpacking older than this are left-overs of a killed run and are removed."""


class DemoError(RuntimeError):
    """The demo pair cannot be unpacked (the message names the file or folder and what is wrong)."""


@dataclass(frozen=True)
class DemoPair:
    """Paths of the unpacked demo model and support model; ``repaired``: one line per file that was
    there but damaged or gone and was unpacked again by this call, naming it and why (what the
    commands say on stderr and the chat app in its welcome line; () on a first unpack and when
    both files checked out)."""

    model: Path
    support: Path
    repaired: tuple[str, ...] = field(default=(), compare=False)


def manifest() -> dict | None:
    """``demo.json`` of this build, or None when the build ships no demo."""
    path = PACKAGE_DIR / "demo.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def cache_dir() -> Path:
    """Root folder the pair is unpacked into (see the module docstring); :class:`DemoError` naming
    DS4TUI_DEMO_DIR when it is a relative path."""
    from ds4tui.commands.environment import DEMO_DIR_ACCEPTED, BadVariable, cache_root  # the one rule of the cache

    value = os.environ.get("DS4TUI_DEMO_DIR")
    if value:
        if not os.path.isabs(value):  # DemoError: the commands that read the variables refuse it earlier (status 2)
            raise DemoError(str(BadVariable("DS4TUI_DEMO_DIR", value, DEMO_DIR_ACCEPTED)))
        return Path(value)
    return cache_root() / "demo"


def pair_folder(m: dict) -> Path:
    """Folder the pair of manifest ``m`` is (or will be) unpacked in: named after the model's sha256."""
    return cache_dir() / m["files"]["model.gguf"]["sha256"][:16]


def other_versions(current: Path) -> list[dict]:
    """Folders beside ``current`` that hold another demo pair (an earlier or later ds4tui's: a
    16-hex-digit name with a ``model.gguf``), with their bytes: nothing removes them, so ``doctor``
    names them for the user to delete."""
    out = []
    try:
        siblings = sorted(current.parent.iterdir())
    except OSError:
        return out
    for d in siblings:
        if d == current or len(d.name) != 16 or any(c not in "0123456789abcdef" for c in d.name):
            continue
        if (d / "model.gguf").is_file():
            size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
            out.append({"folder": str(d), "bytes": size})
    return out


def status() -> dict:
    """What ``ds4tui doctor`` reports: bundled or not, the unpack folder, whether both files are there,
    the folders of other demo versions in the same cache (``other_versions``), and ``problem``: why
    the files still to unpack cannot be (:func:`folder_problem`; None when they can, or none is left)."""
    m = manifest()
    if m is None:
        return {"bundled": False}
    try:
        folder = pair_folder(m)
    except DemoError as exc:  # no folder at all (a relative DS4TUI_DEMO_DIR)
        return {"bundled": True, "folder": None, "bytes": sum(f["bytes"] for f in m["files"].values()),
                "unpacked": False, "other_versions": [], "problem": str(exc)}
    left = sum(f["bytes"] for name, f in m["files"].items() if not _has_size(folder / name, f["bytes"]))
    return {"bundled": True, "folder": str(folder), "bytes": sum(f["bytes"] for f in m["files"].values()),
            "unpacked": all((folder / name).is_file() for name in m["files"]),
            "other_versions": other_versions(folder), "problem": folder_problem(folder, left) if left else None}


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.is_file() and path.stat().st_size == size
    except OSError:
        return False


def _placed_by() -> tuple[str, str] | None:
    """The variable that put the unpack folder where it is, with its value: DS4TUI_DEMO_DIR when it
    is set, else XDG_CACHE_HOME when it is set and in force (an absolute path); None for the default."""
    from ds4tui.commands.environment import xdg_cache_home

    if os.environ.get("DS4TUI_DEMO_DIR"):
        return "DS4TUI_DEMO_DIR", os.environ["DS4TUI_DEMO_DIR"]
    if os.environ.get("XDG_CACHE_HOME") and xdg_cache_home()[1] is None:
        return "XDG_CACHE_HOME", os.environ["XDG_CACHE_HOME"]
    return None


def _unusable(folder: Path) -> tuple[str, str] | None:
    """Why nothing can be written into ``folder``, as (what was found, what to do), or None when it
    can as far as the file system's permissions say.  A file in the way that a variable's own path
    is (or lies under) is named with the variable, its value and how to fix that variable."""
    base = _existing(folder)
    if base.is_dir():
        from ds4tui.engine.fs import fix_for, found_in, unwritable

        code = unwritable(base)
        if code is None:
            return None
        return found_in(base, code), f"{fix_for(base, code)}, or set DS4TUI_DEMO_DIR to a writable folder"
    placed = _placed_by()
    if placed is not None:
        var, value = placed
        path = Path(value)
        if path == base or base in path.parents:
            where = "names a file, not a folder" if path == base else f"lies under a file, {base}"
            found = f"{var}={value}, which {where}"
            if var == "XDG_CACHE_HOME":  # every ds4tui cache is under it: that variable is what to fix
                return found, (f"set XDG_CACHE_HOME to a folder (or unset it: the caches then go under "
                               f"{Path.home() / '.cache'}), or set DS4TUI_DEMO_DIR to a writable folder for the demo alone")
            from ds4tui.commands.environment import cache_root

            return found, f"set DS4TUI_DEMO_DIR to a writable folder, or unset it (the demo then goes under " \
                          f"{cache_root() / 'demo'})"
    found = "a file" if base == folder else f"a file at {base}, where a folder above it should be"
    return found, f"move {base} away, or set DS4TUI_DEMO_DIR to a writable folder"


def folder_problem(folder: Path, need: int) -> str | None:
    """Why ``need`` bytes of the demo pair cannot be unpacked into ``folder`` (None when they can):
    a file in the way (named with the variable that put the folder there), no permission to write,
    or too little free space on its disk.  What doctor warns about before a first start fails on it."""
    bad = _unusable(folder)
    if bad:
        found, fix = bad
        return (f"the demo unpack folder {folder} cannot be used: expected a writable folder, found {found}; {fix} "
                f"(the demo pair needs {_mib(need, True)} there)")
    short = space_problem(folder, need)
    return f"the demo unpack folder {folder} cannot hold the demo pair: {short}" if short else None


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def _verified(dest: Path, size: int, sha256: str) -> str | None:
    """None when ``dest`` holds the expected bytes (its ``.verified`` note matches, or hashing says
    so); else why not, as a phrase after the file's name ("had 5 bytes where demo.json expects 9"),
    or "" when there is nothing to repair (no file and no note: a first unpack)."""
    note = dest.with_name(dest.name + ".verified")
    try:
        found = dest.stat().st_size
    except FileNotFoundError:
        return "was missing (deleted after it was unpacked)" if note.exists() else ""
    except OSError as exc:
        return f"could not be read ({exc.strerror or exc})"
    try:
        noted = note.read_bytes().split(b"\n")[0]
    except OSError:
        noted = b""
    stamp = _stamp(dest)
    if found == size and noted == f"{stamp} {sha256}".encode():
        return None
    earlier = noted.decode("ascii", "replace").split(" ")
    if len(earlier) == 3 and " ".join(earlier[:2]) == stamp and earlier[2] != sha256:
        # untouched since it was checked as other bytes: the file of a ds4tui that shipped another demo file
        return (f"was another ds4tui version's (sha256 {earlier[2][:16]}…, checked when it was unpacked; this "
                f"version's demo.json expects {sha256[:16]}…)")
    if found != size:
        return f"had {found} bytes where demo.json expects {size}"
    try:
        got = file_sha256(dest)
    except OSError as exc:
        return f"could not be read ({exc.strerror or exc})"
    if got != sha256:
        return f"had sha256 {got[:16]}… where demo.json expects {sha256[:16]}… (the same size, other bytes)"
    _write_note(dest, sha256)
    return None


def _write_note(dest: Path, sha256: str) -> None:
    try:
        dest.with_name(dest.name + ".verified").write_text(f"{_stamp(dest)} {sha256}\n")
    except OSError:
        pass  # a read-only cache that already holds the files: they are hashed at each start instead


def _remove_stale_parts(dest: Path) -> None:
    now = time.time()
    for part in dest.parent.glob(dest.name + ".*.part"):
        try:
            if now - part.stat().st_mtime > STALE_PART_S:
                part.unlink()
        except OSError:
            pass


def _unpack(src: Path, dest: Path, size: int, sha256: str,
            progress: Callable[[str, int | None, int], None] | None) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_parts(dest)
    fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    digest, done, reported = hashlib.sha256(), 0, 0
    try:
        with os.fdopen(fd, "wb") as out, lzma.open(src) as inp:
            os.fchmod(out.fileno(), 0o644)  # readable by others, like any unpacked archive (mkstemp: 0600)
            while chunk := inp.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress and (done - reported >= PROGRESS_EVERY or done == size):
                    progress(dest.name, done, size)
                    reported = done
        if done != size or digest.hexdigest() != sha256:
            raise DemoError(f"{src}: unpacks to {done} bytes with sha256 {digest.hexdigest()[:16]}…, "
                            f"demo.json expects {size} bytes with sha256 {sha256[:16]}… (damaged installation; "
                            f"reinstall ds4tui)")
        # the archive's modification time, as tar and unzip keep it: a file unpacked again (a repair) is
        # the same file to whatever keys on (size, mtime), e.g. the scheduler's saved prices
        os.utime(tmp, ns=(time.time_ns(), src.stat().st_mtime_ns))
        os.replace(tmp, dest)
        _write_note(dest, sha256)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        if progress and 0 < reported < size:
            progress(dest.name, None, size)  # end the progress line
        raise


def demo_pair(progress: Callable[[str, int | None, int], None] | None = None) -> DemoPair | None:
    """The unpacked demo pair, unpacking it on first use; None when this build ships no demo.

    ``progress(file_name, bytes_done, bytes_total)`` is called while unpacking (``bytes_done`` None:
    unpacking stopped early).  A file that was unpacked before but is damaged or gone now is
    unpacked again and named in the pair's ``repaired`` with the reason.  Raises
    :class:`DemoError` when a bundled file is missing or damaged, or the cache folder cannot be
    written (the message names it and the variable that moves it).
    """
    m = manifest()
    if m is None:
        return None
    files = m["files"]
    folder = pair_folder(m)
    paths = {name: folder / name for name in files}
    why = {name: _verified(paths[name], info["bytes"], info["sha256"]) for name, info in files.items()}
    todo = [name for name in files if why[name] is not None]
    need = sum(files[name]["bytes"] for name in todo)
    bad = _unusable(folder) if todo else None
    if bad:  # before any byte is written
        raise DemoError(f"cannot unpack the demo model into {folder}: expected a writable folder, found {bad[0]}; "
                        f"{bad[1]}")
    in_way = next((paths[name] for name in todo if paths[name].is_dir()), None)
    if in_way is not None:  # before any byte is written: the unpacked file could not replace it
        raise DemoError(f"cannot unpack the demo model into {folder}: expected the file {in_way.name} or nothing at "
                        f"{in_way}, found a folder; move that folder away, or set DS4TUI_DEMO_DIR to another folder")
    short = space_problem(folder, need) if todo else None
    if short:  # before any byte is written
        raise DemoError(f"cannot unpack the demo model into {folder}: {short}")
    for i, name in enumerate(todo):
        info, dest = files[name], paths[name]
        src = PACKAGE_DIR / (name + ".xz")
        if not src.is_file():
            raise DemoError(f"{src}: missing from this installation (reinstall ds4tui)")
        try:
            _unpack(src, dest, info["bytes"], info["sha256"], progress)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # a full disk (or quota): not a matter of writability
                left = sum(files[n]["bytes"] for n in todo[i:])
                raise DemoError(f"cannot unpack the demo model into {folder}: {exc.strerror or exc}: "
                                + (space_problem(folder, left) or _space_advice(folder, left))) from exc
            bad = _unusable(folder)
            raise DemoError(f"cannot unpack the demo model into {folder}: {exc.strerror or exc}"
                            + (f": expected a writable folder, found {bad[0]}; {bad[1]}" if bad else
                               " (set DS4TUI_DEMO_DIR to a writable folder)")) from exc
        except (lzma.LZMAError, EOFError) as exc:  # EOFError: a truncated xz stream
            raise DemoError(f"{src}: not a valid xz file ({exc}); reinstall ds4tui") from exc
    repaired = tuple(f"the demo's {paths[name]} {why[name]}: unpacked it again from the bundled {name}.xz"
                     for name in todo if why[name])
    return DemoPair(paths["model.gguf"], paths["support.gguf"], repaired)


def _mib(n: int, up: bool) -> str:
    """``n`` bytes in MiB, rounded up (a need) or down (what is free), so that a shortfall never reads as enough."""
    return f"{(-(-n // 2**20) if up else n // 2**20)} MiB"


def _space_advice(folder: Path, need: int) -> str:
    return (f"the demo pair needs {_mib(need, True)} free in {folder}; free that much on its disk, or set "
            f"DS4TUI_DEMO_DIR to a folder on a disk that has it")


def _existing(folder: Path) -> Path:
    """``folder`` or the nearest folder above it that exists (where its disk's free space is read)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def space_problem(folder: Path, need: int) -> str | None:
    """Why ``need`` bytes cannot be unpacked into ``folder`` for want of space (None when its disk
    has them free, or the free space cannot be read)."""
    try:
        free = shutil.disk_usage(_existing(folder)).free
    except OSError:
        return None
    if free >= need:
        return None
    return (f"expected {_mib(need, True)} free for the demo pair, found {_mib(free, False)} free on the disk of "
            f"{folder}; free {_mib(need - free, True)} there, or set DS4TUI_DEMO_DIR to a folder on a disk with "
            f"{_mib(need, True)} free")


def stderr_progress(name: str, done: int | None, total: int) -> None:
    """Progress line of an unpacking, on stderr (``done`` None ends the line early).  On a terminal
    the line is rewritten in place; elsewhere (a log, a pipe) only the finished file's line is
    written, so that the file holds no carriage-return updates."""
    import sys

    live = sys.stderr.isatty()
    if done is None:
        if live:
            print(file=sys.stderr, flush=True)
        return
    if not live and done < total:
        return
    start, end = "\r" if live else "", "\n" if done >= total else ""
    print(f"{start}ds4tui: unpacking the demo {name}: {done / total:4.0%} of {total / 2**20:.0f} MiB",
          end=end, file=sys.stderr, flush=True)
