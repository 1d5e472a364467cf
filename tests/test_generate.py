"""``ds4tui generate``: greedy tokens equal the numpy reference's, the prompt is the chat template
(or the raw text), the streamed text is the decoded ids, and bad requests are clear errors.  With
``--mtp``: DSpark is on, the greedy tokens do not change, the counters are consistent and match the
tokens marked as drafted, and a refused support file is a warning, not a failure."""

from __future__ import annotations

import io
import json
import re
import signal
import sys

import pytest

from ds4tui.cli import main as cli_main
from ds4tui.devtools import make_test_model as mtm
from ds4tui.engine import reference as R
from ds4tui.engine.stats import DSparkStats, parse_line
from ds4tui.engine.tokenizer import Tokenizer, render_chat

PROMPT = "Write a Python function that reverses a linked list."


def _gen(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli_main(["generate", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def tok(tiny_q2) -> Tokenizer:
    return Tokenizer.from_gguf(tiny_q2["model"])


@pytest.mark.parametrize("numerics", ["ds4", "transformers"])
def test_cpu_greedy_tokens_equal_the_reference(tiny_q2, tok, capsys, numerics):
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "-n", "40", "--json", "--numerics", numerics)
    assert rc == 0, err
    r = json.loads(out)
    ids = render_chat(tok, [{"role": "user", "content": PROMPT}], think=True)
    assert r["prompt_ids"] == ids
    want = R.greedy_generate(R.ReferenceModel(tiny_q2["model"], numerics=numerics), ids, 40)
    assert r["generated_ids"] == want
    assert r["text"] == tok.decode(want)
    assert r["stop"] == "max_tokens" and r["backend"] == "cpu" and r["numerics"] == numerics
    assert r["n_ctx"] == len(ids) + 40  # the last token is emitted, never run
    assert r["stats"]["n_decode_tokens"] == 40 and r["stats"]["n_prefill_tokens"] == len(ids)
    assert r["timings"]["decode_tokens_per_s"] > 0
    m = r["memory"]
    assert m["total"] == m["weights"] + m["kv"] + m["compressor"] + m["scratch"] + m["device"] + m["amx_copies"] and m["kv"] > 0
    assert (m["amx_copies"] > 0) == (r["amx"] == "on")  # the amx option's copies (spec ds4.md §2.9.6), auto by the CPU


def test_reference_backend_gives_the_same_json(tiny_q2, capsys):
    args = [tiny_q2["model"], "-p", PROMPT, "-n", "6", "--json", "--nothink"]
    rc, out, err = _gen(capsys, *args)
    rc2, out2, err2 = _gen(capsys, *args, "--backend", "reference")
    assert rc == rc2 == 0, err + err2
    a, b = json.loads(out), json.loads(out2)
    assert b["backend"] == "reference"
    assert a["generated_ids"] == b["generated_ids"] and a["prompt_ids"] == b["prompt_ids"]


def test_streamed_text_is_the_decoded_tokens(tiny_q2, tok, capsys):
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "-n", "12", "--nothink")
    assert rc == 0, err
    # the speeds go to stderr at the end, as --json's timings
    rates = err.splitlines()[-1]
    assert re.fullmatch(r"ds4tui generate: prefill \d+ tokens: \d+\.\d\d s, \d+\.\d tokens/s; generated 12 tokens, "
                        r"decode \d+\.\d tokens/s \(cpu backend\)", rates), rates
    rc, js, err = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "-n", "12", "--nothink", "--json")
    r = json.loads(js)
    assert out == tok.decode(r["generated_ids"]) + "\n"
    assert r["prompt_ids"][-1] == tok.encode("</think>")[0] and r["think"] is False
    assert r["reasoning"] is None and r["answer"] == r["text"]  # --nothink: no reasoning to split off


def test_a_thinking_answer_is_split_at_the_end_of_its_reasoning():
    from ds4tui.commands.generate import _split_reasoning

    assert _split_reasoning("why</think>```py\nx\n```", True) == {"reasoning": "why", "answer": "```py\nx\n```"}
    assert _split_reasoning("still thinking", True) == {"reasoning": None, "answer": "still thinking"}
    assert _split_reasoning("a</think>b", False) == {"reasoning": None, "answer": "a</think>b"}  # --raw / --nothink


@pytest.mark.parametrize("extra, message", [
    (["--system", "Be brief."], "--system applies to the chat template, which --raw leaves out: leave out --raw, or "
                                "--system (with --raw, write a system text into the prompt)"),
    (["--nothink"], "--nothink applies to the chat template, which --raw leaves out: leave out --raw, or --nothink"),
    (["--nothink", "--system", "S"], "--system and --nothink apply to the chat template, which --raw leaves out: leave "
                                     "out --raw, or --system --nothink (with --raw, write a system text into the prompt)"),
])
def test_raw_with_template_options_is_a_usage_error(extra, message, tmp_path, capsys):
    """--raw --system S ran the prompt without the system text, and said nothing."""
    rc, out, err = _gen(capsys, str(tmp_path / "unread.gguf"), "-p", "hi", "--raw", *extra)
    assert (rc, out, err) == (2, "", f"ds4tui generate: error: {message}\n")  # before the model is opened


def test_raw_skips_the_template_and_sampling_is_seeded(tiny_q2, tok, capsys):
    base = [tiny_q2["model"], "-p", "def reverse(head):", "-n", "10", "--raw", "--json", "--temp", "0.9",
            "--top-p", "0.95"]
    runs = []
    for seed in ("1", "1", "2"):
        rc, out, err = _gen(capsys, *base, "--seed", seed)
        assert rc == 0, err
        runs.append(json.loads(out))
    assert runs[0]["prompt_ids"] == tok.encode("def reverse(head):")
    assert runs[0]["generated_ids"] == runs[1]["generated_ids"]
    assert runs[0]["generated_ids"] != runs[2]["generated_ids"]
    assert runs[0]["sampling"] == {"temperature": 0.9, "top_k": 0, "top_p": 0.95, "min_p": 0.0, "seed": 1}


def test_sampling_flags_without_a_temperature_are_said_to_have_no_effect(tiny_q2, capsys):
    """Greedy decoding reads none of --top-k/--top-p/--min-p/--seed: given away from their defaults
    without --temp, a note says so (and the tokens are greedy's); with --temp, no note."""
    base = [tiny_q2["model"], "-p", "def reverse(head):", "-n", "6", "--raw", "--json"]
    rc, out, err = _gen(capsys, *base)
    assert rc == 0 and "no effect at --temp 0" not in err
    greedy = json.loads(out)["generated_ids"]
    rc, out, err = _gen(capsys, *base, "--top-k", "5", "--min-p", "0.25", "--seed", "4")
    assert rc == 0 and json.loads(out)["generated_ids"] == greedy
    assert ("ds4tui generate: note: --top-k 5, --min-p 0.25 and --seed 4 have no effect at --temp 0: greedy "
            "decoding (the default) takes the most likely token (give --temp > 0 to sample)\n") in err
    rc, out, err = _gen(capsys, *base, "--top-p", "0.5", "--temp", "0")
    assert rc == 0 and "note: --top-p 0.5 has no effect at --temp 0" in err
    rc, out, err = _gen(capsys, *base, "--top-k", "5", "--temp", "0.8")
    assert rc == 0 and "no effect at --temp 0" not in err


def test_errors_are_one_line_and_exit_1(tiny_q2, tmp_path, capsys, monkeypatch):
    rc, out, err = _gen(capsys, str(tmp_path / "missing.gguf"), "-p", "hi")
    assert rc == 1 and "missing.gguf" in err and err.count("\n") == 1
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "--ctx", "5")
    assert rc == 2 and "argument --ctx: expected at least" in err and "found 5" in err
    monkeypatch.setenv("DS4TUI_GPU_LIB", str(tmp_path / "no-gpu-library.so"))  # also on a machine with a GPU
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "--backend", "hip", "--json")
    assert rc == 1 and json.loads(out)["ok"] is False
    assert (f"--backend hip: the GPU backend (--backend hip) is unavailable: GPU library {tmp_path / 'no-gpu-library.so'}: "
            f"no such file") in err
    # an empty prompt is a usage error with and without the chat template, before the model is opened
    for argv, where in ((["-p", "", "--raw"], "argument --prompt"), (["-p", ""], "argument --prompt"),
                        (["-f", str(tmp_path / "empty.txt")], f"argument --file: {tmp_path / 'empty.txt'}")):
        (tmp_path / "empty.txt").write_text("")
        rc, out, err = _gen(capsys, str(tmp_path / "missing.gguf"), *argv)
        assert (rc, out, err) == (2, "", f"ds4tui generate: error: {where}: the prompt is empty: give the text to "
                                         f"answer (-p TEXT, or -f FILE)\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b" \n")))
    rc, out, err = _gen(capsys, str(tmp_path / "missing.gguf"), "-f", "-", "--json")
    message = "argument --file: <stdin>: the prompt is empty (only whitespace): give the text to answer (-p TEXT, or -f FILE)"
    assert (rc, err) == (2, f"ds4tui generate: error: {message}\n") and json.loads(out) == {"ok": False, "error": message}
    with pytest.raises(SystemExit) as e:  # a bad flag: one line naming it, status 2, before anything loads
        _gen(capsys, tiny_q2["model"], "-p", "x", "--top-p", "0")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("ds4tui generate: error: argument --top-p: expected a number in (0, 1]")


def test_a_full_context_stops_generation_cleanly(tiny_q2, tok, capsys):
    n_prompt = len(render_chat(tok, [{"role": "user", "content": "hi"}], think=True))
    ctx = n_prompt + 3
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "hi", "-n", "50", "--ctx", str(ctx), "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["stop"] == "ctx" and len(r["generated_ids"]) == 4  # 3 run + the last one emitted, not run
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "hi", "-n", "50", "--ctx", str(ctx))
    assert rc == 0 and "context of" in err and "full" in err


def test_bad_text_and_unwritable_output(tiny_q2, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc\xff")
    rc, out, err = _gen(capsys, tiny_q2["model"], "-f", str(bad))
    assert (rc, err) == (1, f"ds4tui generate: error: {bad}: not UTF-8 text (invalid start byte at byte 3) (argument "
                            f"-f/--file: expected a text file with the prompt in UTF-8; convert it first, e.g. iconv "
                            f"-f CP1252 -t UTF-8)\n")  # it named neither the flag nor what to do
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "ab\udcff")
    assert rc == 1 and "--prompt: not UTF-8 text" in err



def test_a_closed_standard_output_is_one_line_before_anything_loads(tiny_q2, capsys, monkeypatch):
    """With stdout closed (>&-) Python leaves sys.stdout None: generate wrote the answer into it and
    ended in an AttributeError traceback; now it says so and where to send the answer, exit 1."""
    monkeypatch.setattr("sys.stdout", None)
    rc = cli_main(["generate", tiny_q2["model"], "-p", PROMPT, "-n", "4", "--json"])
    err = capsys.readouterr().err
    assert (rc, err) == (1, "ds4tui generate: error: standard output is closed (>&-): the answer has nowhere to go; "
                            "redirect it instead, e.g. > answer.txt (or > /dev/null to time a run)\n")


# ---- DSpark ------------------------------------------------------------------------------------

def _mtp(tiny_q2, *extra: str) -> list[str]:
    return [tiny_q2["model"], "-p", PROMPT, "-n", "24", "--threads", "2", "--mtp", tiny_q2["support"], *extra]


def test_a_file_that_is_not_what_its_argument_wants_names_the_argument(tiny_q2, tmp_path, capsys):
    """A MODEL or --mtp file that opens but is not a GGUF: the error names the file, what it found, the
    argument and what to do, as for a path that does not open (check_model_path / check_support_path)."""
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"junk")
    found = f"{junk}: not a GGUF file: 4 bytes beginning b'junk' (a GGUF begins with b'GGUF')"
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "hi", "-n", "1", "--mtp", str(junk))
    assert rc == 1 and err == (f"ds4tui generate: error: {found} (argument --mtp: expected a DSpark support GGUF; "
                               f"check the path)\n"), err
    rc, out, err = _gen(capsys, str(junk), "-p", "hi", "-n", "1", "--json")
    assert rc == 1 and json.loads(out)["error"] == (f"{found} (argument MODEL: expected a DS4 model GGUF; check the "
                                                    f"path, or leave MODEL out for the bundled demo model)")


def _stats(r: dict) -> DSparkStats:
    return DSparkStats.from_dict(r["dspark_stats"])


def test_mtp_turns_dspark_on_and_json_reports_it(tiny_q2, capsys):
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "-n", "24", "--threads", "2", "--json")
    assert rc == 0, err
    plain = json.loads(out)
    assert plain["support"]["status"] == "none" and plain["dspark"] is None and plain["dspark_stats"] is None
    assert plain["from_draft"] == [False] * 24

    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "--no-scheduler", "--json"))
    assert rc == 0, err
    r = json.loads(out)
    assert r["support"]["status"] == "attached" and r["support"]["block_size"] == 5
    assert r["support"]["path"] == tiny_q2["support"]
    assert r["dspark"] == {"enabled": True, "scheduler": False, "threshold": 0.0, "max_draft": 5,
                           "policy": "confidence"}
    st = _stats(r)
    assert st.check_invariants() == [] and r["dspark_stats"]["invariant_violations"] == []
    # Without the scheduler every cycle with room drafts: only the budget's tail may stop it.
    assert st.proposed > 0 and set(k for k, v in st.no_draft_reasons.items() if v) <= {"no_room"}
    assert r["stop"] == "max_tokens" and len(r["from_draft"]) == len(r["generated_ids"]) == 24
    assert sum(r["from_draft"]) == st.accepted_draft
    assert r["generated_ids"] == plain["generated_ids"]  # greedy: drafting changes the speed, not the tokens
    line = parse_line(r["dspark_line"])
    assert r["dspark_line"].startswith("DSpark stats ")
    assert (line["cycles"], line["proposed"], line["accepted_draft"]) == (st.cycles, st.proposed, st.accepted_draft)
    assert r["dspark_events"] and r["dspark_events"][-1]["knobs"] == r["dspark"]

    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "--dspark", "--json"))
    assert rc == 0, err
    on = json.loads(out)
    assert on["dspark"]["enabled"] and on["dspark"]["scheduler"]  # the default knobs
    assert _stats(on).check_invariants() == [] and sum(on["from_draft"]) == _stats(on).accepted_draft
    assert on["generated_ids"] == plain["generated_ids"]

    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "--no-dspark", "--json"))
    assert rc == 0, err
    off = json.loads(out)
    assert off["dspark"]["enabled"] is False and off["generated_ids"] == plain["generated_ids"]
    st = _stats(off)
    assert st.proposed == 0 and st.no_draft_reasons["disabled"] == st.cycles > 0 and not any(off["from_draft"])


def test_knobs_and_the_stats_line_on_stderr(tiny_q2, capsys, monkeypatch):
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "--confidence", "0.25", "--max-draft", "2", "--scheduler-policy",
                                      "acceptance", "--json"))
    assert rc == 0, err
    r = json.loads(out)
    assert r["dspark"]["threshold"] == pytest.approx(0.25) and r["dspark"]["max_draft"] == 2
    assert r["dspark"]["policy"] == "acceptance"
    assert max(k for k, c in enumerate(r["dspark_stats"]["draft_len_hist"]) if c) <= 2
    assert _stats(r).check_invariants() == []

    monkeypatch.delenv("DS4_DSPARK_STATS", raising=False)
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8"))
    assert rc == 0, err
    assert err.count("DSpark stats") == 1 and err.splitlines()[-1].startswith("DSpark stats cycles=")
    monkeypatch.setenv("DS4_DSPARK_STATS", "1")  # closing the session prints it: still once
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8"))
    assert rc == 0 and err.count("DSpark stats") == 1
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--json"))
    assert rc == 0 and err.count("DSpark stats") == 1 and json.loads(out)["ok"]
    monkeypatch.delenv("DS4_DSPARK_STATS")
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-dspark"))
    assert rc == 0 and "DSpark stats" not in err  # the user turned it off: nothing to report


def test_knobs_with_no_dspark_are_noted_as_having_no_effect(tiny_q2, capsys):
    """--no-scheduler (or another knob) with --no-dspark is valid but moot: one note on stderr says
    so (with --json too), the run goes on target-only, and nothing is noted without --no-dspark."""
    note = ("ds4tui generate: note: --no-scheduler has no effect because --no-dspark turns drafting off (every "
            "cycle decodes target-only; leave out --no-dspark to draft)\n")
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-dspark", "--no-scheduler", "--json"))
    assert rc == 0, err
    r = json.loads(out)
    assert err.count(note) == 1 and err.count("no effect") == 1
    assert r["dspark"]["enabled"] is False and _stats(r).proposed == 0
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-dspark", "--no-scheduler"))
    assert rc == 0 and err.startswith(note), err
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-dspark", "--no-scheduler", "--scheduler-policy",
                                      "acceptance", "--confidence", "0.5", "--max-draft", "2", "--json"))
    assert rc == 0 and ("ds4tui generate: note: --no-scheduler, --scheduler-policy, --confidence and --max-draft have "
                        "no effect because --no-dspark turns drafting off") in err
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-scheduler", "--scheduler-policy", "acceptance",
                                      "--json"))
    assert rc == 0 and ("ds4tui generate: note: --scheduler-policy has no effect because --no-scheduler turns the "
                        "scheduler off") in err and json.loads(out)["dspark"]["policy"] == "acceptance"
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-dspark", "--draft-vocab", "full", "--json"))
    assert rc == 0 and ("ds4tui generate: note: --draft-vocab has no effect because --no-dspark turns drafting "
                        "off") in err and err.count("no effect") == 1
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-scheduler", "--json"))
    assert rc == 0 and "no effect" not in err
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-dspark", "--draft-vocab", "auto", "--json"))
    assert rc == 0 and "no effect" not in err
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-dspark", "--json"))
    assert rc == 0 and "no effect" not in err


def test_scheduler_prices_with_no_dspark_are_noted_as_having_no_effect(tiny_q2, capsys):
    """--scheduler-prices fresh or engine with --no-dspark changes nothing (no scheduler decides a
    draft): the same note as the other knobs, in the same sentence.  saved, the default, is not noted:
    the run keeps its plain decode's time in the prices file for later runs to start from."""
    end = " no effect because --no-dspark turns drafting off (every cycle decodes target-only; leave out --no-dspark to draft)\n"
    for mode in ("fresh", "engine"):
        rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-dspark", "--scheduler-prices", mode, "--json"))
        assert rc == 0, err
        assert err.count("ds4tui generate: note: --scheduler-prices has" + end) == 1 and err.count("no effect") == 1
        r = json.loads(out)  # the JSON as before: the mode run, drafting off
        assert r["scheduler_prices"] == mode and r["dspark"]["enabled"] is False and _stats(r).proposed == 0
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-dspark", "--confidence", "0.5",
                                      "--scheduler-prices", "fresh"))
    assert rc == 0 and err.startswith("ds4tui generate: note: --confidence and --scheduler-prices have" + end), err
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--no-dspark", "--scheduler-prices", "saved", "--json"))
    r = json.loads(out)
    assert rc == 0 and "no effect" not in err and r["scheduler_prices"] == "saved"
    with open(r["scheduler_prices_file"]) as f:  # what saved did: the decode's time, kept
        assert json.load(f)["prices"]["t_ver_ms"]["1"] > 0
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "-n", "8", "--scheduler-prices", "fresh", "--json"))
    assert rc == 0 and "no effect" not in err  # drafting on: the scheduler starts fresh


def test_refused_support_warns_and_runs_target_only(tiny_q2, tmp_path, capsys):
    bad = mtm.write_support(tmp_path / "experts8.gguf", mtm.tiny_config(), 0, types="f16", n_expert=8)
    base = [tiny_q2["model"], "-p", PROMPT, "-n", "8", "--threads", "2"]
    rc, out, err = _gen(capsys, *base, "--json")
    plain = json.loads(out)
    rc, out, err = _gen(capsys, *base, "--json", "--mtp", str(bad))
    assert rc == 0, err
    warning = next(line for line in err.splitlines() if "warning:" in line)  # after auto's backend note
    assert warning.startswith("ds4tui generate: warning: DSpark support model refused, continuing target-only")
    assert str(bad) in warning and "support has 8 experts" in warning and "expert_count = 16" in warning
    if "more problem" in warning:  # the command to list them names the real files, not a placeholder
        assert f"`ds4tui inspect {tiny_q2['model']} --mtp {bad}` lists them)" in warning
    r = json.loads(out)
    assert r["support"]["status"] == "refused" and "support has 8 experts" in r["support"]["message"]
    assert r["generated_ids"] == plain["generated_ids"] and not any(r["from_draft"])
    st = _stats(r)
    assert st.proposed == 0 and st.no_draft_reasons["support_invalid"] == st.cycles > 0
    assert st.check_invariants() == []
    rc, out, err = _gen(capsys, *base, "--mtp", str(bad))
    assert rc == 0 and "warning: DSpark support model refused" in err
    assert "no_draft_reasons=support_invalid:" in err.splitlines()[-1]  # the line says why nothing drafted


def test_dspark_option_errors(tiny_q2, capsys):
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "hi", "--dspark")
    assert rc == 2 and out == ""
    assert err.strip() == ("ds4tui generate: error: --dspark needs a DSpark support model: add --mtp SUPPORT.gguf "
                           "(DSpark is then on by default), or leave out --dspark")
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "hi", "--max-draft", "2", "--json")
    assert rc == 2 and "--max-draft needs a DSpark support model" in json.loads(out)["error"]
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "hi", "--scheduler-policy", "acceptance", "--json")
    assert rc == 2 and "--scheduler-policy needs a DSpark support model" in json.loads(out)["error"]
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "--max-draft", "6"))  # checked before the model loads
    assert rc == 2 and err == (f"ds4tui generate: error: argument --max-draft: expected 1..5 (the block size of "
                               f"{tiny_q2['support']}), found 6; give --max-draft 1..5, or leave it out for drafts "
                               f"of up to the block size\n")
    rc, out, err = _gen(capsys, *_mtp(tiny_q2, "--backend", "reference"))
    assert rc == 2 and err == ("ds4tui generate: error: --mtp needs a backend that drafts, found --backend reference "
                               "(the numpy oracle does not draft): use --backend auto, cpu or hip\n")
    with pytest.raises(SystemExit) as exc:
        cli_main(["generate", tiny_q2["model"], "-p", "hi", "--confidence", "1.5"])
    assert exc.value.code == 2 and "expected a number in [0, 1], found 1.5" in capsys.readouterr().err


def test_every_command_defaults_to_auto_and_says_what_it_chose(tiny_q2, capsys):
    from ds4tui.cli import build_parser

    for argv in (["generate", "-p", "x"], ["bench", "m.gguf"], ["chat"]):
        assert build_parser().parse_args(argv).backend == "auto", argv
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "-n", "4", "--json")
    assert rc == 0, err
    r = json.loads(out)
    # the GPU when it answers, else the CPU; the choice and why on stderr
    assert (r["backend"] == "cpu" and re.search(r"ds4tui generate: no usable GPU \(.+\): running on the CPU \(`ds4tui "
                                                r"doctor` says why in full\)\n", err)
            and r["backend_detail"].startswith("the GPU backend (") and " is unavailable: " in r["backend_detail"]) \
        or (r["backend"] == "hip" and "(chosen by auto)" in err and r["backend_detail"] == ""), err
    # q8 runs on either backend (spec ds4.md §2.9.5): auto chooses as without it
    rc, out2, err2 = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "-n", "4", "--json", "--activations", "q8")
    r2 = json.loads(out2)
    assert rc == 0 and (r2["backend"], r2["activations"]) == (r["backend"], "q8") and "q8" not in err2


def test_a_character_cut_by_n_is_not_printed_as_a_replacement():
    import codecs

    from ds4tui.commands.generate import utf8_tail

    d = codecs.getincrementaldecoder("utf-8")(errors="replace")
    assert d.decode("ok é".encode()[:-1]) == "ok " and utf8_tail(d) == ""  # the first byte of é: dropped
    d = codecs.getincrementaldecoder("utf-8")(errors="replace")
    assert d.decode("ok é".encode()) == "ok é" and utf8_tail(d) == ""


def test_n_beyond_the_context_is_capped_with_a_note(tiny_q2, tok, tmp_path, capsys):
    from gguf import GGUFValueType

    from gguf_edit import rewrite

    n_prompt = len(render_chat(tok, [{"role": "user", "content": "hi"}], think=True))
    limit = n_prompt + 6
    small = rewrite(tiny_q2["model"], tmp_path / "ctx.gguf",
                    set_keys={"deepseek4.context_length": (limit, GGUFValueType.UINT32, None)})
    rc, out, err = _gen(capsys, str(small), "-p", "hi", "-n", "2000000", "--json", "--backend", "cpu")
    assert rc == 0, err
    assert (f"ds4tui generate: note: -n 2000000 capped to 6: the prompt's {n_prompt} tokens + 6 fill the model's "
            f"context length {limit} (the context is sized prompt + -n)\n") in err
    r = json.loads(out)
    assert r["n_predict"] == 6 and r["n_ctx"] == limit
    rc, out, err = _gen(capsys, str(small), "-p", "hi", "-n", "3", "--json", "--backend", "cpu")
    assert rc == 0 and "capped" not in err and json.loads(out)["n_ctx"] == n_prompt + 3


def test_gpu_options_the_cpu_does_not_apply_are_noted_and_in_the_json(tiny_q2, capsys, monkeypatch):
    from ds4tui.engine import gpu

    monkeypatch.setattr(gpu, "probe", lambda library=None: (None, "no device: a test without a GPU"))
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "hi", "-n", "2", "--json", "--prefill-gemm", "bf16")
    assert rc == 0, err
    assert ("ds4tui generate: note: --prefill-gemm bf16 does not apply, prefill_gemm is off: the cpu backend keeps "
            "float32 products\n") in err
    r = json.loads(out)
    assert r["backend"] == "cpu" and r["prefill_gemm"] == "off"
    assert r["prefill_gemm_note"] == "off: the cpu backend keeps float32 products"
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "hi", "-n", "2", "--json", "--gpu-graphs", "on",
                        "--prefill-gemm", "bf16")
    assert rc == 0, err
    assert ("ds4tui generate: note: --gpu-graphs on does not apply, graphs are off: the cpu backend launches no "
            "kernels\n") in err and "--prefill-gemm bf16 does not apply" in err
    r = json.loads(out)
    assert r["gpu_graphs"] == "off" and r["gpu_graphs_note"] == "off: the cpu backend launches no kernels"


def test_gpu_graphs_flag_reaches_the_engine_and_the_json(tiny_q2, capsys, monkeypatch):
    """Spec platform.md §8: --gpu-graphs on reaches the engine; on the cpu backend (auto without a
    device) it is off, and the JSON says why."""
    from ds4tui.engine import gpu

    monkeypatch.setattr(gpu, "probe", lambda library=None: (None, "no device: a test without a GPU"))
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "hi", "-n", "2", "--json", "--gpu-graphs", "on")
    assert rc == 0, err
    r = json.loads(out)
    assert r["backend"] == "cpu" and r["gpu_graphs"] == "off"
    assert r["gpu_graphs_note"] == "off: the cpu backend launches no kernels"


def _interrupt_generate(monkeypatch, second_press: bool) -> None:
    """Ctrl-C during generate's fourth decode cycle and, with second_press, again while the session
    closes (the impatient second press)."""
    from ds4tui.commands import generate as G
    from ds4tui.engine import session as S

    class Interrupted(G.DecodeLoop):
        def __iter__(self):
            for i, cycle in enumerate(super().__iter__()):
                if i == 3:
                    raise KeyboardInterrupt  # Ctrl-C during the fourth cycle
                yield cycle

    monkeypatch.setattr(G, "DecodeLoop", Interrupted)
    if second_press:
        close = S.Session.close

        def close_then_interrupted(self):
            close(self)
            raise KeyboardInterrupt

        monkeypatch.setattr(S.Session, "close", close_then_interrupted)


@pytest.mark.parametrize("second_press", [False, True])
def test_an_interrupted_generate_says_interrupted_once(second_press, tiny_q2, capsys, monkeypatch):
    """Ctrl-C while decoding keeps what was printed, exits 130 and says "interrupted" once; a second
    Ctrl-C while the session is closed (the impatient second press) does not say it again."""
    _interrupt_generate(monkeypatch, second_press)
    rc, out, err = _gen(capsys, str(tiny_q2["model"]), "-p", "hi", "-n", "40", "--threads", "1", "--backend", "cpu")
    assert rc == 130 and err.count("interrupted") == 1 and err.endswith("ds4tui: interrupted\n"), err
    assert out.strip() and "decode " in err  # what was printed stays, and the rates line follows it


@pytest.mark.parametrize("second_press", [False, True])
def test_an_interrupted_generate_json_is_marked_as_every_interrupted_result(second_press, tiny_q2, tmp_path, capsys,
                                                                           monkeypatch):
    """Ctrl-C during the fourth cycle of `generate --json`: one JSON object with what was generated,
    marked "ok": false, "interrupted": true as an interrupted bench result is (a second Ctrl-C while
    the session closes adds no second object); compare refuses it, naming it."""
    _interrupt_generate(monkeypatch, second_press)
    rc, out, err = _gen(capsys, str(tiny_q2["model"]), "-p", "hi", "-n", "40", "--threads", "1", "--backend", "cpu",
                        "--json")
    assert rc == 130 and err.endswith("ds4tui: interrupted\n"), err
    assert out.count("\n") == 1  # one object
    r = json.loads(out)
    n = len(r["generated_ids"])
    assert 3 <= n < 40
    assert (r["ok"], r["interrupted"], r["stop"]) == (False, True, "interrupted")
    assert r["error"] == f"interrupted after {n} of the 40 tokens asked (-n)"
    assert list(r)[:3] == ["ok", "interrupted", "error"]
    saved = tmp_path / "interrupted.json"
    saved.write_text(out)
    assert cli_main(["compare", str(saved), str(saved)]) == 1
    assert capsys.readouterr().err.startswith(f"ds4tui compare: error: {saved}: an interrupted `generate` run "
                                              f"(interrupted after {n} of the 40 tokens asked (-n))")


def test_generate_json_interrupted_in_the_prefill_or_the_load_still_prints_its_object(tiny_q2, capsys, monkeypatch):
    """Ctrl-C in the prefill: the object says no token was generated; Ctrl-C while the model is read
    (before generate has anything of its own): the command line prints the same mark."""
    from ds4tui.commands import generate as G
    from ds4tui.engine import session as S

    def prefill(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(S.Session, "prefill", prefill)
    argv = (str(tiny_q2["model"]), "-p", "hi", "--raw", "-n", "5", "--threads", "1", "--backend", "cpu", "--json")
    rc, out, err = _gen(capsys, *argv)
    r = json.loads(out)
    assert rc == 130 and (r["ok"], r["interrupted"], r["generated_ids"]) == (False, True, [])
    assert r["error"] == f"interrupted during the prefill of {len(r['prompt_ids'])} prompt tokens; no token generated"

    def model(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(G, "DS4Model", model)
    rc, out, err = _gen(capsys, *argv)
    assert rc == 130 and err == "ds4tui: interrupted\n"
    assert json.loads(out) == {"ok": False, "interrupted": True,
                               "error": "interrupted before ds4tui generate had a result", "command": "generate"}


def test_an_interrupted_generate_reports_the_tokens_its_statistics_count(tiny_q2, fitted_support, capsys,
                                                                          monkeypatch):
    """Ctrl-C while a cycle is shown leaves the rest of the engine's batch run (up to 256 tokens at
    once) and counted in the DSpark statistics: the answer carries it too, so its ids and the
    statistics cover the same tokens (as in a run that ends by itself)."""
    from ds4tui.commands import generate as G

    argv = (str(tiny_q2["model"]), "--mtp", str(fitted_support), "-p", PROMPT, "-n", "60", "--threads", "1",
            "--backend", "cpu", "--no-scheduler", "--json")

    def counted(r):
        st = r["dspark_stats"]
        return st["cycles"] + st["accepted_draft"]

    rc, out, err = _gen(capsys, *argv)
    assert rc == 0, err
    whole = json.loads(out)
    lag = len(whole["generated_ids"]) - counted(whole)  # the first token comes from the prefill

    class Interrupted(G.DecodeLoop):
        def __iter__(self):
            self.batch_s = 60.0  # the second batch runs every cycle left, whatever the machine's speed
            for i, cycle in enumerate(super().__iter__()):
                yield cycle
                if i == 2:
                    raise KeyboardInterrupt  # Ctrl-C while the second batch's second cycle is shown

    monkeypatch.setattr(G, "DecodeLoop", Interrupted)
    rc, out, err = _gen(capsys, *argv)
    assert rc == 130, err
    r = json.loads(out)
    assert r["stop"] == "interrupted"
    assert 3 < len(r["generated_ids"]) and r["generated_ids"] == whole["generated_ids"][:len(r["generated_ids"])]
    assert len(r["generated_ids"]) - counted(r) == lag


def test_an_interrupt_as_a_native_batch_returns_keeps_the_batch(tiny_q2, fitted_support, tok, capsys, monkeypatch):
    """Ctrl-C during a native batch is raised as the engine call returns, before its ids are read:
    the batch ran and is counted, so the ids, the text and the counters still cover it (each batch is
    one cycle here, the fourth interrupted)."""
    from ds4tui.commands import generate as G
    from ds4tui.engine import backend as B

    argv = (str(tiny_q2["model"]), "--mtp", str(fitted_support), "-p", PROMPT, "-n", "60", "--threads", "1",
            "--backend", "cpu", "--no-scheduler", "--json")
    rc, out, err = _gen(capsys, *argv)
    assert rc == 0, err
    whole = json.loads(out)
    ran = []  # the ids each native batch emitted

    class InterruptedAfterTheFourthBatch:
        def __init__(self, lib):
            self._lib = lib

        def __getattr__(self, name):
            return getattr(self._lib, name)

        def ds4_session_step_many(self, *args):
            rc = self._lib.ds4_session_step_many(*args)
            out, lens, n = args[1], args[7], args[8][0]
            ran.append([int(out[i]) for i in range(sum(lens[k] for k in range(n)))])
            if len(ran) == 4:
                raise KeyboardInterrupt  # the signal that came during the call
            return rc

    init = B.NativeBackend.__init__

    def interrupted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._lib = InterruptedAfterTheFourthBatch(self._lib)

    class OneCycleABatch(G.DecodeLoop):
        def __iter__(self):
            self.batch_s = 1e-9  # each batch ends after its first cycle
            return super().__iter__()

    monkeypatch.setattr(B.NativeBackend, "__init__", interrupted_init)
    monkeypatch.setattr(G, "DecodeLoop", OneCycleABatch)
    rc, out, err = _gen(capsys, *argv)
    assert rc == 130 and err.endswith("ds4tui: interrupted\n"), err
    r = json.loads(out)
    ids = r["generated_ids"]
    assert len(ran) == 4 and ids == [t for batch in ran for t in batch] == whole["generated_ids"][:len(ids)]
    assert len(ran[3]) >= 1 and r["stop"] == "interrupted"
    assert r["error"] == f"interrupted after {len(ids)} of the 60 tokens asked (-n)"
    assert len(ids) == r["stats"]["n_decode_tokens"]
    st = r["dspark_stats"]
    assert st["cycles"] == 3 and st["cycles"] + st["accepted_draft"] == len(ids) - len(ran[0])
    assert len(r["from_draft"]) == len(ids) and r["text"] == tok.decode(t for t in ids if t != tok.eos_id)


class UnbufferedStdout(io.RawIOBase):
    """The file beneath stdout under PYTHONUNBUFFERED=1 (no buffer between the text layer and it),
    read through a pipe that a Ctrl-C cuts: the first write longer than ``at`` bytes takes ``at``
    of them and a SIGINT comes meanwhile.  ``stream``: the text stream over it, as Python makes it."""

    def __init__(self, at: int):
        self.at, self.data, self.cut = at, bytearray(), False
        self.stream = io.TextIOWrapper(self, encoding="utf-8", write_through=True)

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        n = len(b)
        if not self.cut and n > self.at:
            self.cut, n = True, self.at
        self.data += bytes(b[:n])
        if n == self.at:
            signal.raise_signal(signal.SIGINT)
        return n


def test_a_second_ctrl_c_while_the_json_is_written_leaves_it_whole(tiny_q2, capsys, monkeypatch):
    """Ctrl-C while decoding, then again while the interrupted result is written to an unbuffered
    stdout: the write the second one cuts short is continued, and stdout holds one whole object."""
    from ds4tui.commands import generate as G

    class Interrupted(G.DecodeLoop):
        def __iter__(self):
            for i, cycle in enumerate(super().__iter__()):
                if i == 3:
                    signal.raise_signal(signal.SIGINT)  # the first Ctrl-C, during the fourth cycle
                yield cycle

    monkeypatch.setattr(G, "DecodeLoop", Interrupted)
    stdout = UnbufferedStdout(at=1000)
    monkeypatch.setattr(sys, "stdout", stdout.stream)
    # a process started with SIGINT ignored (a background job, nohup) keeps ignoring it, as a shell
    # does: the test takes Python's own handler, as a terminal's foreground process has it
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc = cli_main(["generate", str(tiny_q2["model"]), "-p", "hi", "-n", "40", "--threads", "1", "--backend", "cpu",
                       "--json"])
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert rc == 130 and err.endswith("ds4tui: interrupted\n"), err
    assert stdout.cut and len(stdout.data) > 1000 and stdout.data.count(b"\n") == 1
    r = json.loads(stdout.data)
    assert (r["interrupted"], r["stop"]) == (True, "interrupted")
    assert r["error"] == f"interrupted after {len(r['generated_ids'])} of the 40 tokens asked (-n)"


def test_a_result_goes_out_whole_before_a_first_ctrl_c_that_comes_meanwhile(monkeypatch):
    """print_whole writes every command's result: a first Ctrl-C that cuts its write short waits
    until the whole text is out (a pipe takes 64 KiB at a time), and is raised then."""
    from ds4tui import interrupts

    text = json.dumps({"ok": True, "generated_ids": list(range(20000))})
    stdout = UnbufferedStdout(at=65536)
    monkeypatch.setattr(sys, "stdout", stdout.stream)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupts.interrupt_on_signals():
            with pytest.raises(KeyboardInterrupt):
                interrupts.print_whole(text)
            assert stdout.cut and len(text) > 65536 and stdout.data == (text + "\n").encode()
            assert interrupts.signals_seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_rates_line_counts_one_token_in_the_singular():
    """`-n 1` (or a one-token prompt with --raw) read "generated 1 tokens"."""
    from ds4tui.commands import generate as G

    assert G.rates_line(1, 0.5, 2.0, 1, None) == ("prefill 1 token: 0.50 s, 2.0 tokens/s; generated 1 token, decode "
                                                  "— (fewer than 2 tokens)")
    assert G.rates_line(25, 0.01, 2500.0, 26, 338.72) == ("prefill 25 tokens: 0.01 s, 2500.0 tokens/s; generated 26 "
                                                         "tokens, decode 338.7 tokens/s")


@pytest.mark.parametrize("command", ["tokenize", "inspect", "doctor", "compare", "draft-vocab"])
def test_every_json_result_is_written_whole(command, tiny_q2, tmp_path, capsys, monkeypatch):
    """tokenize, inspect, doctor, compare and draft-vocab write their --json result through
    print_whole, as generate and bench do, so a Ctrl-C during the write cannot cut it."""
    import importlib
    import shutil

    if command == "compare":  # two results to compare: a short generate run and its copy
        assert cli_main(["generate", str(tiny_q2["model"]), "-p", "hello", "-n", "4", "--threads", "2",
                         "--backend", "cpu", "--json"]) == 0
        (tmp_path / "a.json").write_text(capsys.readouterr().out)
        shutil.copyfile(tmp_path / "a.json", tmp_path / "b.json")
    if command == "draft-vocab":
        (tmp_path / "src").mkdir()
        (tmp_path / "src" / "a.py").write_text("def f(x):\n    return x + x\n")
    module = importlib.import_module(f"ds4tui.commands.{command.replace('-', '_')}")
    written = []
    monkeypatch.setattr(module, "print_whole", written.append)
    argv = {"tokenize": ["tokenize", str(tiny_q2["model"]), "--text", "hello", "--json"],
            "inspect": ["inspect", str(tiny_q2["model"]), "--json"],
            "doctor": ["doctor", "--json"],
            "compare": ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"],
            "draft-vocab": ["draft-vocab", str(tiny_q2["model"]), str(tiny_q2["support"]), "--from",
                            str(tmp_path / "src"), "--size", "8", "--out", str(tmp_path / "s.gguf"), "--json"]}[command]
    rc = cli_main(argv)
    assert rc in (0, 1) and capsys.readouterr().out == "" and len(written) == 1
    assert isinstance(json.loads(written[0]), dict)
