"""The demo pair's corpus builder (tools/demo_corpus.py), evaluation (tools/eval_demo.py) and packer
(tools/pack_demo.py): their pure parts."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


corpus = _load("demo_corpus")
evaluation = _load("eval_demo")
packer = _load("pack_demo")
engine_cont = _load("engine_continuations")


@pytest.mark.parametrize("sentence,want", [
    ("Return the sum of the items", "returns the sum of the items"),
    ("Apply f to every item", "applies f to every item"),
    ("Fetch a page", "fetches a page"),
    ("Pass the value on", "passes the value on"),
    ("Converts bytes to text", "converts bytes to text"),
    ("Go to the next line", "goes to the next line"),
    ("Play it", "plays it"),
])
def test_third_person(sentence, want):
    assert corpus.third_person(sentence) == want


@pytest.mark.parametrize("licence,ok", [
    ("MIT", True), ("BSD-3-Clause", True), ("Apache-2.0 OR BSD-2-Clause", True), ("BSD License", True),
    ("Apache Software License", True), ("PSF-2.0", True),
    ("MPL-2.0", False), ("GPL-3.0-or-later", False), ("", False),
    ("Public Domain / BSD License / GNU General Public License (GPL)", False),
])
def test_only_permissive_licences_pass(licence, ok):
    assert corpus.is_permissive(licence) is ok


def test_function_samples_cycle_through_three_phrasings():
    src = ('def add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n\n'
           'def neg(x):\n    """Negate x."""\n    return -x\n\n'
           'def fetch(url):\n    """Fetch a page."""\n    return url\n')
    got = corpus.function_samples(src, "m")
    assert [r for r, _, _ in got] == [
        "Write a Python function `add(a, b)` for the `m` module: Return the sum of a and b.",
        "Write a Python function that negates x.",
        "Write a Python function `fetch(url)` that fetches a page."]
    assert got[0][2] == '```python\ndef add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n```'


def test_function_samples_keep_functions_up_to_the_line_limit():
    short = 'def add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n\n'
    long = 'def walk(x):\n    """Walk x."""\n' + "".join(f"    x = x + {i}\n" for i in range(6)) + "    return x\n"
    src = short + long  # 3 and 9 lines
    assert [a.splitlines()[1] for _, _, a in corpus.function_samples(src, "m")] == ["def add(a, b):", "def walk(x):"]
    assert [a.splitlines()[1] for _, _, a in corpus.function_samples(src, "m", max_lines=8)] == ["def add(a, b):"]
    assert [a.splitlines()[1] for _, _, a in corpus.function_samples(src, "m", max_lines=9)] == ["def add(a, b):",
                                                                                                 "def walk(x):"]


def test_compact_split_reads_back_the_same_ids(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"train": rng.integers(0, 129280, 5000).astype(np.uint32),
              "heldout": rng.integers(0, 129280, 300).astype(np.uint32)}
    corpus.save_compact(tmp_path, arrays)
    for name, arr in arrays.items():
        got = corpus.load_split(tmp_path, name)
        assert got.dtype == np.uint32 and np.array_equal(got, arr)
    with pytest.raises(FileNotFoundError, match="other.u16.xz"):
        corpus.load_split(tmp_path, "other")


def test_engine_continuations_are_the_reference_greedy_picks(tiny_q2, fitted_support, tmp_path):
    """tools/engine_continuations.py writes windows of the training split drawn with its seed, each
    followed by the greedy picks of the numpy reference backend (the oracle), made here by greedy
    DSpark on the CPU engine in a worker process, in the file train_demo.py --continuations reads."""
    from ds4tui.engine.session import Engine

    train = np.random.default_rng(3).integers(100, 120000, 4000)
    np.save(tmp_path / "train.npy", train)
    out = tmp_path / "c.npz.xz"
    args = [str(tiny_q2["model"]), str(tmp_path), str(out), "--sequences", "3", "--prompt-tokens", "12",
            "--new-tokens", "6", "--workers", "1", "--seed", "7", "--save-every", "2"]
    assert engine_cont.main(args + ["--support", str(fitted_support)]) == 0
    sha = hashlib.sha256(Path(tiny_q2["model"]).read_bytes()).hexdigest()
    ids, metas = corpus.load_continuations([out], target_sha256=sha, prompt_tokens=12, new_tokens=6)
    assert metas[0]["seed"] == 7 and ids.shape == (3, 18)
    assert np.array_equal(ids[:, :12], engine_cont.prompts(train, 3, 12, 7))
    ref = Engine(tiny_q2["model"], backend="reference")
    for row in ids:
        with ref.session(64) as s:
            assert [int(t) for t in row[12:]] == list(s.generate([int(t) for t in row[:12]], max_tokens=6))
    with pytest.raises(SystemExit) as exc:
        engine_cont.main(args[:1] + [str(tmp_path / "none")] + args[2:])
    assert exc.value.code == 2


def test_continuations_read_back_and_refuse_another_target(tmp_path):
    rng = np.random.default_rng(1)
    a, b = (rng.integers(0, 129280, (n, 12)) for n in (5, 3))
    kw = {"target_sha256": "ab" * 32, "prompt_tokens": 8, "new_tokens": 4}
    meta = corpus.save_continuations(tmp_path / "a.npz.xz", a, seed=0, **kw)
    assert meta == {"format": corpus.CONTINUATIONS_FORMAT, "seed": 0, "sequences": 5, **kw}
    corpus.save_continuations(tmp_path / "b.npz.xz", b, seed=4, **kw)
    ids, metas = corpus.load_continuations([tmp_path / "a.npz.xz", tmp_path / "b.npz.xz"], **kw)
    assert ids.dtype == np.int32 and np.array_equal(ids, np.concatenate((a, b)))
    assert [m["seed"] for m in metas] == [0, 4]
    with pytest.raises(ValueError, match=r"a.npz.xz: continuations made with target_sha256 'abab.*this run has 'cd"):
        corpus.load_continuations([tmp_path / "a.npz.xz"], **{**kw, "target_sha256": "cd" * 32})
    with pytest.raises(ValueError, match="made with new_tokens 4, this run has 5"):
        corpus.load_continuations([tmp_path / "a.npz.xz"], **{**kw, "new_tokens": 5})
    with pytest.raises(ValueError, match="b.npz.xz: its prompts were chosen with seed 4, as those of .*b.npz.xz"):
        corpus.load_continuations([tmp_path / "b.npz.xz", tmp_path / "b.npz.xz"], **kw)
    (tmp_path / "c.npz.xz").write_bytes(b"not xz")
    with pytest.raises(ValueError, match="c.npz.xz: not a continuations file"):
        corpus.load_continuations([tmp_path / "c.npz.xz"], **kw)
    with pytest.raises(ValueError, match=r"absent.npz.xz: cannot read the continuations file"):
        corpus.load_continuations([tmp_path / "absent.npz.xz"], **kw)
    with pytest.raises(ValueError, match=r"expected ids of shape \[S >= 1, 12\] .*found \[5, 11\]"):
        corpus.save_continuations(tmp_path / "d.npz.xz", a[:, :11], seed=0, **kw)
    with pytest.raises(ValueError, match=r"found \[0, 12\]"):
        corpus.save_continuations(tmp_path / "d.npz.xz", a[:0], seed=0, **kw)
    for bad, found in ((a * 0.5, "float64"), (a - 200000, "ids -"), (a + 129280, r"ids \d+\.\.")):
        with pytest.raises(ValueError, match=f"expected integer token ids in 0..129279, found {found}"):
            corpus.save_continuations(tmp_path / "d.npz.xz", bad, seed=0, **kw)
    assert not (tmp_path / "d.npz.xz").exists()
    # more distinct ids than uint16 codes hold: wider codes, the same ids back (a str path too)
    wide = np.arange(70000 * 12, dtype=np.int64).reshape(70000, 12) % 100000
    corpus.save_continuations(str(tmp_path / "w.npz.xz"), wide, seed=1, **kw)
    assert np.array_equal(corpus.load_continuations([str(tmp_path / "w.npz.xz")], **kw)[0], wide)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def _verdict(fenced=True, parses=True, compiles=True, statements=1, repeats=1, ok=None):
    return {"fenced": fenced, "parses": parses, "compiles": compiles, "statements": statements, "repeats": repeats,
            "ok": compiles and statements > 0 and repeats <= 3 if ok is None else ok}


NO_FENCE = _verdict(fenced=False, parses=False, compiles=False, statements=0, repeats=0)


@pytest.mark.parametrize("answer,want", [
    ("Here:\n```python\ndef f(x):\n    return x\n```\n", _verdict()),
    ("```python\ndef f(x):\n    return (x\n```", _verdict(parses=False, compiles=False, statements=0)),
    ("```python\ndef f(x):\n" + "    x = 1\n" * 4 + "```", _verdict(repeats=4)),
    # the parser lets these through, compile() does not: a parameter named twice, a return outside a function
    ("```python\ndef f(k, k):\n    return k\n```", _verdict(compiles=False)),
    ("```python\nreturn 1\n```", _verdict(compiles=False)),
    # no code: an empty block, comments only
    ("```python\n```", _verdict(statements=0, repeats=0)),
    ("```python\n# a comment\n```", _verdict(statements=0)),
    # nesting deeper than the parser's recursion: not valid here, and a verdict instead of RecursionError
    ("```python\nx = " + "-" * 3000 + "1\n```", _verdict(parses=False, compiles=False, statements=0)),
    # other spellings of the fence: py, python3, any case, CRLF line ends, a space after the language
    ("```py\ndef f(x):\n    return x\n```", _verdict()),
    ("```Python3 \r\ndef f(x):\r\n    return x\r\n```", _verdict()),
    ("```python\ndef f(x):\n    return x\n", NO_FENCE),
    ("def f(x):\n    return x\n", NO_FENCE),
    ("```\ndef f(x):\n    return x\n```", NO_FENCE),  # no language: not a Python block
])
def test_judge(answer, want):
    assert evaluation.judge(answer) == want


def test_eval_refuses_a_held_out_split_too_short_for_it(tiny_q2, tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    np.save(folder / "heldout.npy", np.arange(50, dtype=np.int32))
    assert evaluation.main([str(tiny_q2["model"]), str(tiny_q2["support"]), str(folder)]) == 1
    err = capsys.readouterr().err
    assert f"{folder}: its held-out split holds 50 tokens; this evaluation needs at least 514" in err
    assert "Traceback" not in err


def test_twenty_function_prompts():
    assert len(evaluation.FUNCTION_PROMPTS) == 20 == len(set(evaluation.FUNCTION_PROMPTS))
    assert all(p.startswith("Write a Python function that ") for p in evaluation.FUNCTION_PROMPTS)


def _run(sha: str, tag: str, **extra) -> dict:
    """A drafter-only train_demo.py log: drafter ``tag`` trained against the model with ``sha``."""
    return {"target_from_gguf": {"sha256": sha}, "drafter": {"steps": tag}, "distill": {"sequences": tag},
            "check": {"drafter_anchor_40": tag}, "args": {"tag": tag}, "total_seconds": 10.0, **extra}


def test_drafter_runs_chain_in_the_shipped_log():
    first = {"drafter": {"steps": "first"}, "distill": {"sequences": "first"}, "total_seconds": 100.0,
             "check": {"model.gguf": "m", "drafter_anchor_40": "first"}, "target": "t"}
    two = packer.merge_drafter_run(first, _run("abc", "second"), "abc")
    assert two["drafter_first"] == {"steps": "first"} and two["distill_first"] == {"sequences": "first"}
    assert two["drafter"] == {"steps": "second"} and "drafter_earlier" not in two
    assert two["check"] == {"model.gguf": "m", "drafter_anchor_40": "second"} and two["total_seconds"] == 110.0
    three = packer.merge_drafter_run(two, _run("abc", "third", drafter_heal={"steps": 5}, drafter_exported={"x": 1}),
                                     "abc")
    assert three["drafter_first"] == {"steps": "first"} and three["target"] == "t"
    assert three["drafter"] == {"steps": "third"} and three["distill"] == {"sequences": "third"}
    assert three["drafter_heal"] == {"steps": 5} and three["drafter_exported"] == {"x": 1}
    assert three["drafter_earlier"] == [{"drafter": {"steps": "second"}, "distill": {"sequences": "second"},
                                         "drafter_run": {"args": {"tag": "second"},
                                                         "target_from_gguf": {"sha256": "abc"},
                                                         "total_seconds": 10.0}}]
    assert three["drafter_run"]["args"] == {"tag": "third"} and three["total_seconds"] == 120.0
    four = packer.merge_drafter_run(three, _run("abc", "fourth"), "abc")
    assert [e["drafter"]["steps"] for e in four["drafter_earlier"]] == ["second", "third"]
    assert four["drafter_earlier"][1]["drafter_heal"] == {"steps": 5} and "drafter_heal" not in four
    with pytest.raises(ValueError, match="sha256 abc, not this model.gguf \\(def\\)"):
        packer.merge_drafter_run(three, _run("abc", "x"), "def")


def _pair(model: str, support: str) -> dict:
    """A packed pair's demo.json with the measurements that keep_earlier_runs copies."""
    return {"files": {"model.gguf": {"sha256": model, "bytes": 1}, "support.gguf": {"sha256": support, "bytes": 2}},
            "heldout_perplexity_gguf": {"perplexity": 29.18},
            "eval": {"acceptance_heldout_code": {"tokens_per_cycle": 2.434},
                     "function_prompts": {"ok": 8, "per_prompt": [{"prompt": "p"}]}}}


def test_target_init_runs_chain_in_the_shipped_log():
    shipped = {"target": {"steps": 825}, "total_seconds": 946.0, "drafter_earlier": [{"drafter": "second"}]}
    run = {"target_init": {"sha256": "m1"}, "drafter_init": {"sha256": "s1"}, "target": {"steps": 492},
           "total_seconds": 437.7}
    two = packer.keep_earlier_runs(run, shipped, _pair("m1", "s1"))
    assert two["target"] == {"steps": 492} and two["total_seconds"] == 437.7 and "drafter_earlier" not in two
    assert two["earlier_runs"] == [{
        "files": _pair("m1", "s1")["files"], "target": {"steps": 825}, "total_seconds": 946.0,
        "drafter_earlier": [{"drafter": "second"}],
        "measured": {"heldout_perplexity_gguf": {"perplexity": 29.18},
                     "eval": {"acceptance_heldout_code": {"tokens_per_cycle": 2.434}, "function_prompts": {"ok": 8}}}}]
    three = packer.keep_earlier_runs({**run, "target_init": {"sha256": "m2"}, "drafter_init": {"sha256": "s2"}},
                                     two, _pair("m2", "s2"))
    assert [e["target"]["steps"] for e in three["earlier_runs"]] == [825, 492]
    assert "earlier_runs" not in three["earlier_runs"][1] and three["earlier_runs"][1]["files"]["model.gguf"]["sha256"] == "m2"
    with pytest.raises(ValueError, match="target_init has sha256 m1, not the earlier pair's model.gguf \\(m2\\)"):
        packer.keep_earlier_runs(run, two, _pair("m2", "s1"))
    with pytest.raises(ValueError, match="drafter_init has sha256 s1, not the earlier pair's support.gguf \\(s2\\)"):
        packer.keep_earlier_runs(run, two, _pair("m1", "s2"))
    with pytest.raises(ValueError, match="has no target_init"):
        packer.keep_earlier_runs({"target": {}}, shipped, _pair("m1", "s1"))


@pytest.mark.parametrize("args,message", [
    (["--target-gguf", "m.gguf", "--target-init", "m.gguf"], "--target-gguf and --target-init both name the target"),
    (["--target-init", "m.gguf", "--resume-target", "t.pt"], "--target-init and --resume-target both name the target"),
    (["--drafter-init", "s.gguf"], "--drafter-init needs the target it was trained for"),
    (["--target-init", "absent.gguf"], "--target-init absent.gguf: no such file"),
    (["--continuations", "c.npz.xz"], "--continuations needs the target as a file: add --target-gguf"),
    (["--target-init", "m.gguf", "--save-continuations"], "--save-continuations needs the target as a file"),
    (["--target-gguf", "m.gguf", "--continuations", "c.npz.xz"], "--continuations c.npz.xz: cannot read"),
    (["--target-gguf", "m.gguf", "--save-continuations", "--continuations", "c.npz.xz"],
     "--save-continuations and --continuations: a run that trains on saved continuations makes none to save"),
])
def test_train_demo_refuses_target_flags_that_do_not_fit(args, message, tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    trainer = _load("train_demo")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(SystemExit) as e:
        trainer.main(["corpus", "out", *args])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_summary_docstring_answers_cut_the_docstring_before_the_line_limit():
    doc = '    """Return the sum of a and b.\n\n    Examples\n    ========\n\n    >>> add(1, 2)\n    3\n    """\n'
    src = ("def add(a, b):\n" + doc + "    return a + b\n\n"
           'def ask(x):\n    """Is x set?\n\n    More.\n    """\n    return x\n\n'
           'def quoted(x):\n    """Return "x".\n\n    More.\n    """\n    return x\n\n'
           'def oneline(x): """Return x."""; return x\n')
    full = corpus.function_samples(src, "m", max_lines=5)
    assert [a.splitlines()[1] for _, _, a in full] == ["def oneline(x): \"\"\"Return x.\"\"\"; return x"]
    got = corpus.function_samples(src, "m", max_lines=5, docstring="summary")
    assert [a for _, _, a in got] == [
        '```python\ndef add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n```',
        '```python\ndef ask(x):\n    """Is x set?"""\n    return x\n```']
    with pytest.raises(ValueError, match="docstring must be"):
        corpus.function_samples(src, "m", docstring="short")


def test_chat_copies_repeat_training_chats_only(tmp_path):
    one = corpus.build(tmp_path / "one", max_files=3, answer_docstring="summary")
    three = corpus.build(tmp_path / "three", max_files=3, answer_docstring="summary", chat_copies=3)
    t1, t3 = np.load(tmp_path / "one" / "train.npy"), np.load(tmp_path / "three" / "train.npy")
    assert np.array_equal(t3[:t1.size], t1)
    chats = one["splits"]["train"]["chat_samples"]
    assert chats > 0 and three["splits"]["train"]["chat_samples_repeated"] == 2 * chats
    assert three["chat_copies"] == 3 and one["chat_copies"] == 1
    # the tail is the chat samples twice over: as many chat-turn starts as two more sets of samples
    from ds4tui.engine.tokenizer import Tokenizer, default_tokenizer_json
    user = Tokenizer.from_tokenizer_json(default_tokenizer_json()).encode("<｜User｜>", parse_special=True)
    assert len(user) == 1
    assert np.count_nonzero(t3[t1.size:] == user[0]) == 2 * np.count_nonzero(t1 == user[0])
    assert np.array_equal(np.load(tmp_path / "one" / "heldout.npy"), np.load(tmp_path / "three" / "heldout.npy"))
    with pytest.raises(ValueError, match="chat_copies"):
        corpus.build(tmp_path / "zero", max_files=1, chat_copies=0)
