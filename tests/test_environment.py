"""The environment variables ds4tui honours: read and checked at the command line's edge
(ds4tui/commands/environment.py), passed to the engine as arguments, shown by ``ds4tui doctor``.

A bad value is one line naming the variable, the value and the accepted values, with exit status 2
(as a bad flag), before any model loads: the model paths given here do not even exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4tui import cli
from ds4tui.cli import main as cli_main
from ds4tui.commands import environment as E

#: What every bad DS4_DSPARK_MAX_DRAFT_TOKENS says to do.
TODO_MAX_DRAFT = "; set one of them (`export DS4_DSPARK_MAX_DRAFT_TOKENS=0`), or unset it for the default: 0 (the block size)"
#: Every message about DS4_DSPARK_MAX_DRAFT_TOKENS names the engine's bound, the support model's block
#: (dspark.c refuses a max_draft above it), and the largest block there is (DS4_DSPARK_MAX_BLOCK).
ACCEPTED_MAX_DRAFT = ("0 (the support model's block size) or an integer 1..the support model's block size (5 for the "
                      "demo's and DS4 Flash's drafters; no block is larger than 16)")
BAD = [
    ("DS4_DSPARK_SCHEDULER", "banana", "0 (off) or 1 (on)"),
    ("DS4_DSPARK_SCHEDULER", "2", "0 (off) or 1 (on)"),
    ("DS4_DSPARK_MAX_DRAFT_TOKENS", "17", ACCEPTED_MAX_DRAFT),
    ("DS4_DSPARK_MAX_DRAFT_TOKENS", "-1", ACCEPTED_MAX_DRAFT),
    ("DS4_DSPARK_MAX_DRAFT_TOKENS", "two", ACCEPTED_MAX_DRAFT),
    ("DS4_DSPARK_STATS", "banana", "0 (off) or 1 (on)"),
    ("DS4_DSPARK_STATS", "yes", "0 (off) or 1 (on)"),
    ("DS4TUI_GPU_LAYOUT", "tiled", "planar (the default) or ggml"),
    ("DS4TUI_PREFILL_GEMM", "int8", "auto (bf16 when the BLAS loads, else off), off, bf16 or f16"),
    ("DS4TUI_TELEMETRY", "rocm", "fake, sysfs, nvml, rss, none"),
    ("DS4TUI_DEMO_DIR", "demo", "an absolute path, found a relative one (it would unpack the demo pair under "
                                "whatever folder a command starts in): give the full path, or unset it"),
]
COMMANDS = [
    ["generate", "no-such-model.gguf", "-p", "hi"],
    ["bench", "no-such-model.gguf"],
    ["chat", "no-such-model.gguf"],
]


@pytest.fixture
def clean_env(monkeypatch):
    for v in E.VARIABLES:
        monkeypatch.delenv(v.name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
@pytest.mark.parametrize("name, value, accepted", BAD)
def test_a_bad_value_is_a_named_error_and_status_2(clean_env, capsys, argv, name, value, accepted):
    clean_env.setenv(name, value)
    rc = cli_main(argv)
    out = capsys.readouterr()
    assert rc == 2 and out.out == ""
    assert out.err.count("\n") == 1
    assert out.err.startswith(f"ds4tui {argv[0]}: error: {name}={value!r}: expected {accepted}")


def test_the_max_draft_bound_in_every_message_is_the_engines(tiny_q2):
    """The messages' numbers are the engine's: it takes a max_draft up to the support model's block
    and refuses one more; the largest block is the C header's; the demo's drafter has a block of 5."""
    from ds4tui.engine import session as S
    from ds4tui.engine.gguf_model import support_block_size

    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    try:
        block = e.block_size
        assert support_block_size(tiny_q2["support"]) == block
        assert e.session(64, max_draft=block).dspark.max_draft == block
        with pytest.raises(ValueError, match=f"exceeds the support model's block size {block}"):
            e.session(64, max_draft=block + 1)
        assert e._lib.DS4_DSPARK_MAX_BLOCK == E.MAX_BLOCK and ACCEPTED_MAX_DRAFT.endswith(
            f"no block is larger than {E.MAX_BLOCK})")
    finally:
        e.close()
    from ds4tui.demo import demo_pair

    pair = demo_pair(None)
    if pair is not None:
        assert support_block_size(pair.support) == 5 and "5 for the demo's" in ACCEPTED_MAX_DRAFT


def test_settings_from_the_environment(clean_env):
    assert E.read_environment() == E.Settings()
    env = {"DS4_DSPARK_SCHEDULER": "0", "DS4_DSPARK_MAX_DRAFT_TOKENS": "3", "DS4_DSPARK_STATS": "1",
           "DS4TUI_GPU_LAYOUT": "ggml", "DS4TUI_GPU_LIB": "/opt/lib.so", "DS4TUI_TELEMETRY": " RSS ",
           "DS4TUI_DEMO_DIR": "/x"}
    s = E.read_environment(env)
    assert s == E.Settings(dspark_scheduler=False, dspark_max_draft=3, dspark_stats=True, gpu_layout="ggml",
                           gpu_library="/opt/lib.so", telemetry="rss")
    assert s.session_options() == {"scheduler": False, "max_draft": 3, "print_stats": True}
    assert s.engine_options() == {"gpu_layout": "ggml", "gpu_library": "/opt/lib.so", "prefill_gemm": "auto",
                                  "gpu_graphs": "off", "draft_vocab": "auto", "verify_head": "auto",
                                  "amx": "auto"}
    # empty counts as unset (as ds4 reads them); "0" is a value
    assert E.read_environment({"DS4_DSPARK_STATS": "", "DS4_DSPARK_MAX_DRAFT_TOKENS": "0"}) == E.Settings()
    with pytest.raises(E.BadVariable) as exc:
        s.check_block(2)
    assert str(exc.value) == ("DS4_DSPARK_MAX_DRAFT_TOKENS='3': expected 0 (the support model's block size) or an "
                              "integer 1..2 (the support model's block size); set one of them (`export "
                              "DS4_DSPARK_MAX_DRAFT_TOKENS=0`), or unset it for the default: 0 (the block size)")
    with pytest.raises(E.BadVariable) as exc:
        s.check_block(2, "s.gguf")
    assert str(exc.value).endswith("expected 0 (the support model's block size) or an integer 1..2 (the block size "
                                   "of s.gguf); set one of them (`export DS4_DSPARK_MAX_DRAFT_TOKENS=0`), or unset "
                                   "it for the default: 0 (the block size)")
    s.check_block(5)


def test_an_empty_value_counts_as_unset_for_every_variable(clean_env):
    """As the README says: set but empty is the default, for every variable alike (read and doctor),
    while any other value outside the accepted ones is refused."""
    empty = {v.name: "" for v in E.VARIABLES}
    assert E.read_environment(empty) == E.Settings() == E.read_environment({})
    for entry, var in zip(E.report(empty), E.VARIABLES):
        assert (entry["name"], entry["value"], entry["in_force"], entry["error"]) == \
            (var.name, None, f"default: {var.default}", None)
    assert E.Settings().dspark_scheduler is True  # DS4_DSPARK_SCHEDULER= : the scheduler on, its default "1"
    with pytest.raises(E.BadVariable) as exc:
        E.read_environment({"DS4_DSPARK_SCHEDULER": " "})
    assert str(exc.value).startswith("DS4_DSPARK_SCHEDULER=' ': expected 0 (off) or 1 (on)")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "An empty value (`DS4_DSPARK_SCHEDULER=`) counts as unset" in " ".join(readme.split())


def test_max_draft_beyond_the_support_block_is_a_usage_error(tiny_q2, clean_env, capsys):
    clean_env.setenv("DS4_DSPARK_MAX_DRAFT_TOKENS", "9")  # a block of 5
    for argv in (["generate", tiny_q2["model"], "-p", "hi", "--mtp", tiny_q2["support"]],
                 ["bench", tiny_q2["model"], "--ab", "--mtp", tiny_q2["support"], "--tokens", "16"]):
        rc = cli_main(argv)
        err = capsys.readouterr().err
        assert rc == 2, err
        assert err.strip().endswith(f"error: DS4_DSPARK_MAX_DRAFT_TOKENS='9': expected 0 (the support model's block "
                                    f"size) or an integer 1..5 (the block size of {tiny_q2['support']}){TODO_MAX_DRAFT}")
        assert err.count("\n") == 1, err  # one line, and nothing loaded before it (no backend note)
    # the flag is checked against the support file's block size before any model loads, too
    clean_env.delenv("DS4_DSPARK_MAX_DRAFT_TOKENS")
    rc = cli_main(["generate", tiny_q2["model"], "-p", "hi", "--mtp", tiny_q2["support"], "--max-draft", "99"])
    err = capsys.readouterr().err
    assert rc == 2 and err == (f"ds4tui generate: error: argument --max-draft: expected 1..5 (the block size of "
                               f"{tiny_q2['support']}), found 99; give --max-draft 1..5, or leave it out for drafts "
                               f"of up to the block size\n")
    from ds4tui.commands import chat

    clean_env.setenv("DS4_DSPARK_MAX_DRAFT_TOKENS", "9")
    args = cli.build_parser().parse_args(["chat", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"])])
    args.settings = E.read_environment()
    assert chat.run(args) == 2
    assert capsys.readouterr().err.endswith(f"DS4_DSPARK_MAX_DRAFT_TOKENS='9': expected 0 (the support model's block "
                                            f"size) or an integer 1..5 (the block size of {tiny_q2['support']})"
                                            f"{TODO_MAX_DRAFT}\n")



def test_a_bad_scheduler_variable_or_max_draft_says_what_to_do(tiny_q2, clean_env, capsys):
    """A value out of range names the accepted values and how to give one, as the modules' other errors do."""
    clean_env.setenv("DS4_DSPARK_SCHEDULER", "x")
    assert cli_main(["generate", "-p", "hi"]) == 2
    assert capsys.readouterr().err == ("ds4tui generate: error: DS4_DSPARK_SCHEDULER='x': expected 0 (off) or 1 (on); "
                                       "set one of them (`export DS4_DSPARK_SCHEDULER=0`), or unset it for the "
                                       "default: 1\n")
    clean_env.delenv("DS4_DSPARK_SCHEDULER")
    support = tiny_q2["support"]
    for command in (["generate", tiny_q2["model"], "-p", "hi"], ["chat", tiny_q2["model"]]):
        assert cli_main([*command, "--mtp", support, "--max-draft", "9"]) == 2
        assert capsys.readouterr().err == (f"ds4tui {command[0]}: error: argument --max-draft: expected 1..5 (the "
                                           f"block size of {support}), found 9; give --max-draft 1..5, or leave it "
                                           f"out for drafts of up to the block size\n")


BAD_FLAGS = [
    (["generate", "-p", "x", "--temp", "-1"], "--temp"),
    (["generate", "-p", "x", "--temp", "hot"], "--temp"),
    (["generate", "-p", "x", "--top-p", "0"], "--top-p"),
    (["generate", "-p", "x", "--top-p", "1.5"], "--top-p"),
    (["generate", "-p", "x", "--min-p", "2"], "--min-p"),
    (["generate", "-p", "x", "--top-k", "-3"], "--top-k"),
    (["generate", "-p", "x", "--seed", "-1"], "--seed"),
    (["generate", "-p", "x", "-n", "0"], "-n/--n-predict"),
    (["generate", "-p", "x", "--ctx", "0"], "--ctx"),
    (["generate", "-p", "x", "--threads", "999"], "--threads"),
    (["generate", "-p", "x", "--confidence", "1.5"], "--confidence"),
    (["generate", "-p", "x", "--max-draft", "0"], "--max-draft"),
    (["generate", "-p", "x", "--backend", "gpu"], "--backend"),
    (["generate", "-p", "x", "--numerics", "fast"], "--numerics"),
    (["chat", "--temp", "-0.5"], "--temp"),
    (["chat", "--top-p", "0"], "--top-p"),
    (["chat", "--min-p", "-1"], "--min-p"),
    (["chat", "--top-k", "x"], "--top-k"),
    (["chat", "--ctx", "-5"], "--ctx"),
    (["chat", "-n", "0"], "-n/--n-predict"),
    (["chat", "--backend", "cuda"], "--backend"),
    (["chat", "--telemetry", "gpu"], "--telemetry"),
    (["chat", "--numerics", "fp8"], "--numerics"),
    (["bench", "m.gguf", "--decode-tokens", "0"], "--decode-tokens"),
    (["bench", "m.gguf", "--repeat", "x"], "--repeat"),
    (["bench", "m.gguf", "--tokens", "-1"], "--tokens"),
    (["inspect", "m.gguf", "--ctx", "0"], "--ctx"),
    (["inspect", "m.gguf", "--budget", "lots"], "--budget"),
    (["convert", "a", "b", "--types", "q4"], "--types"),
]


@pytest.mark.parametrize("argv,flag", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_every_bad_flag_is_one_line_naming_it_with_status_2(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"ds4tui {argv[0]}: error: argument {flag}: ") and ("expected" in err or "choice" in err), err


def test_the_values_reach_the_engine(tiny_q2, clean_env, capsys):
    clean_env.setenv("DS4_DSPARK_SCHEDULER", "0")
    clean_env.setenv("DS4_DSPARK_MAX_DRAFT_TOKENS", "2")
    clean_env.setenv("DS4_DSPARK_STATS", "1")
    rc = cli_main(["generate", tiny_q2["model"], "-p", "hi", "-n", "12", "--mtp", tiny_q2["support"], "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    r = json.loads(out.out)
    assert r["dspark"] == {"enabled": True, "scheduler": False, "threshold": 0.0, "max_draft": 2, "policy": "confidence"}
    assert max(k for k, c in enumerate(r["dspark_stats"]["draft_len_hist"]) if c) <= 2
    assert out.err.count("DSpark stats") == 1  # printed when the session closed
    for value, lines in (("0", 0), ("", 1)):  # 0: no line at all; unset: generate prints it at its end
        clean_env.setenv("DS4_DSPARK_STATS", value)
        rc = cli_main(["generate", tiny_q2["model"], "-p", "hi", "-n", "12", "--mtp", tiny_q2["support"]])
        out = capsys.readouterr()
        assert rc == 0 and out.err.count("DSpark stats") == lines, (value, out.err)


def test_doctor_shows_every_variable_and_the_value_in_force(clean_env, capsys):
    clean_env.setenv("DS4TUI_GPU_LAYOUT", "ggml")
    clean_env.setenv("DS4_DSPARK_STATS", "banana")
    clean_env.setenv("XDG_CACHE_HOME", "/tmp/cache")
    assert cli_main(["doctor"]) == 0
    text = capsys.readouterr().out
    lines = text[text.index("\nenvironment\n"):].splitlines()[2:]
    shown = {ln.split()[0]: ln.split(None, 1)[1] for ln in lines if ln.startswith("  ")}
    assert list(shown) == [v.name for v in E.VARIABLES]
    assert shown["DS4TUI_GPU_LAYOUT"] == "ggml" and shown["XDG_CACHE_HOME"] == "/tmp/cache"
    assert shown["DS4_DSPARK_SCHEDULER"] == "default: 1" and shown["DS4TUI_DEMO_DIR"].startswith("default: ")
    assert shown["DS4_DSPARK_STATS"] == ("banana  (invalid: DS4_DSPARK_STATS='banana': expected 0 (off) or "
                                         "1 (on); set one of them (`export DS4_DSPARK_STATS=1`), or unset it)")
    assert cli_main(["doctor", "--json"]) == 0
    env = {v["name"]: v for v in json.loads(capsys.readouterr().out)["environment"]}
    assert env["DS4TUI_GPU_LAYOUT"]["in_force"] == "ggml" and env["DS4TUI_GPU_LAYOUT"]["error"] is None
    assert env["DS4_DSPARK_MAX_DRAFT_TOKENS"] == {
        "name": "DS4_DSPARK_MAX_DRAFT_TOKENS", "value": None, "in_force": "default: 0 (the block size)",
        "effect": E.VARIABLES[1].effect, "checked": True, "error": None, "ignored": None, "problem": None}
    assert env["HSA_OVERRIDE_GFX_VERSION"]["checked"] is False


@pytest.mark.parametrize("name, value, accepted", BAD)
def test_doctor_warns_about_a_refused_value_in_both_outputs(clean_env, capsys, name, value, accepted):
    """A value the commands refuse (BAD) is marked in doctor's environment list and is a warning,
    the same in the text and in --json, with the refusal's own words and what to do."""
    clean_env.setenv(name, value)
    assert cli_main(["doctor", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    entry = next(v for v in d["environment"] if v["name"] == name)
    assert entry["error"].startswith(f"{name}={value!r}: expected {accepted}")
    warning = (f"{entry['error']}; chat, generate and bench refuse to start while it is set so (exit status 2): set an "
               f"accepted value, or unset it")
    assert d["warnings"].count(warning) == 1
    assert cli_main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert text.count(f"warning: {warning}\n") == 1 and f"(invalid: {entry['error']})" in text


def test_doctor_warns_about_a_gpu_library_path_that_names_no_file(clean_env, tmp_path, capsys):
    """DS4TUI_GPU_LIB takes any path (the commands find out when they load it: --backend auto falls back
    to the CPU, --backend hip fails), so no command refuses it; doctor marks a path that names no file,
    with what follows and what to do, and says nothing of a refusal."""
    for path, what in ((tmp_path / "none.so", "no such file"), (tmp_path, "is a folder")):
        clean_env.setenv("DS4TUI_GPU_LIB", str(path))
        assert cli_main(["doctor", "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        entry = next(v for v in d["environment"] if v["name"] == "DS4TUI_GPU_LIB")
        want = (f"DS4TUI_GPU_LIB={path}: {what}, so the GPU backend is unavailable (--backend auto runs on the CPU, "
                f"--backend hip fails); unset it to load the library the build made")
        assert (entry["error"], entry["problem"]) == (None, want) and d["warnings"].count(want) == 1
        assert not any("refuse to start" in w and "DS4TUI_GPU_LIB" in w for w in d["warnings"])
        assert cli_main(["doctor"]) == 0
        text = capsys.readouterr().out
        assert f"warning: {want}\n" in text and "(see the warning below)" in text
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    clean_env.setenv("DS4TUI_GPU_LIB", str(lib))  # a file: whether it loads is the gpu backend line's to say
    assert cli_main(["doctor", "--json"]) == 0
    entry = next(v for v in json.loads(capsys.readouterr().out)["environment"] if v["name"] == "DS4TUI_GPU_LIB")
    assert entry["problem"] is None


def test_a_relative_demo_dir_is_refused_by_every_command_and_doctor_says_so(clean_env, tmp_path, capsys):
    """DS4TUI_DEMO_DIR is ds4tui's own variable: a relative path (the demo pair would be unpacked
    again under every folder a command starts in) is a bad value, as any ds4tui variable's: the
    engine commands refuse it before anything (status 2, BAD above), a command that only unpacks
    the demo (tokenize) names it, and doctor marks it and warns; nothing is unpacked anywhere."""
    from ds4tui import demo

    clean_env.chdir(tmp_path)
    clean_env.setenv("DS4TUI_DEMO_DIR", "demo-here")
    message = ("DS4TUI_DEMO_DIR='demo-here': expected an absolute path, found a relative one (it would unpack the "
               "demo pair under whatever folder a command starts in): give the full path, or unset it")
    with pytest.raises(demo.DemoError) as exc:
        demo.demo_pair()
    assert str(exc.value) == message
    assert cli_main(["tokenize", "--text", "hi"]) == 1
    assert capsys.readouterr().err == f"ds4tui tokenize: error: {message}\n"
    assert cli_main(["generate", "-p", "hi"]) == 2
    assert capsys.readouterr().err == f"ds4tui generate: error: {message}\n"
    assert cli_main(["doctor", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    entry = next(v for v in d["environment"] if v["name"] == "DS4TUI_DEMO_DIR")
    assert entry["error"] == message and d["demo"]["folder"] is None and d["demo"]["problem"] == message
    assert [w for w in d["warnings"] if message in w] == [f"{message}; chat, generate and bench refuse to start "
                                                          f"while it is set so (exit status 2): set an accepted "
                                                          f"value, or unset it"]  # said once
    assert cli_main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert f"  DS4TUI_DEMO_DIR              demo-here  (invalid: {message})\n" in text
    assert text.count(f"warning: {message}") == 1 and "no folder to unpack it into (see the warning below)" in text
    assert list(tmp_path.iterdir()) == []
    clean_env.setenv("DS4TUI_DEMO_DIR", str(tmp_path / "abs"))  # an absolute one is used as it is
    assert demo.cache_dir() == tmp_path / "abs" and E.read_environment() == E.Settings()


def test_a_relative_xdg_cache_home_is_ignored_by_every_cache_and_doctor_says_so(clean_env, tmp_path, capsys):
    # the XDG Base Directory spec: a relative path is invalid and is ignored. The demo and the
    # scheduler prices (and bench --medium) follow the one rule: neither lands under the current folder.
    from ds4tui import demo
    from ds4tui.commands import bench

    clean_env.chdir(tmp_path)
    clean_env.setenv("XDG_CACHE_HOME", "rel-cache")
    home_cache = Path.home() / ".cache"
    assert E.xdg_cache_home() == (home_cache, (
        f"XDG_CACHE_HOME=rel-cache is ignored: expected an absolute path, found a relative one (the XDG Base "
        f"Directory spec calls it invalid), so the caches are under {home_cache}; set it to an absolute path, or "
        f"unset it"))
    assert demo.cache_dir() == home_cache / "ds4tui" / "demo"
    assert E.cache_root() / "scheduler-prices" == home_cache / "ds4tui" / "scheduler-prices"
    assert bench.medium_dir() == home_cache / "ds4tui" / "bench-medium"
    assert cli_main(["doctor", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    xdg = next(v for v in d["environment"] if v["name"] == "XDG_CACHE_HOME")
    assert xdg["ignored"] == E.xdg_cache_home()[1] and xdg["ignored"] in d["warnings"]
    assert xdg["in_force"] == f"ignored (rel-cache is a relative path): {home_cache} in force"
    assert d["demo"]["folder"].startswith(str(home_cache / "ds4tui" / "demo") + "/")
    assert cli_main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert f"  XDG_CACHE_HOME               ignored (rel-cache is a relative path): {home_cache} in force\n" in text
    assert f"warning: {xdg['ignored']}\n" in text
    assert not (tmp_path / "rel-cache").exists()
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "abs"))  # an absolute one is used by both
    assert E.xdg_cache_home() == (tmp_path / "abs", None)
    assert demo.cache_dir() == tmp_path / "abs" / "ds4tui" / "demo"
    assert E.cache_root() == tmp_path / "abs" / "ds4tui"


def test_every_variable_ds4tui_reads_is_listed():
    """Each environment read under ds4tui/ names a variable that doctor lists."""
    import re
    from pathlib import Path

    import ds4tui

    read = re.compile(r"""(?:environ\.get\(|environ\[|getenv\()\s*["']([A-Za-z0-9_]+)["']""")
    listed = {v.name for v in E.VARIABLES}
    found = set()
    for f in sorted(Path(ds4tui.__file__).parent.rglob("*.py")):
        found |= set(read.findall(f.read_text()))
    assert found and found <= listed, sorted(found - listed)


def test_a_context_beyond_the_model_is_a_usage_error_before_it_loads(tiny_q2, clean_env, capsys):
    model = str(tiny_q2["model"])
    rc = cli_main(["generate", model, "-p", "hi", "--ctx", "2000000"])
    err = capsys.readouterr().err
    assert rc == 2 and err == (f"ds4tui generate: error: argument --ctx: expected 2..1048576 (the context length of "
                               f"{model}), found 2000000\n")
    rc = cli_main(["chat", model, "--ctx", "2000000"])
    err = capsys.readouterr().err
    assert rc == 2 and err == (f"ds4tui chat: error: argument --ctx: expected 2..1048576 (the context length of "
                               f"{model}), found 2000000\n")


def test_python_m_in_a_source_folder_without_the_library_names_the_installed_one(tiny_q2, tmp_path):
    """`python -m ds4tui` in a clone after a plain `pip install .`: Python imports the clone's
    ds4tui (the current folder comes first), whose native library was never built, while the
    installed ds4tui has one.  doctor and generate name both folders and what to run, instead of
    only saying that the engine is not built (pip just built it)."""
    import os
    import shutil
    import site
    import subprocess
    import sys

    import ds4tui

    built = Path(ds4tui.__file__).resolve().parent  # the tests' ds4tui, with its library: "the installed one"
    clone = tmp_path / "clone"
    shutil.copytree(built, clone / "ds4tui", ignore=shutil.ignore_patterns("_native*", "*.so", "*.xz", "__pycache__"))
    # -S: no site hooks (an editable install's finder would find the library through them); the
    # packages are on PYTHONPATH instead, the built ds4tui first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(built.parent), *site.getsitepackages()])}
    for v in E.VARIABLES:
        env.pop(v.name, None)
    want = (f"the native engine (ds4tui._native) is not built in {clone / 'ds4tui'}, the ds4tui that Python imported "
            f"from the current folder, which `python -m` searches before the installed packages; the ds4tui "
            f"installed in {built.parent} has it: run the `ds4tui` command, or `python -m ds4tui` from another "
            f"folder, or build this tree with `python build_native.py` (or `pip install -e .`)")
    run = lambda *argv: subprocess.run([sys.executable, "-S", "-m", "ds4tui", *argv], cwd=clone, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=120)
    r = run("doctor")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith(f"ds4tui doctor: {want} (cannot import name '_native'"), r.stderr
    r = run("generate", tiny_q2["model"], "-p", "hi", "-n", "1", "--backend", "cpu")
    # the cpu engine itself is missing: the line doctor prints, no advice to use --backend auto, which needs it too
    assert (r.returncode, r.stderr) == (1, f"ds4tui generate: error: {want}\n")


NOT_BUILT = "the native engine (ds4tui._native) is not built: run `pip install -e .` or `python build_native.py`"


@pytest.mark.parametrize("argv", [["generate", "-p", "hi", "-n", "1"], ["generate", "-p", "hi", "-n", "1", "--backend", "hip"],
                                  ["generate", "-p", "hi", "-n", "1", "--backend", "cpu"], ["bench", "--decode-tokens", "2"],
                                  ["bench", "--ab", "--tokens", "16", "--backend", "hip"], ["chat"]], ids=" ".join)
def test_a_missing_native_engine_is_the_line_doctor_prints_whatever_the_backend(tiny_q2, clean_env, capsys, argv):
    """No ds4tui._native (an editable checkout whose extension was removed) while a GPU library is
    there: generate and bench print doctor's one line, status 1, not the ImportError of the GPU probe;
    so does the chat, before its app opens on a model it cannot run."""
    import sys

    from ds4tui.engine import gpu

    import ds4tui

    # `from ds4tui import _native` raises ImportError (the package's attribute, set by an earlier import, goes too)
    clean_env.setitem(sys.modules, "ds4tui._native", None)
    clean_env.delattr(ds4tui, "_native", raising=False)
    clean_env.setattr(gpu, "locate", lambda library=None: (Path(gpu.__file__), ""))  # "a GPU library is built"
    model = [str(tiny_q2["model"])] + (["--mtp", str(tiny_q2["support"])] if "--ab" in argv else [])
    rc = cli_main([argv[0], *model, *argv[1:]])
    out = capsys.readouterr()
    assert (rc, out.out, out.err) == (1, "", f"ds4tui {argv[0]}: error: {NOT_BUILT}\n")
    assert cli_main(["doctor"]) == 1
    assert capsys.readouterr().err.startswith(f"ds4tui doctor: {NOT_BUILT} (import of ds4tui._native halted")


@pytest.mark.parametrize("argv", [["chat"], ["generate", "-p", "hi", "-n", "1"], ["generate", "-p", "hi", "-n", "1", "--backend", "cpu"],
                                  ["bench", "--decode-tokens", "2"], ["bench", "--ab", "--tokens", "16"]], ids=" ".join)
def test_without_the_native_engine_no_model_says_so_before_the_demo_unpacks(clean_env, capsys, argv):
    """`ds4tui` (the chat), generate and bench without MODEL run the demo pair, unpacked on first use
    (99 MiB): without the native engine they print doctor's line at once, with nothing unpacked."""
    import sys

    import ds4tui
    from ds4tui import demo

    clean_env.setitem(sys.modules, "ds4tui._native", None)
    clean_env.delattr(ds4tui, "_native", raising=False)
    unpacked = []
    clean_env.setattr(demo, "demo_pair", lambda progress=None: unpacked.append(1))
    rc = cli_main(argv)
    out = capsys.readouterr()
    assert (rc, out.out, out.err, unpacked) == (1, "", f"ds4tui {argv[0]}: error: {NOT_BUILT}\n", [])


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_the_reference_backend_runs_the_demo_without_the_native_engine(tiny_q2, clean_env, capsys, command):
    """--backend reference is numpy: without MODEL it still runs the demo pair with no native engine."""
    import sys

    import ds4tui
    from ds4tui import demo

    clean_env.setitem(sys.modules, "ds4tui._native", None)
    clean_env.delattr(ds4tui, "_native", raising=False)
    pair = demo.DemoPair(model=Path(tiny_q2["model"]), support=Path(tiny_q2["support"]))
    clean_env.setattr(demo, "demo_pair", lambda progress=None: pair)
    argv = (["generate", "-p", "hi", "-n", "2", "--json"] if command == "generate"
            else ["bench", "--prompt-tokens", "4", "--decode-tokens", "2", "--json"])
    rc = cli_main([*argv, "--backend", "reference"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    result = json.loads(out.out)
    assert result["ok"] is True and result["backend"] == "reference"


def test_inspect_without_the_native_engine_says_why_its_budget_is_unknown(tiny_q2, clean_env, capsys):
    """inspect reads the GGUF without the engine: the plan is printed, its GPU budget unknown for doctor's reason."""
    import sys

    from ds4tui.engine import gpu

    import ds4tui

    clean_env.setitem(sys.modules, "ds4tui._native", None)
    clean_env.delattr(ds4tui, "_native", raising=False)
    clean_env.setattr(gpu, "locate", lambda library=None: (Path(gpu.__file__), ""))
    assert cli_main(["inspect", str(tiny_q2["model"])]) == 0
    out = capsys.readouterr()
    assert f"budget        unknown: no GPU memory size known: {NOT_BUILT}; give --budget SIZE\n" in out.out and out.err == ""
