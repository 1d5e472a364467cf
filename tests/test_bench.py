"""``ds4tui bench``: real measurements on the tiny model, the bytes-per-token figure recomputed from
the tensor table, error handling, and the --medium cache (with a stand-in builder: the real medium
model takes minutes to build)."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from ds4tui.cli import main as cli_main
from ds4tui.commands import bench
from ds4tui.devtools import make_test_model as mtm
from ds4tui.engine.gguf_model import DS4Model

# 12 prompt tokens, then 5 timed decode steps at positions 12..16, i.e. contexts 13..17: mean 15.
PROMPT, DECODE, MEAN_CTX = 12, 5, 15


def _independent_bytes_per_token(path: str) -> tuple[int, int]:
    """Bytes one decoded token reads in the tiny model at context 15, summed from TensorInfo.nbytes.

    Every tensor once, except: one row of the embedding and of the hash-routing table, 6 of the 16
    experts (per-expert slice × 6), and no indexer scoring weights (15 // 4 = 3 compressed rows is
    fewer than top-8, so the indexer does not score).  KV (f32 rows of head_dim 128 = 512 B):
    6 layers × 15 raw rows (window 16); CSA layers 2 and 4: 15 // 4 = 3 rows each; HCA layers 3
    and 5: 15 // 16 = 0 rows."""
    weights = 0
    for name, t in DS4Model(path).tensors.items():
        if name == "token_embd.weight" or name.endswith("tid2eid.weight"):
            weights += t.nbytes // t.shape[0]
        elif "_exps." in name:
            weights += t.nbytes // t.shape[0] * 6
        elif name.endswith(("indexer.attn_q_b.weight", "indexer.proj.weight")):
            pass
        else:
            weights += t.nbytes
    kv = 6 * 15 * 512 + 2 * 3 * 512
    return weights, kv


def _bench(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli_main(["bench", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_bench_json_measures_the_tiny_model(tiny_q2, tmp_path, capsys):
    out_file = tmp_path / "bench.json"
    rc, out, err = _bench(capsys, tiny_q2["model"], "--prompt-tokens", str(PROMPT), "--decode-tokens", str(DECODE),
                          "--threads", "2", "--json", "--out", str(out_file))
    assert rc == 0, err
    r = json.loads(out)
    assert json.loads(out_file.read_text()) == r
    for key in ("ok", "timestamp", "model", "backend", "numerics", "n_threads", "prompt_tokens", "decode_tokens",
                "ctx", "prefill_tokens_per_s", "decode_tokens_per_s", "bytes_per_token", "effective_gb_per_s",
                "memcpy_gb_per_s", "bandwidth_ratio", "memcpy", "memory", "machine", "runs"):
        assert key in r, key
    assert r["ok"] is True and r["backend"] == "cpu" and r["numerics"] == "ds4" and r["n_threads"] == 2
    assert (r["prompt_tokens"], r["decode_tokens"], r["ctx"], r["prompt"]) == (PROMPT, DECODE, PROMPT + DECODE + 1,
                                                                              "text")
    assert r["model"]["path"] == tiny_q2["model"] and r["model"]["medium"] is False
    assert r["model"]["file_bytes"] == os.path.getsize(tiny_q2["model"])
    assert r["prefill_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0
    run = r["runs"][0]
    assert run["prefill_tokens_per_s"] == pytest.approx(PROMPT / run["prefill_seconds"])
    assert run["decode_tokens_per_s"] == pytest.approx(DECODE / run["decode_seconds"])

    weights, kv = _independent_bytes_per_token(tiny_q2["model"])
    assert r["bytes_per_token_detail"] == {"weights": weights, "kv": kv, "at_ctx": MEAN_CTX}
    assert r["bytes_per_token"] == weights + kv

    assert r["effective_gb_per_s"] == pytest.approx(r["bytes_per_token"] * r["decode_tokens_per_s"] / 1e9)
    assert r["memcpy_gb_per_s"] > 0
    assert r["memcpy"]["buffer_bytes"] >= 256 << 20 and r["memcpy"]["n_threads"] == 2
    assert r["bandwidth_ratio"] == pytest.approx(r["effective_gb_per_s"] / r["memcpy_gb_per_s"])

    m = r["memory"]
    assert m["total"] == m["weights"] + m["kv"] + m["compressor"] + m["scratch"] + m["device"]
    assert m["weights"] > 0 and m["kv"] > 0
    assert r["machine"]["cpu_count"] == os.cpu_count() and r["machine"]["platform"]
    assert datetime.datetime.fromisoformat(r["timestamp"]).tzinfo is not None


def test_bench_text_table_reference_backend_and_repeat(tiny_q2, capsys):
    rc, out, err = _bench(capsys, tiny_q2["model"], "--backend", "reference", "--numerics", "transformers",
                          "--prompt-tokens", "6", "--decode-tokens", "2", "--repeat", "2", "--ctx", "32")
    assert rc == 0, err
    lines = out.splitlines()
    labels = [line.split()[0] for line in lines]
    assert labels == ["model", "engine", "machine", "memory", "prefill", "decode", "bytes/token", "effective",
                      "memcpy", "ratio"]
    width = len("bytes/token")  # labels padded to the longest one: the values start in one column
    assert all(line[:width].rstrip() == label and line[width:width + 2] == "  " and line[width + 2:].strip()
               for line, label in zip(lines, labels))
    assert "reference backend, transformers numerics, 1 threads, context 32" in out
    assert "fastest of 2 runs" in out
    assert float(lines[4].split()[1]) > 0 and float(lines[5].split()[1]) > 0


def test_missing_model_file_is_one_line_and_status_1(tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    rc, out, err = _bench(capsys, str(missing))
    assert rc == 1 and out == ""
    assert err.splitlines() == [f"ds4tui bench: error: {missing}: no such file"]
    rc, out, err = _bench(capsys, str(missing), "--json")
    assert rc == 1 and json.loads(out) == {"ok": False, "error": f"{missing}: no such file",
                                           "error_type": "ModelFileError"}


def test_not_a_gguf_is_one_line_and_status_1(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(60))
    rc, out, err = _bench(capsys, str(bad))
    assert rc == 1 and len(err.splitlines()) == 1
    assert err.startswith(f"ds4tui bench: error: {bad}: wrong magic")


@pytest.mark.parametrize("argv, message", [
    ([], "one of the arguments MODEL --medium is required"),
    (["model.gguf", "--medium"], "argument --medium: not allowed with argument MODEL"),
    (["model.gguf", "--decode-tokens", "0"], "argument --decode-tokens: expected a positive integer, found 0"),
    (["model.gguf", "--threads", "-1"], "argument --threads: expected a thread count >= 0 (0 = one per core), found -1"),
])
def test_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_ctx_too_small_and_bad_out_folder(tiny_q2, tmp_path, capsys):
    rc, _, err = _bench(capsys, tiny_q2["model"], "--prompt-tokens", "8", "--decode-tokens", "4", "--ctx", "12")
    assert rc == 1
    assert err.strip() == "ds4tui bench: error: --ctx 12 is too small: 8 prompt + 4 decode tokens need 13"
    rc, _, err = _bench(capsys, tiny_q2["model"], "--out", str(tmp_path / "no" / "such" / "r.json"))
    assert rc == 1 and "cannot write the --out file" in err


def test_interrupt_during_decode_exits_130(tiny_q2, capsys, monkeypatch):
    # Decoding 100000 tokens would take most of an hour: the SIGINT (Ctrl-C) below must cut it short.
    # It is sent once decoding has started (a fixed delay could land while the tokenizer is built,
    # where a slow machine would spend it).
    from ds4tui.engine import session as S

    decoding = threading.Event()
    real_step = S.Session.step

    def step(self):
        decoding.set()
        return real_step(self)

    monkeypatch.setattr(S.Session, "step", step)
    # A shell starts background jobs with SIGINT ignored, and Python then keeps it ignored: install
    # Python's own handler for this test so that it behaves as at a terminal.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=lambda: decoding.wait(60) and os.kill(os.getpid(), signal.SIGINT), daemon=True)
    t0 = time.perf_counter()
    sender.start()
    try:
        rc, out, err = _bench(capsys, tiny_q2["model"], "--prompt-tokens", "4", "--decode-tokens", "100000")
    finally:
        signal.signal(signal.SIGINT, previous)
    sender.join(5)
    assert rc == 130 and out == ""
    assert err.strip().endswith("ds4tui: interrupted")
    assert time.perf_counter() - t0 < 60


# ---- --medium ----------------------------------------------------------------------------------

def test_medium_config_is_the_specified_size():
    c = mtm.CONFIGS["medium"]()
    assert (c.n_embd, c.n_layer, c.n_expert, c.n_expert_used) == (1024, 8, 64, 6)
    assert c.n_embd % 256 == 0
    assert bench.MEDIUM_RECIPE == {"config": "medium", "seed": 0, "types": "q2"}


@pytest.fixture
def fake_medium_build(tiny_q2, tmp_path, monkeypatch):
    """XDG_CACHE_HOME in tmp_path and a stand-in for make_test_model.make that links the tiny model
    (and a dummy hf/ checkpoint) into the build folder; ``calls`` records each build folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls: list[Path] = []

    def fake_make(outdir, *, config, seed, types, quiet):
        assert (config, seed, types, quiet) == ("medium", 0, "q2", False)
        out = Path(outdir)
        calls.append(out)
        (out / "hf").mkdir(parents=True)
        (out / "hf" / "model.safetensors").write_bytes(b"x" * 100)
        try:
            os.link(tiny_q2["model"], out / "model.gguf")
        except OSError:
            shutil.copyfile(tiny_q2["model"], out / "model.gguf")
        return {"hf": str(out / "hf"), "model": str(out / "model.gguf"), "support": str(out / "support.gguf")}

    monkeypatch.setattr(mtm, "make", fake_make)
    return calls


def test_medium_builds_once_then_reuses_the_cache(fake_medium_build, tmp_path, capsys):
    folder = tmp_path / "cache" / "ds4tui" / "bench-medium"
    argv = ("--medium", "--prompt-tokens", "4", "--decode-tokens", "2", "--json")
    rc, out, err = _bench(capsys, *argv)
    assert rc == 0, err
    assert "building the medium model (hidden 1024, 8 layers, 64 experts, q2)" in err and "ready in" in err
    r = json.loads(out)
    assert r["model"]["path"] == str(folder / "model.gguf") and r["model"]["medium"] is True
    assert len(fake_medium_build) == 1
    assert not (folder / "hf").exists()  # the f32 checkpoint is dropped
    marker = json.loads((folder / bench.MEDIUM_MARKER).read_text())
    assert marker["model_bytes"] == (folder / "model.gguf").stat().st_size
    assert marker["recipe"]["model_config"]["n_embd"] == 1024

    rc, out, err = _bench(capsys, *argv)
    assert rc == 0 and "building" not in err
    assert len(fake_medium_build) == 1  # reused

    (folder / bench.MEDIUM_MARKER).unlink()  # an unfinished build: no marker → rebuilt
    rc, out, err = _bench(capsys, *argv)
    assert rc == 0 and len(fake_medium_build) == 2
    assert sorted(p.name for p in folder.parent.iterdir()) == ["bench-medium"]  # no partial folders left


def test_medium_build_interrupted_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def interrupted_make(outdir, **kw):
        (Path(outdir) / "model.gguf").write_bytes(b"GGUF partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(mtm, "make", interrupted_make)
    rc, out, err = _bench(capsys, "--medium")
    assert rc == 130 and err.strip().endswith("ds4tui: interrupted")
    assert list((tmp_path / "cache" / "ds4tui").iterdir()) == []
