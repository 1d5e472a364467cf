"""``ds4tui generate``: greedy tokens equal the numpy reference's, the prompt is the chat template
(or the raw text), the streamed text is the decoded ids, and bad requests are clear errors."""

from __future__ import annotations

import json

import pytest

from ds4tui.cli import main as cli_main
from ds4tui.engine import reference as R
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
    assert m["total"] == m["weights"] + m["kv"] + m["compressor"] + m["scratch"] + m["device"] and m["kv"] > 0


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
    rc, js, err = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "-n", "12", "--nothink", "--json")
    r = json.loads(js)
    assert out == tok.decode(r["generated_ids"]) + "\n"
    assert r["prompt_ids"][-1] == tok.encode("</think>")[0] and r["think"] is False


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


def test_errors_are_one_line_and_exit_1(tiny_q2, tmp_path, capsys):
    rc, out, err = _gen(capsys, str(tmp_path / "missing.gguf"), "-p", "hi")
    assert rc == 1 and "missing.gguf" in err and err.count("\n") == 1
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "--ctx", "5")
    assert rc == 1 and "raise --ctx" in err
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", PROMPT, "--backend", "hip", "--json")
    assert rc == 1 and "HIP" in err and json.loads(out)["ok"] is False
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "", "--raw")
    assert rc == 1 and "empty" in err
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "x", "--top-p", "0")
    assert rc == 1 and "top_p" in err


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
    assert rc == 1 and "bad.txt: not UTF-8 text" in err
    rc, out, err = _gen(capsys, tiny_q2["model"], "-p", "ab\udcff")
    assert rc == 1 and "--prompt: not UTF-8 text" in err
