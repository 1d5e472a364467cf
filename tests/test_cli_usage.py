"""Usage errors of the engine commands (generate, bench, chat): one line naming the flag or the
variable, what is accepted and what was found, exit status 2, and nothing loaded (the engine's
constructor is replaced by one that fails the test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4tui.cli import main as cli_main
from ds4tui.engine import session as S
from ds4tui.engine.gguf_model import DS4Model


@pytest.fixture
def no_engine(monkeypatch):
    """Opening an engine (loading the weights) fails the test: a usage error must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("the engine was opened before the usage error")

    monkeypatch.setattr(S, "Engine", refuse)


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        rc = cli_main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _args(command: str, model: str) -> list[str]:
    return {"generate": ["generate", model, "-p", "hi"], "bench": ["bench", model], "chat": ["chat", model]}[command]


@pytest.mark.parametrize("command", ["generate", "bench", "chat"])
def test_backend_option_conflicts_are_the_same_usage_error_everywhere(command, tiny_q2, capsys, monkeypatch,
                                                                       no_engine):
    base = _args(command, tiny_q2["model"])
    if command != "chat":  # the chat has no reference backend
        rc, out, err = _run(capsys, [*base, "--activations", "q8", "--backend", "reference"])
        assert rc == 2 and out == ""
        assert err == (f"ds4tui {command}: error: argument --activations: q8 runs on the cpu and hip backends, found "
                       f"--backend reference (use --backend cpu, hip or auto, or --activations f32)\n")
    rc, out, err = _run(capsys, [*base, "--prefill-gemm", "bf16", "--backend", "cpu"])
    assert rc == 2 and out == ""
    assert err == (f"ds4tui {command}: error: argument --prefill-gemm: bf16 runs on the GPU backend only, found "
                   f"--backend cpu (use --prefill-gemm off or auto, or --backend hip or auto)\n")
    rc, out, err = _run(capsys, [*base, "--gpu-graphs", "on", "--backend", "cpu"])
    assert rc == 2 and out == ""
    assert err == (f"ds4tui {command}: error: argument --gpu-graphs: on runs on the GPU backend only (graphs replay "
                   f"device kernels), found --backend cpu (use --gpu-graphs off, or --backend hip or auto)\n")
    monkeypatch.setenv("DS4TUI_PREFILL_GEMM", "f16")
    rc, out, err = _run(capsys, [*base, "--backend", "cpu"])
    assert rc == 2 and err == (f"ds4tui {command}: error: DS4TUI_PREFILL_GEMM='f16': f16 runs on the GPU backend "
                               f"only, found --backend cpu (unset it or use --prefill-gemm off, or --backend hip or "
                               f"auto)\n")
    monkeypatch.delenv("DS4TUI_PREFILL_GEMM")
    monkeypatch.setenv("DS4_DSPARK_MAX_DRAFT_TOKENS", "99")
    rc, out, err = _run(capsys, base)
    assert rc == 2 and err == (f"ds4tui {command}: error: DS4_DSPARK_MAX_DRAFT_TOKENS='99': expected 0 (the support "
                               f"model's block size) or an integer 1..the support model's block size (5 for the "
                               f"demo's and DS4 Flash's drafters; no block is larger than 16); set one of them "
                               f"(`export DS4_DSPARK_MAX_DRAFT_TOKENS=0`), or unset it for the default: 0 (the block "
                               f"size)\n")


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_max_draft_variable_against_the_support_file_before_loading(command, tiny_q2, capsys, monkeypatch,
                                                                     no_engine):
    monkeypatch.setenv("DS4_DSPARK_MAX_DRAFT_TOKENS", "8")  # the tiny support model's block is 5
    rc, out, err = _run(capsys, [*_args(command, tiny_q2["model"]), "--mtp", str(tiny_q2["support"])])
    assert rc == 2 and err == (f"ds4tui {command}: error: DS4_DSPARK_MAX_DRAFT_TOKENS='8': expected 0 (the support "
                               f"model's block size) or an integer 1..5 (the block size of {tiny_q2['support']}); "
                               f"set one of them (`export DS4_DSPARK_MAX_DRAFT_TOKENS=0`), or unset it for the "
                               f"default: 0 (the block size)\n")


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_ctx_out_of_range(command, tiny_q2, capsys, no_engine):
    model = tiny_q2["model"]
    limit = DS4Model(model).config.context_length
    for ctx in (1, limit + 1):
        rc, out, err = _run(capsys, [*_args(command, model), "--ctx", str(ctx)])
        assert rc == 2 and err == (f"ds4tui {command}: error: argument --ctx: expected 2..{limit} (the context "
                                   f"length of {model}), found {ctx}\n")


def test_generate_ctx_too_small_for_the_prompt_names_the_minimum(tiny_q2, capsys, no_engine):
    from ds4tui.engine.tokenizer import Tokenizer

    text = "hi there, how are you today"
    n = len(Tokenizer.from_gguf(DS4Model(tiny_q2["model"]).reader).encode(text))
    assert n >= 3
    rc, out, err = _run(capsys, ["generate", tiny_q2["model"], "-p", text, "--raw", "--ctx", "3", "--json"])
    message = (f"argument --ctx: expected at least {n + 1} (the prompt's {n} tokens + 1 to generate; known once "
               f"the prompt is tokenized), found 3")
    assert rc == 2 and err == f"ds4tui generate: error: {message}\n"
    assert json.loads(out) == {"ok": False, "error": message}


def test_bench_sizes_blame_the_option(tiny_q2, capsys, no_engine):
    model = tiny_q2["model"]
    limit = DS4Model(model).config.context_length
    rc, out, err = _run(capsys, ["bench", model, "--ctx", "10"])
    assert rc == 2 and err == ("ds4tui bench: error: argument --ctx: expected at least 321 (--prompt-tokens 256 + "
                               "--decode-tokens 64 + 1), found 10\n")
    rc, out, err = _run(capsys, ["bench", model, "--prompt-tokens", "99999999"])
    assert rc == 2 and err == (f"ds4tui bench: error: argument --prompt-tokens: expected at most {limit - 65} (the "
                               f"context length {limit} of {model} less --decode-tokens 64 + 1), found 99999999\n")
    rc, out, err = _run(capsys, ["bench", model, "--prompt-tokens", "8", "--decode-tokens", "99999999"])
    assert rc == 2 and err == (f"ds4tui bench: error: argument --decode-tokens: expected at most {limit - 9} (the "
                               f"context length {limit} of {model} less --prompt-tokens 8 + 1), found 99999999\n")
    rc, out, err = _run(capsys, ["bench", model, "--decode-tokens", "99999999", "--ctx", "1000"])  # not --ctx's fault
    assert rc == 2 and "argument --decode-tokens: expected at most" in err and "--ctx" not in err.split("(")[0]
    rc, out, err = _run(capsys, ["bench", model, "--prompt-tokens", "99999999", "--decode-tokens", "99999999"])
    assert rc == 2 and err == (f"ds4tui bench: error: arguments --prompt-tokens 99999999 and --decode-tokens 99999999: "
                               f"each is more than the context length {limit} of {model} holds (their sum + 1 must be "
                               f"at most {limit})\n")
    rc, out, err = _run(capsys, ["bench", model, "--ctx", str(limit + 1), "--json"])
    message = f"argument --ctx: expected at most {limit} (the context length of {model}), found {limit + 1}"
    assert rc == 2 and err == f"ds4tui bench: error: {message}\n"
    assert json.loads(out)["ok"] is False and json.loads(out)["error"] == message


def test_options_without_a_command_open_the_chat(monkeypatch, capsys, tmp_path):
    from ds4tui.commands import chat

    seen = []
    monkeypatch.setattr(chat, "run", lambda args: seen.append(args) or 0)
    assert cli_main(["--nothink", "--ctx", "8192"]) == 0
    assert cli_main([]) == 0
    assert cli_main(["my.GGUF", "--mtp", "s.gguf"]) == 0  # a model first is the chat's model
    renamed = tmp_path / "mymodel"  # a file without the extension is the chat's model too
    renamed.write_bytes(b"GGUF")
    assert cli_main([str(renamed)]) == 0
    assert [a.command for a in seen] == ["chat", "chat", "chat", "chat"]
    assert seen[0].nothink is True and seen[0].ctx == 8192 and seen[1].nothink is False
    assert (seen[2].model, seen[2].mtp) == ("my.GGUF", "s.gguf")
    assert seen[3].model == str(renamed)
    rc, out, err = _run(capsys, ["notacommand"])  # anything else is still an unknown command
    assert rc == 2 and "invalid choice: 'notacommand'" in err


def test_an_unknown_option_is_named_by_its_command(capsys):
    for argv in (["chat", "--max-drafts", "3"], ["generate", "-p", "x", "--max-drafts"], ["bench", "m", "--nope"]):
        rc, out, err = _run(capsys, argv)
        flag = [a for a in argv if a.startswith("--")][0]
        assert rc == 2 and err == (f"ds4tui {argv[0]}: error: unrecognized arguments: {flag} "
                                   f"(`ds4tui {argv[0]} --help` lists the options)\n"), err


@pytest.mark.parametrize("argv, hint", [
    (["generate", "-p", "x", "--tokens", "64"],
     "generate's token budget is -n N (--n-predict N); --tokens is bench --ab's"),
    (["generate", "-p", "x", "--tokens=64", "--json"],
     "generate's token budget is -n N (--n-predict N); --tokens is bench --ab's"),
    (["chat", "--tokens", "64"],
     "the chat's token budget per answer is -n N (--n-predict N); --tokens is bench --ab's"),
    (["bench", "--ab", "-n", "64"],
     "bench --ab's token budget is --tokens N (a plain bench's: --decode-tokens N); -n is generate's"),
])
def test_another_commands_token_budget_flag_names_this_ones(argv, hint, capsys):
    """generate and chat spell the budget -n / --n-predict, bench --ab --tokens: the unknown-flag
    error of one given the other's says which to use."""
    rc, out, err = _run(capsys, argv)
    flag = next(a for a in argv if a.startswith(("--tokens", "-n"))).split("=")[0]
    message = f"unrecognized arguments: {next(a for a in argv if a.startswith(flag))} ({hint})"
    assert rc == 2 and err == f"ds4tui {argv[0]}: error: {message} (`ds4tui {argv[0]} --help` lists the options)\n"
    assert out == ("" if "--json" not in argv else json.dumps({"ok": False, "error": message}) + "\n")


def test_chat_takes_the_dspark_start_up_knobs(tiny_q2, capsys, no_engine):
    from ds4tui.cli import build_parser
    from ds4tui.commands.chat import options_from_args

    model, support = tiny_q2["model"], str(tiny_q2["support"])
    o = options_from_args(build_parser().parse_args(["chat", model, "--mtp", support, "--no-scheduler",
                                                     "--confidence", "0.3", "--max-draft", "3",
                                                     "--scheduler-policy", "acceptance"]))
    assert (o.scheduler, o.threshold, o.max_draft, o.policy) == (False, 0.3, 3, "acceptance")
    o = options_from_args(build_parser().parse_args(["chat", model, "--mtp", support]))
    assert (o.scheduler, o.threshold, o.max_draft, o.policy) == (True, 0.0, 0, "confidence")
    rc, out, err = _run(capsys, ["chat", model, "--mtp", support, "--max-draft", "6"])
    assert rc == 2 and err == (f"ds4tui chat: error: argument --max-draft: expected 1..5 (the block size of "
                               f"{support}), found 6; give --max-draft 1..5, or leave it out for drafts of up to the "
                               f"block size\n")
    rc, out, err = _run(capsys, ["chat", model, "--confidence", "0.5"])
    assert rc == 2 and err == ("ds4tui chat: error: --confidence needs a DSpark support model: add --mtp "
                               "SUPPORT.gguf, or leave out --confidence\n")


def test_a_save_dir_on_a_read_only_file_system_says_so(tiny_q2, tmp_path, capsys, monkeypatch):
    """--save-dir on a read-only file system is named as such, with the remedy that fits (statvfs
    answers as a read-only mount would; a permission refusal keeps its own words)."""
    import os

    real = os.statvfs

    def statvfs(p):
        r = real(p)
        if str(p) != str(tmp_path):
            return r
        return os.statvfs_result((*tuple(r)[:8], r.f_flag | os.ST_RDONLY, r.f_namemax))

    monkeypatch.setattr(os, "statvfs", statvfs)
    rc, out, err = _run(capsys, ["chat", tiny_q2["model"], "--save-dir", str(tmp_path)])
    assert rc == 2 and err == (f"ds4tui chat: error: argument --save-dir: {tmp_path}: cannot write there: found "
                               f"{tmp_path} on a read-only file system; remount the file system of {tmp_path} "
                               f"read-write, or give another folder (Ctrl+S and "
                               f"F6 write there)\n"), err


def test_the_chat_engine_starts_with_the_knobs(tiny_q2):
    from ds4tui.engine import worker as W

    chat = W.ChatEngine(tiny_q2["model"], support=tiny_q2["support"], backend="cpu", n_ctx=64, scheduler=False,
                        max_draft=3, threshold=0.25, policy="acceptance")
    try:
        k = chat.session.dspark
        assert (k.enabled, k.scheduler, k.max_draft, k.threshold, k.policy) == (True, False, 3, 0.25, "acceptance")
    finally:
        chat.close()


def test_a_number_above_its_maximum_says_so_without_nested_parentheses(capsys):
    rc, out, err = _run(capsys, ["generate", "-p", "x", "--threads", "999"])
    assert rc == 2 and err == ("ds4tui generate: error: argument --threads: expected a thread count >= 0 (0 = one per "
                               "core), at most 256, found 999 (`ds4tui generate --help` lists the options)\n")


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("value", ["inf", "nan", "-0.5"])
def test_a_temperature_that_is_not_a_finite_number_from_0_up_says_so(command, value, capsys, no_engine):
    """inf is >= 0: the message names what is refused (a number that is not finite), not a bound it meets."""
    argv = ["generate", "-p", "x"] if command == "generate" else ["chat"]
    rc, out, err = _run(capsys, [*argv, "--temp", value])
    assert rc == 2 and err == (f"ds4tui {command}: error: argument --temp: expected a finite number >= 0, found "
                               f"{value} (`ds4tui {command} --help` lists the options)\n")


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("flag,value,expected", [
    ("--temp", "1e-45", "expected 0 (greedy) or a temperature from 1.2e-38 to 3.4e38 (the engine holds it as a "
                        "float32), found 1e-45"),
    ("--temp", "1e308", "expected 0 (greedy) or a temperature from 1.2e-38 to 3.4e38 (the engine holds it as a "
                        "float32), found 1e308"),
    ("--top-p", "1e-50", "expected a number in (0, 1] that stays above 0 as the engine's float32 (at least about "
                         "7.1e-46), found 1e-50"),
])
def test_sampling_values_the_engine_s_float32_cannot_hold_are_usage_errors(command, flag, value, expected, capsys,
                                                                            no_engine):
    """Finite and in range as a Python float, but not as the engine's float32: a usage error naming the flag
    before anything loads (status 2), not the engine's error after the model has loaded (status 1)."""
    argv = ["generate", "-p", "x"] if command == "generate" else ["chat"]
    rc, out, err = _run(capsys, [*argv, flag, value])
    assert rc == 2 and err == (f"ds4tui {command}: error: argument {flag}: {expected} (`ds4tui {command} --help` "
                               f"lists the options)\n")


def test_check_finite_says_the_scan_ran(tiny_q2, capsys):
    model = str(tiny_q2["model"])
    n = len(DS4Model(model).specs)
    rc, out, err = _run(capsys, ["inspect", model, "--check-finite"])
    assert rc == 0 and f"finite        all {n} tensors scanned (float values and block scales): no NaN/Inf\n" in out
    rc, out, err = _run(capsys, ["inspect", model, "--check-finite", "--json"])
    assert rc == 0 and json.loads(out)["check_finite"] == {"tensors": n, "nonfinite": 0}
    rc, out, err = _run(capsys, ["inspect", model, "--json"])
    assert json.loads(out)["check_finite"] is None


def test_tokenize_defaults_to_the_demo_model_as_generate_does(capsys):
    from ds4tui.demo import demo_pair

    pair = demo_pair(None)
    if pair is None:
        pytest.skip("this build has no bundled demo model")
    rc, out, err = _run(capsys, ["tokenize", "--text", "hello world", "--json"])
    assert rc == 0, err
    rc2, out2, _ = _run(capsys, ["tokenize", str(pair.model), "--text", "hello world", "--json"])
    assert rc2 == 0 and json.loads(out) == json.loads(out2) and json.loads(out)["n_tokens"] > 0


@pytest.fixture
def no_demo(monkeypatch):
    """Unpacking the bundled demo pair (~100 MiB written, hashed) fails the test: an error that the
    command line alone shows must come first."""
    from ds4tui import demo

    def refuse(*args, **kwargs):
        raise AssertionError("the demo pair was unpacked before the usage error")

    monkeypatch.setattr(demo, "demo_pair", refuse)


@pytest.mark.parametrize("argv, status, message", [
    (["generate", "-p", "hi", "--max-draft", "3", "--backend", "reference"], 2,
     "ds4tui generate: error: --max-draft needs a backend that drafts, found --backend reference (the numpy oracle "
     "does not draft): use --backend auto, cpu or hip, or leave out --max-draft"),
    (["generate", "-p", "hi", "--mtp", "SUPPORT", "--backend", "reference"], 2,
     "ds4tui generate: error: --mtp needs a backend that drafts, found --backend reference (the numpy oracle does "
     "not draft): use --backend auto, cpu or hip"),
    (["generate", "-p", "  "], 2,
     "ds4tui generate: error: argument --prompt: the prompt is empty (only whitespace): give the text to answer "
     "(-p TEXT, or -f FILE)"),
    (["generate", "-f", "MISSING"], 1, "ds4tui generate: error: MISSING: cannot read: No such file or directory "
     "(argument -f/--file: expected a text file with the prompt, or - for standard input; check the path)"),
    (["generate", "-p", "hi", "--mtp", "MISSING"], 1,
     "ds4tui generate: error: MISSING: no such file (argument --mtp: expected a DSpark support GGUF; check the path)"),
    (["generate", "-p", "hi", "--ctx", "1"], 2,
     "ds4tui generate: error: argument --ctx: expected at least 2 (a prompt token and one to generate), found 1"),
    (["chat", "--ctx", "1"], 2,
     "ds4tui chat: error: argument --ctx: expected at least 2 (a prompt token and one to generate), found 1"),
    (["chat", "--save-dir", "MISSING"], 2,
     "ds4tui chat: error: argument --save-dir: MISSING: no such folder (Ctrl+S and F6 write there: give a folder)"),
    (["chat", "--mtp", "MISSING"], 1,
     "ds4tui chat: error: MISSING: no such file (argument --mtp: expected a DSpark support GGUF; check the path)"),
    (["tokenize", "-f", "MISSING"], 1, "ds4tui tokenize: error: MISSING: cannot read: No such file or directory "
     "(argument --file: expected a text file, or - for standard input; check the path)"),
])
def test_usage_errors_without_a_model_come_before_the_demo_is_unpacked(argv, status, message, tiny_q2, tmp_path,
                                                                        capsys, no_demo, no_engine):
    missing = str(tmp_path / "missing")
    argv = [{"SUPPORT": str(tiny_q2["support"]), "MISSING": missing}.get(a, a) for a in argv]
    rc, out, err = _run(capsys, argv)
    assert (rc, err) == (status, message.replace("MISSING", missing) + "\n")


_EMPTY = "expected a path, found an empty one (an unset shell variable?); give the path"


@pytest.mark.parametrize("argv, message", [
    (["generate", "", "-p", "hi"], f"argument MODEL: {_EMPTY}, or leave MODEL out for the bundled demo model"),
    (["bench", ""], f"argument MODEL: {_EMPTY}, or leave MODEL out for the bundled demo model"),
    (["tokenize", "", "--text", "hi"], f"argument MODEL: {_EMPTY}, or leave MODEL out for the bundled demo model"),
    (["chat", "--mtp", ""], f"argument --mtp: {_EMPTY}, or leave --mtp out"),
    (["generate", "-p", "hi", "--mtp", ""], f"argument --mtp: {_EMPTY}, or leave --mtp out"),
    (["inspect", "MODEL", "--mtp", ""], f"argument --mtp: {_EMPTY}, or leave --mtp out"),  # was a silent pass
    (["inspect", ""], f"argument MODEL: {_EMPTY}"),
    (["generate", "-f", ""], f"argument -f/--file: {_EMPTY}"),
    (["compare", "", "B"], f"argument A.json: {_EMPTY}"),
    (["draft-vocab", "MODEL", "", "--out", "x.gguf", "--from", "."], f"argument SUPPORT: {_EMPTY}"),
    (["draft-vocab", "MODEL", "MODEL", "--out", "x.gguf", "--from", "src", ""], f"argument --from: {_EMPTY}"),
    (["draft-vocab", "MODEL", "MODEL", "--out", "x.gguf", "--from", ".", "--glob", ""],
     "argument --glob: expected a file name pattern, found an empty one; give one, e.g. --glob '*.py'"),
])
def test_an_empty_path_is_a_usage_error_naming_its_argument(argv, message, tiny_q2, capsys, no_demo, no_engine):
    """An empty path (``--mtp "$SUPPORT"`` with the variable unset) was read as the current folder ("." is a
    directory), an empty name (": cannot read") or, for ``inspect --mtp ''``, no support file at all (exit 0)."""
    command = argv[0]
    argv = [str(tiny_q2["model"]) if a == "MODEL" else a for a in argv]
    rc, out, err = _run(capsys, argv)
    assert (rc, out, err) == (2, "", f"ds4tui {command}: error: {message}\n")
    if command in ("generate", "bench"):
        rc, out, err = _run(capsys, [*argv, "--json"])
        assert rc == 2 and json.loads(out) == {"ok": False, "error": message}


@pytest.mark.parametrize("command", ["generate", "chat", "bench"])
def test_an_mtp_file_that_cannot_be_read_is_one_message_in_every_command(command, tiny_q2, tmp_path, capsys,
                                                                          no_engine):
    """With a MODEL, generate said only "MISSING: no such file" (found as the engine loaded) and chat
    "support model (--mtp) MISSING: no such file"; both now say what bench and generate without a
    MODEL said, which names the flag and what to do (one function: check_support_path)."""
    hint = " (argument --mtp: expected a DSpark support GGUF; check the path)"
    extra = ["--ab"] if command == "bench" else []
    missing = tmp_path / "missing.gguf"
    for path, why in ((missing, "no such file"), (tmp_path, "is a directory, expected a .gguf file")):
        rc, out, err = _run(capsys, [*_args(command, str(tiny_q2["model"])), *extra, "--mtp", str(path)])
        assert (rc, out, err) == (1, "", f"ds4tui {command}: error: {path}: {why}{hint}\n")
    if command != "generate":
        return
    rc, out, err = _run(capsys, ["generate", str(tiny_q2["model"]), "-p", "hi", "--mtp", str(missing), "--json"])
    assert rc == 1 and json.loads(out) == {"ok": False, "error": f"{missing}: no such file{hint}"}
    rc, out, err = _run(capsys, ["generate", str(tmp_path / "no-model.gguf"), "-p", "hi", "--mtp", str(missing)])
    assert err == (f"ds4tui generate: error: {tmp_path / 'no-model.gguf'}: no such file (argument MODEL: expected a DS4 model GGUF; check the path, or leave MODEL out for the bundled demo model)\n")  # the model first, as chat


@pytest.mark.parametrize("command", ["generate", "chat", "bench"])
def test_an_mtp_file_that_is_no_support_model_is_named_before_the_engine_opens(command, tiny_q2, tmp_path, capsys,
                                                                               no_demo, no_engine):
    """A file that is no GGUF, or a target model, given as --mtp was found only as the engine attached it,
    after the model's weights had loaded (minutes for the real 81 GB file): check_support_path reads
    what the file holds before anything loads, in the words loading it would use."""
    hint = " (argument --mtp: expected a DSpark support GGUF; check the path)"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"hello, not a GGUF file at all")
    model = str(tiny_q2["model"])
    extra = ["--ab"] if command == "bench" else []
    for path, why in ((junk, "wrong magic: expected b'GGUF', found b'hell' (not a GGUF file)"),
                      (model, "general.architecture: expected 'deepseek4-dspark' or 'dflash', found 'deepseek4' "
                              "(this is a target model, not a support file)")):
        rc, out, err = _run(capsys, [*_args(command, model), *extra, "--mtp", str(path)])
        assert (rc, out, err) == (1, "", f"ds4tui {command}: error: {path}: {why}{hint}\n")
        if command == "chat":  # and without a MODEL, before the demo pair is unpacked
            rc, out, err = _run(capsys, ["chat", "--mtp", str(path)])
            assert (rc, out, err) == (1, "", f"ds4tui chat: error: {path}: {why}{hint}\n")


def test_an_error_of_no_file_gets_no_argument_hint():
    """Non-finite logits of a forward pass are a ModelFileError with no path (NonFiniteError): bench's
    file errors pass through file_error, which compared that path with the arguments' (a TypeError)."""
    from ds4tui.commands.environment import file_error
    from ds4tui.engine.errors import NonFiniteError

    exc = NonFiniteError("the logits hold NaN or Inf: bad weights or an overflow")
    assert file_error(exc, "model.gguf", "support.gguf") == "the logits hold NaN or Inf: bad weights or an overflow"


@pytest.mark.parametrize("command, advice", [
    ("generate", "a prompt is at most that long: give a shorter one"),
    ("tokenize", "tokenize it in smaller pieces"),
])
def test_a_text_file_over_16_mib_says_what_to_do_for_its_command(command, advice, tmp_path, capsys, no_demo,
                                                                  no_engine):
    """generate's prompt file used to get tokenize's advice ("tokenize it in smaller pieces")."""
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * ((16 << 20) + 1))
    rc, out, err = _run(capsys, [command, "-f", str(big)])
    assert (rc, err) == (1, f"ds4tui {command}: error: {big}: more than 16 MiB of text; {advice}\n")


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_drafter_option_with_a_model_and_no_mtp_is_refused_before_anything_loads(command, tiny_q2, capsys,
                                                                                   no_demo, no_engine):
    rc, out, err = _run(capsys, [*_args(command, str(tiny_q2["model"])), "--max-draft", "3"])
    assert rc == 2 and err.startswith(f"ds4tui {command}: error: --max-draft needs a DSpark support model: add --mtp "
                                      f"SUPPORT.gguf") and err.count("\n") == 1


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("pair", [["--dspark", "--no-dspark"], ["--no-dspark", "--dspark"]])
def test_dspark_and_no_dspark_together_are_a_usage_error(command, pair, tiny_q2, capsys, no_demo, no_engine):
    """--dspark and --no-dspark contradict each other: a usage error naming both (the last one used
    to win silently), status 2, before anything loads; with --json the error object too."""
    from ds4tui.cli import build_parser

    argv = [*_args(command, str(tiny_q2["model"])), "--mtp", str(tiny_q2["support"]), *pair]
    message = f"argument {pair[1]}: not allowed with argument {pair[0]}"
    prog = f"ds4tui {command}"
    rc, out, err = _run(capsys, argv)
    assert (rc, out, err) == (2, "", f"{prog}: error: {message} (`{prog} --help` lists the options)\n")
    if command == "generate":
        rc, out, err = _run(capsys, [*argv, "--json"])
        assert rc == 2 and json.loads(out) == {"ok": False, "error": message}
    # each alone still says what it says, and neither leaves the default to the command
    parse = build_parser().parse_args
    assert [parse([*_args(command, "m.gguf"), *flag]).dspark for flag in ([], ["--dspark"], ["--no-dspark"])] == [
        None, True, False]
    assert "[--dspark | --no-dspark]" in " ".join(build_parser()._subparsers._group_actions[0]
                                                  .choices[command].format_usage().split())


def test_an_interrupt_is_taken_once_and_the_exit_ignores_later_ones():
    # The first SIGINT/SIGTERM raises KeyboardInterrupt; later ones are ignored until the command
    # ends, so that its clean-up runs to the end; on leaving, the handlers before come back, or with
    # exiting=True (the ds4tui program) the signals stay ignored while the interpreter exits.
    import signal
    import threading
    import time

    from ds4tui import interrupts

    def send(sig):
        signal.pthread_kill(threading.main_thread().ident, sig)
        time.sleep(0.05)  # the handler runs in this thread at its next check

    previous = {s: signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
                for s in interrupts.INTERRUPTS}
    try:
        with interrupts.interrupt_on_signals():
            with pytest.raises(KeyboardInterrupt):
                send(signal.SIGTERM)
            for sig in (signal.SIGINT, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                send(sig)  # ignored: no KeyboardInterrupt, the process lives on
            assert interrupts.signals_seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        with interrupts.interrupt_on_signals(exiting=True):
            assert interrupts.signals_seen == []  # cleared for the new command
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in interrupts.INTERRUPTS)
        send(signal.SIGINT)  # ignored by the process itself
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def test_a_later_interrupt_during_a_long_clean_up_says_how_to_quit_at_once(monkeypatch, capfd):
    # Later signals are ignored; one that comes HINT_AFTER_S or more after the first says once that
    # the command is still stopping and that Ctrl-\ quits at once (a slow clean-up is not a hang).
    import signal
    import threading

    from ds4tui import interrupts

    clock = [100.0]
    monkeypatch.setattr(interrupts.time, "monotonic", lambda: clock[0])

    def send(sig):
        signal.pthread_kill(threading.main_thread().ident, sig)
        __import__("time").sleep(0.05)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupts.interrupt_on_signals():
            with pytest.raises(KeyboardInterrupt):
                send(signal.SIGINT)
            clock[0] += interrupts.HINT_AFTER_S - 0.5
            send(signal.SIGINT)  # soon after the first: ignored, nothing said
            assert capfd.readouterr().err == ""
            clock[0] += 0.5
            send(signal.SIGINT)
            send(signal.SIGTERM)  # said once only
            assert capfd.readouterr().err == interrupts.STILL_STOPPING
            assert interrupts.signals_seen == [signal.SIGINT]
        with interrupts.interrupt_on_signals():  # a new command: the hint again after its own first signal
            with pytest.raises(KeyboardInterrupt):
                send(signal.SIGINT)
            clock[0] += interrupts.HINT_AFTER_S
            send(signal.SIGINT)
            assert capfd.readouterr().err == interrupts.STILL_STOPPING
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_background_job_keeps_sigint_ignored():
    import signal

    from ds4tui import interrupts

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.interrupt_on_signals():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


#: (arguments, the argparse message) for the commands with --json: a bad value, an unknown flag, a
#: missing value, a missing required argument.
_ARGPARSE_ERRORS = [
    (["generate", "-p", "hi", "--draft-vocab", "abc"],
     "argument --draft-vocab: expected auto, full or a count >= 1, found 'abc'"),
    (["generate", "-p", "hi", "--bogus"], "unrecognized arguments: --bogus"),
    (["bench", "--threads", "x2"], "argument --threads: expected a thread count >= 0 (0 = one per core), found 'x2'"),
    (["bench", "--repeat", "0"], "argument --repeat: expected a positive integer, found 0"),
    (["inspect"], "the following arguments are required: model"),
    (["compare", "a.json"], "the following arguments are required: B.json"),
    (["tokenize", "--text", "hi", "--ids-only", "--extra"], "unrecognized arguments: --extra"),
    (["doctor", "--nope"], "unrecognized arguments: --nope"),
    (["draft-vocab", "m.gguf", "s.gguf", "--from", "src", "--out", "o.gguf", "--size"],
     "argument --size: expected one argument"),
]


@pytest.mark.parametrize("argv,message", _ARGPARSE_ERRORS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_argparse_usage_errors_with_json_print_the_error_object_on_stdout(argv, message, capsys, no_engine):
    prog = f"ds4tui {argv[0]}"
    line = f"{prog}: error: {message} (`{prog} --help` lists the options)\n"
    rc, out, err = _run(capsys, argv)
    assert (rc, out, err) == (2, "", line)  # without --json: stderr only
    rc, out, err = _run(capsys, [*argv[:1], "--json", *argv[1:]])
    assert rc == 2 and err == line
    # the shape of the commands' own usage errors (generate's `--ctx` above)
    assert out.count("\n") == 1 and json.loads(out) == {"ok": False, "error": message}


def test_json_is_read_from_the_commands_own_arguments(capsys):
    line = ("ds4tui generate: error: unrecognized arguments: --bogus (`ds4tui generate --help` lists the "
            "options)\n")
    # a prefix argparse takes for --json counts
    rc, out, err = _run(capsys, ["generate", "-p", "hi", "--js", "--bogus"])
    assert rc == 2 and err == line and json.loads(out) == {"ok": False, "error": "unrecognized arguments: --bogus"}
    rc, out, err = _run(capsys, ["generate", "-p", "hi", "--js", "-n", "x"])
    assert rc == 2 and json.loads(out) == {"ok": False,
                                           "error": "argument -n/--n-predict: expected a positive integer, found 'x'"}
    # after `--` it is the MODEL, not the flag
    rc, out, err = _run(capsys, ["generate", "-p", "hi", "--", "--json", "--bogus"])
    assert (rc, out, err) == (2, "", line)


@pytest.mark.parametrize("argv,line", [
    # commands without --json: it is an unknown flag like any other, stderr only
    (["chat", "--json"], "ds4tui chat: error: unrecognized arguments: --json (`ds4tui chat --help` lists the options)\n"),
    (["--json"], "ds4tui chat: error: unrecognized arguments: --json (`ds4tui chat --help` lists the options)\n"),
    (["convert", "--json"], "ds4tui convert: error: the following arguments are required: hf_dir, out "
                            "(`ds4tui convert --help` lists the options)\n"),
    # top-level errors stay as they are
    (["nosuch", "--json"], "ds4tui: error: argument COMMAND: invalid choice: 'nosuch' (choose from 'chat', 'inspect', "
                           "'tokenize', 'convert', 'bench', 'generate', 'doctor', 'compare', 'draft-vocab') (`ds4tui "
                           "--help` lists the options)\n"),
])
def test_json_given_where_there_is_no_json_option_changes_nothing(argv, line, capsys):
    rc, out, err = _run(capsys, argv)
    assert (rc, out, err) == (2, "", line)


class _FullDisk:
    """Standard output redirected to a full disk: every write fails as the OS fails it."""

    def write(self, text: str) -> int:
        import errno

        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("argv", [["doctor"], ["inspect", "MODEL", "--json"], ["tokenize", "MODEL", "--text", "hi"]])
def test_standard_output_on_a_full_disk_is_one_line_and_status_1(argv, tiny_q2, capsys, monkeypatch):
    """doctor, compare, tokenize, inspect and bench printed the traceback of the print that met the full
    disk (generate alone said what happened)."""
    argv = [str(tiny_q2["model"]) if a == "MODEL" else a for a in argv]
    stdout = _FullDisk()
    monkeypatch.setattr("sys.stdout", stdout)
    rc = cli_main(argv)
    import sys

    assert sys.stdout is stdout  # given back as it was
    err = capsys.readouterr().err
    assert (rc, err) == (1, f"ds4tui {argv[0]}: error: cannot write to standard output: No space left on device "
                            f"(free some space where it is redirected, or redirect it elsewhere)\n")


@pytest.mark.parametrize("command", ["generate", "chat", "bench", "tokenize"])
def test_a_model_file_that_cannot_be_read_names_the_argument_and_what_to_do(command, tmp_path, capsys, no_engine):
    """A mistyped MODEL said only "MISSING: no such file" (chat: "model MISSING: no such file"), where
    the --mtp file's message names the flag and what to do; all four commands now say the same."""
    hint = " (argument MODEL: expected a DS4 model GGUF; check the path, or leave MODEL out for the bundled demo model)"
    missing = tmp_path / "missing.gguf"
    for path, why in ((missing, "no such file"), (tmp_path, "is a directory, expected a .gguf file")):
        argv = ["tokenize", str(path), "--text", "hi"] if command == "tokenize" else _args(command, str(path))
        rc, out, err = _run(capsys, argv)
        assert (rc, out, err) == (1, "", f"ds4tui {command}: error: {path}: {why}{hint}\n")


def test_a_closed_standard_output_fails_the_commands_whose_result_it_is(tiny_q2, capsys, monkeypatch, tmp_path):
    """With stdout closed (``>&-``) Python's sys.stdout is None and print writes nothing: doctor,
    inspect, compare and bench without --out ended 0 with their result lost; they now say so in one
    line, exit 1, before any work.  A command whose result is a file (bench --out) still runs."""
    import sys

    monkeypatch.setattr("sys.stdout", None)
    for argv, what in ((["doctor"], "the report"), (["inspect", str(tiny_q2["model"])], "the report"),
                       (["compare", "a.json", "b.json"], "the comparison"),
                       (["bench", str(tiny_q2["model"])], "the results")):
        assert cli_main(argv) == 1
        hint = " (or write the JSON to a file with --out FILE.json)" if argv[0] == "bench" else ""
        assert capsys.readouterr().err == (f"ds4tui {argv[0]}: error: standard output is closed (>&-): {what} would "
                                           f"go nowhere; redirect it instead, e.g. > out.txt{hint}\n")
    out = tmp_path / "b.json"
    assert cli_main(["bench", str(tiny_q2["model"]), "--prompt-tokens", "8", "--out", str(out)]) == 0
    assert sys.stdout is None and out.is_file() and "Traceback" not in capsys.readouterr().err


def _closed_pipe_status(args: list[str]) -> tuple[int, str]:
    """Run ``ds4tui ARGS`` with its standard output a pipe whose reader closes at once."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "ds4tui", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before the interpreter has started: every write meets a closed pipe
    err = p.stderr.read().decode()
    return p.wait(timeout=120), err


def test_a_closed_pipe_is_never_a_success(tiny_q2, tmp_path):
    # a good model: the output did not arrive, so no status 0 (128 + SIGPIPE, as a shell reports it)
    rc, err = _closed_pipe_status(["inspect", str(tiny_q2["model"]), "--json"])
    assert rc == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err
    # a failure of the command's own keeps its status where the command ended before the write failed,
    # else the same 141: never 0
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(Path(tiny_q2["model"]).read_bytes()[:4096])
    rc, err = _closed_pipe_status(["inspect", str(bad), "--json"])
    assert rc in (1, 141), err
    assert "Traceback" not in err and "Exception ignored" not in err


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["generate", "--help"]])
def test_help_into_a_closed_pipe_is_no_success_either(argv):
    """argparse prints --help and --version and exits 0, swallowing a failed write: the program's
    status still says that the text did not arrive (141), with nothing on stderr."""
    rc, err = _closed_pipe_status(argv)
    assert rc == 141 and err == ""


def test_the_policy_flag_offers_the_engines_policies():
    """--scheduler-policy's choices (written out in cli.py, which imports no engine module) are the
    engine's policies, the default first."""
    from ds4tui.cli import build_parser
    from ds4tui.engine.backend import DEFAULT_SCHEDULER_POLICY, SCHEDULER_POLICIES

    for argv in (["generate", "-p", "x"], ["chat"], ["bench", "--ab"]):
        p = build_parser().parse_args(argv)
        assert p.scheduler_policy is None
    acts = [a for a in build_parser()._subparsers._group_actions[0].choices["generate"]._actions
            if a.dest == "scheduler_policy"]
    assert sorted(acts[0].choices) == sorted(SCHEDULER_POLICIES) and acts[0].choices[0] == DEFAULT_SCHEDULER_POLICY


def test_doctor_shows_the_scheduler_policy(capsys):
    from ds4tui.cli import main as cli_main
    from ds4tui.engine.backend import SCHEDULER_POLICIES

    assert cli_main(["doctor", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["scheduler_policy"]
    assert d["default"] == "confidence" and d["choices"] == list(SCHEDULER_POLICIES) and "--scheduler-policy" in d["note"]
    cli_main(["doctor"])
    assert "scheduler policy  confidence by default; what the DSpark scheduler decides from" in capsys.readouterr().out

