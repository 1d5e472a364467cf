"""The bundled demo pair (ds4tui.demo): unpacking, validation, what it generates and how it drafts.

Thresholds come from the measurements recorded in ``ds4tui/demo/demo.json`` (``bench``): greedy
DSpark without the scheduler accepted 71.8 % of the drafts on the bench's code prompt and 33.5 %
on its prose prompt (256 tokens each); on the two prompts below 32.0 % and 34.7 % (the answers
end at EOS after 26 and 41 tokens: 10 and 15 cycles, 50 and 75 drafts).  The test asks for 10 %,
under the lowest measurement, and for 40 drafts, so that a drafter that no longer matches its target (a
random one accepts well under 1 %) fails while prompt-to-prompt spread does not.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from ds4tui import cli, demo
from ds4tui.commands.environment import cache_root
from ds4tui.engine.gguf_model import DS4Model, SupportModel

PROMPTS = ("Write a Python function `flatten(items)` that returns a flat list of the items of nested lists.",
           "Write a Python function `read_config(path)` for the `configparser` module: Read and parse a filename.")
MIN_ACCEPT_RATE = 10.0
PYTHON_WORDS = ("def ", "return", '"""', "```python")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo-cache")
    old = os.environ.get("DS4TUI_DEMO_DIR")
    os.environ["DS4TUI_DEMO_DIR"] = str(folder)
    yield folder
    if old is None:
        del os.environ["DS4TUI_DEMO_DIR"]
    else:
        os.environ["DS4TUI_DEMO_DIR"] = old


@pytest.fixture(scope="module")
def pair(cache):
    calls = []
    p = demo.demo_pair(lambda name, done, total: calls.append((name, done, total)))
    assert p is not None, "this build ships no demo pair"
    assert calls[-1][1] == calls[-1][2] and {c[0] for c in calls} == {"model.gguf", "support.gguf"}
    return p


def test_bundled_pair_unpacks_checks_and_validates(pair, cache):
    m = demo.manifest()
    for path in (pair.model, pair.support):
        info = m["files"][path.name]
        assert path.parent.parent == cache and path.stat().st_size == info["bytes"]
        assert demo.file_sha256(path) == info["sha256"]
    model = DS4Model(pair.model)
    c = model.config
    assert (c.n_layer, c.n_embd, c.n_vocab, c.n_expert, c.n_hash_layer) == (6, 256, 129280, 16, 1)
    assert {c.layer_kind(i).value for i in range(c.n_layer)} == {"SWA", "CSA", "HCA"}
    support = SupportModel(pair.support, c).require_compatible()
    assert support.meta.block_size == 5 and tuple(support.meta.target_layer_ids) == (3, 4, 5)
    # a second call reuses the files without writing them again
    before = pair.model.stat().st_mtime_ns
    assert demo.demo_pair() == pair and pair.model.stat().st_mtime_ns == before


def test_damaged_or_truncated_files(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    shutil.copy(demo.PACKAGE_DIR / "demo.json", pkg)
    shutil.copy(demo.PACKAGE_DIR / "support.gguf.xz", pkg)
    monkeypatch.setattr(demo, "PACKAGE_DIR", pkg)
    monkeypatch.setenv("DS4TUI_DEMO_DIR", str(tmp_path / "cache"))
    with pytest.raises(demo.DemoError, match=r"model\.gguf\.xz: missing"):
        demo.demo_pair()
    (pkg / "model.gguf.xz").write_bytes(b"\xfd7zXZ\x00 not really")
    with pytest.raises(demo.DemoError, match=r"model\.gguf\.xz: not a valid xz file"):
        demo.demo_pair()
    # valid xz, wrong content: the sha256 check names both files' sums and leaves nothing behind
    import lzma
    (pkg / "model.gguf.xz").write_bytes(lzma.compress(b"GGUF" + bytes(100)))
    with pytest.raises(demo.DemoError, match=r"unpacks to 104 bytes .* expects"):
        demo.demo_pair()
    folder = next((tmp_path / "cache").iterdir())
    assert [p.name for p in folder.iterdir() if p.name.startswith("model")] == []


def test_truncated_bundled_xz_is_a_clear_error(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    shutil.copy(demo.PACKAGE_DIR / "demo.json", pkg)
    data = (demo.PACKAGE_DIR / "support.gguf.xz").read_bytes()
    (pkg / "support.gguf.xz").write_bytes(data[: len(data) // 2])
    monkeypatch.setattr(demo, "PACKAGE_DIR", pkg)
    monkeypatch.setenv("DS4TUI_DEMO_DIR", str(tmp_path / "cache"))
    # skip the big one (None: checked out; "": not there yet, nothing to repair)
    monkeypatch.setattr(demo, "_verified", lambda dest, size, sha: None if dest.name == "model.gguf" else "")
    monkeypatch.setattr(demo, "PROGRESS_EVERY", 1 << 20)
    ends = []
    with pytest.raises(demo.DemoError, match=r"support\.gguf\.xz: not a valid xz file"):
        demo.demo_pair(lambda name, done, total: ends.append(done))
    assert ends and ends[-1] is None  # the progress line was ended
    assert list((tmp_path / "cache").rglob("*.part")) == []


def test_unwritable_cache_names_the_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DS4TUI_DEMO_DIR", str(blocker / "sub"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    with pytest.raises(demo.DemoError) as exc:
        demo.demo_pair()
    assert str(exc.value) == (
        f"cannot unpack the demo model into {demo.pair_folder(demo.manifest())}: expected a writable folder, found "
        f"DS4TUI_DEMO_DIR={blocker / 'sub'}, which lies under a file, {blocker}; set DS4TUI_DEMO_DIR to a writable "
        f"folder, or unset it (the demo then goes under {Path.home() / '.cache' / 'ds4tui' / 'demo'})")
    assert not any(tmp_path.rglob("*.part"))


def test_a_folder_where_a_demo_file_goes_is_named_before_unpacking(tmp_path, monkeypatch):
    """A folder at support.gguf (the unpacked file could not replace it): the error names that path
    and what to do, before anything is unpacked, instead of a bare "Is a directory" after the unpack
    with advice to pick a writable folder (the folder is writable)."""
    monkeypatch.setenv("DS4TUI_DEMO_DIR", str(tmp_path / "cache"))
    # skip the big one (None: checked out)
    monkeypatch.setattr(demo, "_verified", lambda dest, size, sha: None if dest.name == "model.gguf" else
                        f"had {dest.stat().st_size} bytes")
    folder = demo.pair_folder(demo.manifest())
    (folder / "support.gguf").mkdir(parents=True)
    calls = []
    with pytest.raises(demo.DemoError) as exc:
        demo.demo_pair(lambda name, done, total: calls.append(done))
    assert str(exc.value) == (
        f"cannot unpack the demo model into {folder}: expected the file support.gguf or nothing at "
        f"{folder / 'support.gguf'}, found a folder; move that folder away, or set DS4TUI_DEMO_DIR to another folder")
    assert calls == [] and sorted(p.name for p in folder.iterdir()) == ["support.gguf"]


def test_an_xdg_cache_home_that_is_a_file_is_named_as_the_variable_to_fix(tmp_path, monkeypatch, capsys):
    """XDG_CACHE_HOME naming a file: the error names the variable, its value, that it is a file, and
    says to fix that variable (or to move the demo alone with DS4TUI_DEMO_DIR); doctor says the same."""
    xdg = tmp_path / "cache-file"
    xdg.write_text("")
    monkeypatch.delenv("DS4TUI_DEMO_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    folder = demo.pair_folder(demo.manifest())
    assert folder == xdg / "ds4tui" / "demo" / folder.name
    found = (f"expected a writable folder, found XDG_CACHE_HOME={xdg}, which names a file, not a folder; set "
             f"XDG_CACHE_HOME to a folder (or unset it: the caches then go under {Path.home() / '.cache'}), or set "
             f"DS4TUI_DEMO_DIR to a writable folder for the demo alone")
    with pytest.raises(demo.DemoError) as exc:
        demo.demo_pair()
    assert str(exc.value) == f"cannot unpack the demo model into {folder}: {found}"
    assert cli.main(["generate", "-p", "hi"]) == 1
    assert capsys.readouterr().err == f"ds4tui generate: error: cannot unpack the demo model into {folder}: {found}\n"
    need = sum(f["bytes"] for f in demo.manifest()["files"].values())
    d, warnings, text, line = _doctor_demo(capsys)
    assert d["problem"] == (f"the demo unpack folder {folder} cannot be used: {found} (the demo pair needs "
                            f"{-(-need // 2**20)} MiB there)") and d["problem"] in warnings


class _Usage:
    def __init__(self, free: int):
        self.free = free


def test_a_full_disk_says_how_much_space_the_pair_needs_and_where(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("DS4TUI_DEMO_DIR", str(folder))
    m = demo.manifest()
    need = sum(f["bytes"] for f in m["files"].values())
    where = demo.pair_folder(m)
    mib = -(-need // 2**20)
    # too little free space: refused before a byte is written, with the space needed and where
    monkeypatch.setattr(demo.shutil, "disk_usage", lambda p: _Usage(5 * 2**20 + 7))
    with pytest.raises(demo.DemoError) as exc:
        demo.demo_pair()
    assert str(exc.value) == (f"cannot unpack the demo model into {where}: expected {mib} MiB free for the demo pair, "
                              f"found 5 MiB free on the disk of {where}; free {mib - 5} MiB there, or set "
                              f"DS4TUI_DEMO_DIR to a folder on a disk with {mib} MiB free")
    assert "writable" not in str(exc.value) and not folder.exists()
    # the disk fills up during the unpacking (another writer): the write's error, then the same account
    frees = iter([need + 2**30, 3 * 2**20])
    monkeypatch.setattr(demo.shutil, "disk_usage", lambda p: _Usage(next(frees)))

    def full(src, dest, size, sha256, progress):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(demo, "_unpack", full)
    with pytest.raises(demo.DemoError) as exc:
        demo.demo_pair()
    assert str(exc.value) == (f"cannot unpack the demo model into {where}: No space left on device: expected {mib} "
                              f"MiB free for the demo pair, found 3 MiB free on the disk of {where}; free {mib - 3} "
                              f"MiB there, or set DS4TUI_DEMO_DIR to a folder on a disk with {mib} MiB free")


def _doctor_demo(capsys) -> tuple[dict, list[str], str, str]:
    assert cli.main(["doctor", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert cli.main(["doctor"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("demo model "))
    return d["demo"], d["warnings"], text, line


def test_doctor_checks_the_demo_unpack_folder(tmp_path, monkeypatch, capsys):
    m = demo.manifest()
    need = sum(f["bytes"] for f in m["files"].values())
    mib = -(-need // 2**20)
    monkeypatch.setenv("DS4TUI_DEMO_DIR", str(tmp_path / "ok"))  # a folder that can be made: no warning
    d, warnings, text, line = _doctor_demo(capsys)
    assert d["problem"] is None and not any("demo unpack folder" in w for w in warnings)
    assert "see the warning below" not in line

    blocker = tmp_path / "a-file"  # a file where a folder above the unpack folder should be
    blocker.write_text("")
    monkeypatch.setenv("DS4TUI_DEMO_DIR", str(blocker / "demo"))
    folder = demo.pair_folder(m)
    d, warnings, text, line = _doctor_demo(capsys)
    warning = (f"the demo unpack folder {folder} cannot be used: expected a writable folder, found DS4TUI_DEMO_DIR="
               f"{blocker / 'demo'}, which lies under a file, {blocker}; set DS4TUI_DEMO_DIR to a writable folder, or "
               f"unset it (the demo then goes under {cache_root() / 'demo'}) (the demo pair needs {mib} MiB there)")
    assert d["problem"] == warning and warning in warnings and f"warning: {warning}\n" in text
    assert line.endswith(f"unpacked on first use into {folder} (it cannot be unpacked there: see the warning below)")

    read_only = tmp_path / "read-only"  # root ignores folder modes: the refusal is injected
    read_only.mkdir()
    monkeypatch.setenv("DS4TUI_DEMO_DIR", str(read_only))
    real_access = os.access
    monkeypatch.setattr(demo.os, "access", lambda p, mode: False if str(p) == str(read_only) else real_access(p, mode))
    d, warnings, text, line = _doctor_demo(capsys)
    folder = demo.pair_folder(m)
    assert d["problem"] == (f"the demo unpack folder {folder} cannot be used: expected a writable folder, found no "
                            f"permission to write in {read_only}; make {read_only} writable for this user, or set "
                            f"DS4TUI_DEMO_DIR to a writable folder (the demo pair needs {mib} MiB there)")
    monkeypatch.undo()

    # a read-only file system and a disk with no block left: each its own words and remedy
    for flag, bavail, found, fix in (
            (os.ST_RDONLY, None, f"{read_only} on a read-only file system",
             f"remount the file system of {read_only} read-write"),
            (0, 0, f"no space left on the disk of {read_only}", f"free some space on the disk of {read_only}")):
        monkeypatch.setenv("DS4TUI_DEMO_DIR", str(read_only))
        monkeypatch.setattr(os, "statvfs", _statvfs_with(read_only, flag, bavail))
        d, warnings, text, line = _doctor_demo(capsys)
        assert d["problem"] == (f"the demo unpack folder {demo.pair_folder(m)} cannot be used: expected a writable "
                                f"folder, found {found}; {fix}, or set DS4TUI_DEMO_DIR to a writable folder (the demo "
                                f"pair needs {mib} MiB there)")
        assert "no permission" not in text and "writable for this user" not in text
        monkeypatch.undo()

    monkeypatch.setenv("DS4TUI_DEMO_DIR", str(tmp_path / "small"))  # too little free space on its disk
    monkeypatch.setattr(demo.shutil, "disk_usage", lambda p: _Usage(7 * 2**20))
    d, warnings, text, line = _doctor_demo(capsys)
    folder = demo.pair_folder(m)
    warning = (f"the demo unpack folder {folder} cannot hold the demo pair: expected {mib} MiB free for the demo pair, "
               f"found 7 MiB free on the disk of {folder}; free {mib - 7} MiB there, or set DS4TUI_DEMO_DIR to a "
               f"folder on a disk with {mib} MiB free")
    assert d["problem"] == warning and f"warning: {warning}\n" in text


def _statvfs_with(folder, flag: int, bavail: int | None):
    """os.statvfs as it would answer for ``folder`` on a file system with ``flag`` set (ST_RDONLY:
    mounted read-only) and ``bavail`` blocks free (None: as it is); other paths as they are."""
    real = os.statvfs

    def statvfs(p):
        r = real(p)
        if str(p) != str(folder):
            return r
        return os.statvfs_result((r.f_bsize, r.f_frsize, r.f_blocks, r.f_bfree,
                                  r.f_bavail if bavail is None else bavail, r.f_files, r.f_ffree, r.f_favail,
                                  r.f_flag | flag, r.f_namemax))
    return statvfs


def test_damaged_cached_file_is_unpacked_again(pair):
    """A damaged or deleted file is unpacked again, and the pair says which and why (``repaired``:
    the commands' note on stderr); a file that checks out, or a garbled note alone, says nothing."""
    import hashlib

    want = demo.manifest()["files"]["support.gguf"]["sha256"]
    size = pair.support.stat().st_size
    unpacked_at = pair.support.stat().st_mtime_ns  # the archive's time: what saved scheduler prices key on
    assert unpacked_at == (Path(demo.__file__).parent / "support.gguf.xz").stat().st_mtime_ns
    with open(pair.support, "r+b") as f:
        f.truncate(size // 2)
    again = demo.demo_pair()
    assert again == pair and pair.support.stat().st_size == size
    assert pair.support.stat().st_mtime_ns == unpacked_at  # repaired: the same identity as before the damage
    assert demo.file_sha256(pair.support) == want
    assert again.repaired == (f"the demo's {pair.support} had {size // 2} bytes where demo.json expects {size}: "
                              f"unpacked it again from the bundled support.gguf.xz",)
    assert demo.demo_pair().repaired == ()  # checked out now: nothing to say
    # same size, four bytes changed: the mtime no longer matches the .verified note, so it is hashed
    with open(pair.support, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff\xff\xff\xff")
    os.utime(pair.support, ns=(1, 1))
    found = hashlib.sha256(pair.support.read_bytes()).hexdigest()
    again = demo.demo_pair()
    assert again == pair and demo.file_sha256(pair.support) == want
    assert again.repaired == (f"the demo's {pair.support} had sha256 {found[:16]}… where demo.json expects "
                              f"{want[:16]}… (the same size, other bytes): unpacked it again from the bundled "
                              f"support.gguf.xz",)
    # deleted after it was unpacked (its note is still there)
    pair.model.unlink()
    assert demo.demo_pair().repaired == (f"the demo's {pair.model} was missing (deleted after it was unpacked): "
                                         f"unpacked it again from the bundled model.gguf.xz",)
    # a garbled note (not even UTF-8) only means hashing again
    pair.support.with_name("support.gguf.verified").write_bytes(b"\xff\xfe garbage")
    again = demo.demo_pair()
    assert again == pair and again.repaired == ()
    assert oct(pair.support.stat().st_mode & 0o777) == "0o644"


def test_an_earlier_versions_demo_file_is_named_as_such(pair):
    """A ds4tui that shipped another drafter left its support.gguf, checked then as its own sha256
    (the .verified note), untouched since: the repair says it was another version's file, with both
    sums, not that the file was damaged; the file is this version's afterwards."""
    import hashlib

    want = demo.manifest()["files"]["support.gguf"]["sha256"]
    with open(pair.support, "r+b") as f:  # the earlier drafter: the same size, other bytes
        f.seek(4096)
        f.write(b"\x01\x02\x03\x04")
    old = hashlib.sha256(pair.support.read_bytes()).hexdigest()
    st = pair.support.stat()
    pair.support.with_name("support.gguf.verified").write_text(f"{st.st_size} {st.st_mtime_ns} {old}\n")
    again = demo.demo_pair()
    assert again.repaired == (f"the demo's {pair.support} was another ds4tui version's (sha256 {old[:16]}…, checked "
                              f"when it was unpacked; this version's demo.json expects {want[:16]}…): unpacked it "
                              f"again from the bundled support.gguf.xz",)
    assert demo.file_sha256(pair.support) == want and demo.demo_pair().repaired == ()


def test_the_commands_say_which_demo_file_was_unpacked_again(pair, capsys):
    """tokenize, generate, bench and chat without MODEL: one note on stderr names the repaired file and why
    (the chat app also shows it in its welcome line: ChatOptions.notes)."""
    from ds4tui.commands.chat import options_from_args

    size = pair.support.stat().st_size

    def damage() -> str:
        with open(pair.support, "r+b") as f:
            f.truncate(size - 1)
        return (f"note: the demo's {pair.support} had {size - 1} bytes where demo.json expects {size}: unpacked it "
                f"again from the bundled support.gguf.xz\n")

    note = damage()
    assert cli.main(["tokenize", "--text", "hi", "--ids-only"]) == 0
    err = capsys.readouterr().err
    assert err == f"ds4tui tokenize: {note}" and pair.support.stat().st_size == size
    note = damage()
    assert cli.main(["generate", "-p", "hi", "--nothink", "-n", "1", "--backend", "cpu", "--json"]) == 0
    err = capsys.readouterr().err
    assert err.count(f"ds4tui generate: {note}") == 1 and err.count("unpacked it again") == 1
    note = damage()
    assert cli.main(["bench", "--prompt-tokens", "8", "--decode-tokens", "2", "--threads", "1", "--backend", "cpu",
                     "--json"]) == 0
    assert capsys.readouterr().err.startswith(f"ds4tui bench: {note}")
    note = damage()
    options = options_from_args(cli.build_parser().parse_args(["chat"]))
    assert f"ds4tui chat: {note}" in capsys.readouterr().err
    assert options.notes == (note.removeprefix("note: ").rstrip("\n"),)
    assert cli.main(["tokenize", "--text", "hi", "--ids-only"]) == 0  # nothing damaged: nothing said
    assert "unpacked it again" not in capsys.readouterr().err


def test_stale_temporary_files_are_removed(pair):
    stale = pair.support.with_name("support.gguf.abc123.part")
    fresh = pair.support.with_name("support.gguf.def456.part")
    for p in (stale, fresh):
        p.write_bytes(b"half")
    os.utime(stale, (1, 1))
    pair.support.unlink()
    assert demo.demo_pair() == pair
    assert not stale.exists() and fresh.exists()  # a fresh one may belong to a concurrent unpack
    fresh.unlink()


def test_window_title_names_the_demo():
    from ds4tui.engine.worker import _display_name

    assert _display_name("ds4tui-demo", Path("/c/model.gguf")) == "ds4tui-demo (model.gguf)"
    assert _display_name("model", Path("/c/model.gguf")) == "model.gguf"


def _generate(capsys, *extra):
    assert cli.main(["generate", "-n", "128", "--nothink", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_generate_without_a_model_runs_the_demo_and_drafts(pair, capsys, prompt):
    on = _generate(capsys, "-p", prompt, "--no-scheduler")
    assert on["model"] == str(pair.model) and on["support"]["status"] == "attached"
    assert sum(w in on["text"] for w in PYTHON_WORDS) >= 3, on["text"]
    st = on["dspark_stats"]
    assert st["proposed"] >= 40 and st["accepted_draft"] > 0 and st["invariant_violations"] == []
    assert st["accept_rate"] >= MIN_ACCEPT_RATE, st
    off = _generate(capsys, "-p", prompt, "--no-dspark")
    assert off["dspark_stats"]["proposed"] == 0
    assert off["generated_ids"] == on["generated_ids"]  # greedy: DSpark changes the speed, not the text
    # the verify's LM head only for the rows acceptance reaches (on computed every row, the default
    # with the cpu's q8 activations; spec dspark.md §3.4): the same tokens and counts, fewer rows
    lazy = _generate(capsys, "-p", prompt, "--no-scheduler", "--verify-head", "lazy")
    assert (on["verify_head"], lazy["verify_head"]) == ("all", "lazy")
    assert lazy["generated_ids"] == on["generated_ids"]
    same = ("cycles", "proposed", "accepted_draft", "full", "partial", "miss_first", "accepted_len_hist", "pos_accepted")
    assert {k: lazy["dspark_stats"][k] for k in same} == {k: st[k] for k in same}
    assert lazy["dspark_stats"]["verify_head_rows"] < st["verify_head_rows"]


def test_the_readme_figures_of_the_flatten_answer(pair, capsys):
    """README's headless command (greedy, --nothink, -n 128, --no-scheduler) on the cpu, against the
    figures its set-up section gives for that answer: tokens, cycles, drafts accepted of proposed,
    the accept rate and the tokens per cycle."""
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert PROMPTS[0].replace("`", "\\`") in readme  # the README's command asks for this answer
    m = re.search(r"this prompt's (\d+)-token answer \(the model ends it there\) takes (\d+) cycles, (\d+) of (\d+) "
                  r"drafts accepted \((\d+) %\), ([\d.]+) tokens per cycle", readme)
    assert m, "the README's figures of the flatten answer are not where this test reads them"
    out = _generate(capsys, "-p", PROMPTS[0], "--no-scheduler", "--backend", "cpu")
    st = out["dspark_stats"]
    assert (len(out["generated_ids"]), out["stop"], st["cycles"], st["accepted_draft"], st["proposed"]) == \
        (int(m[1]), "eos", int(m[2]), int(m[3]), int(m[4]))
    assert (round(st["accept_rate"]), f"{st['tokens_per_cycle']:.1f}") == (int(m[5]), m[6])


def test_the_demo_on_the_reference_backend_says_its_drafter_is_left_out_with_json_too(pair, capsys):
    note = ("ds4tui generate: note: the reference backend does not draft, so the demo's DSpark support model is not "
            "attached\n")
    for extra in ([], ["--json"]):
        rc = cli.main(["generate", "-p", "hi", "-n", "1", "--nothink", "--backend", "reference", *extra])
        out, err = capsys.readouterr()
        assert rc == 0 and err.startswith(note), (extra, err)
        if extra:
            assert json.loads(out)["support"]["status"] == "none"


def test_sampled_demo_is_the_same_with_a_lazy_verify_head(pair, capsys):
    """Temperature 0.8, a fixed seed, the scheduler off: lazy and all draw the same tokens (the rows
    that acceptance reads are the same bits, and the draws are made in the same order)."""
    runs = [_generate(capsys, "-p", PROMPTS[0], "--no-scheduler", "--temp", "0.8", "--seed", "7", "--verify-head", vh)
            for vh in ("lazy", "all")]
    assert runs[0]["generated_ids"] == runs[1]["generated_ids"]
    a, b = runs[0]["dspark_stats"], runs[1]["dspark_stats"]
    assert a["proposed"] >= 40 and (a["accepted_draft"], a["full"], a["partial"]) == (b["accepted_draft"], b["full"],
                                                                                       b["partial"])
    assert a["verify_head_rows"] < b["verify_head_rows"]


def test_a_non_finite_logit_of_the_demo_names_its_file_and_the_repair(pair, capsys, monkeypatch):
    # The user named no model: the error says which file it is and how to have it checked again;
    # nothing was streamed, so stdout gets no stray blank line.
    from ds4tui.engine import session as S

    def broken(self, ids, **kw):
        raise S.EngineError("non-finite logit (token id 7) at position 3: the model has NaN/Inf weights or overflows")

    monkeypatch.setattr(S.Session, "prefill", broken)
    assert cli.main(["generate", "-p", "hi", "--nothink", "-n", "4", "--backend", "cpu"]) == 1
    out, err = capsys.readouterr()
    folder = pair.model.parent
    assert out == ""
    assert (f"non-finite logit (token id 7) at position 3: the model has NaN/Inf weights or overflows (the model is "
            f"the bundled demo, {pair.model}: if a file in {folder} changed after it was unpacked, delete "
            f"{folder}/*.verified and run again") in err
    # a model the user named: the error names that file
    assert cli.main(["generate", str(pair.model), "-p", "hi", "--nothink", "-n", "4", "--backend", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.rstrip().endswith(f"the model has NaN/Inf weights or overflows (the model: {pair.model})")


def test_bench_without_a_model_measures_the_demo_and_says_so(pair, capsys):
    assert cli.main(["bench", "--ab", "--tokens", "16", "--threads", "1", "--backend", "cpu", "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["model"]["path"] == str(pair.model) and r["support"]["path"] == str(pair.support)
    assert r["support"]["status"] == "attached" and r["outputs_identical"] and r["tokens"] == 16
    assert (f"ds4tui bench: no MODEL given: benchmarking the bundled demo model {pair.model} with its DSpark "
            f"support model {pair.support}") in captured.err.splitlines()
    assert cli.main(["bench", "--prompt-tokens", "8", "--decode-tokens", "2", "--threads", "1", "--backend", "cpu",
                     "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["model"]["path"] == str(pair.model) and r["decode_tokens"] == 2
    assert captured.err.splitlines()[0] == f"ds4tui bench: no MODEL given: benchmarking the bundled demo model {pair.model}"


def test_chat_without_a_model_opens_the_demo(pair):
    from ds4tui.commands.chat import options_from_args

    args = cli.build_parser().parse_args(["chat"])
    options = options_from_args(args)
    assert Path(options.model) == pair.model and Path(options.support) == pair.support and options.dspark


def test_doctor_reports_the_demo(pair, capsys):
    old = pair.model.parent.parent / "0123456789abcdef"  # an earlier version's pair in the same cache
    old.mkdir()
    (old / "model.gguf").write_bytes(b"x" * 3 * 2**20)
    (pair.model.parent.parent / "notes").mkdir(exist_ok=True)  # not a pair folder: not named
    try:
        assert cli.main(["doctor", "--json"]) == 0
        d = json.loads(capsys.readouterr().out)["demo"]
        assert d == {"bundled": True, "folder": str(pair.model.parent), "unpacked": True,
                     "bytes": pair.model.stat().st_size + pair.support.stat().st_size,
                     "other_versions": [{"folder": str(old), "bytes": 3 * 2**20}], "problem": None}
        assert cli.main(["doctor"]) == 0
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.startswith("demo model "))  # the label column's width aside
        assert line.split(None, 2)[2] == f"bundled (99 MiB unpacked), unpacked in {pair.model.parent}"
        assert f"another version's pair (3 MiB), unused by this ds4tui: {old} (delete it to free the space)" in out
    finally:
        shutil.rmtree(old)
        (pair.model.parent.parent / "notes").rmdir()


@pytest.mark.parametrize("terminal", [True, False])
def test_unpack_progress_rewrites_its_line_on_a_terminal_only(terminal, monkeypatch, capsys):
    """On a terminal the progress line is rewritten in place (carriage returns); in a log or a pipe
    only each finished file's line is written, and a line ended early leaves nothing."""
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    for done in (0, 45 << 20, 90 << 20):
        demo.stderr_progress("model.gguf", done, 90 << 20)
    demo.stderr_progress("support.gguf", 5 << 20, 13 << 20)
    demo.stderr_progress("support.gguf", None, 13 << 20)
    err = capsys.readouterr().err
    if terminal:
        assert err == ("\rds4tui: unpacking the demo model.gguf:   0% of 90 MiB"
                       "\rds4tui: unpacking the demo model.gguf:  50% of 90 MiB"
                       "\rds4tui: unpacking the demo model.gguf: 100% of 90 MiB\n"
                       "\rds4tui: unpacking the demo support.gguf:  38% of 13 MiB\n")
    else:
        assert err == "ds4tui: unpacking the demo model.gguf: 100% of 90 MiB\n"


@pytest.mark.skipif(not os.path.isdir("/proc/self") or os.statvfs("/proc").f_blocks != 0, reason="Linux's /proc")
def test_a_demo_folder_under_proc_cannot_be_written_and_is_not_a_full_disk(monkeypatch, capsys):
    """/proc has no blocks at all (statvfs f_bavail 0, like a full disk): the folder is named as one that
    cannot be written, with the OS error of making a folder there, not as a disk with no space left."""
    from ds4tui.engine import fs

    assert fs.unwritable("/proc") == errno.ENOENT  # mkdir under /proc: "No such file or directory"
    monkeypatch.setenv("DS4TUI_DEMO_DIR", "/proc/x")
    m = demo.manifest()
    mib = -(-sum(f["bytes"] for f in m["files"].values()) // 2**20)
    d, warnings, text, line = _doctor_demo(capsys)
    assert d["problem"] == (f"the demo unpack folder {demo.pair_folder(m)} cannot be used: expected a writable folder, "
                            f"found /proc, which cannot be written: {os.strerror(errno.ENOENT)}; choose a folder outside "
                            f"/proc, or set DS4TUI_DEMO_DIR to a writable folder (the demo pair needs {mib} MiB there)")
    assert "no space left" not in text


def test_a_file_system_with_no_blocks_that_takes_files_is_writable(tmp_path, monkeypatch):
    """f_blocks 0 is not a full disk: where a folder can be made (some virtual file systems), nothing is wrong."""
    from ds4tui.engine import fs

    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result((*tuple(real(p))[:2], 0, 0, 0, *tuple(real(p))[5:])))
    assert fs.unwritable(tmp_path) is None and list(tmp_path.iterdir()) == []
