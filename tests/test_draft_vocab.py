"""The draft vocabulary (spec dspark.md §2.6): the drafter proposes from a list of token ids.

Oracles: the numpy reference drafter with the same list (same proposals, acceptance and
confidences), target-only greedy decoding (the output never changes: the target verifies every
draft over the whole vocabulary) and the list itself (no draft outside it, greedy or sampled).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType

from ds4tui.engine import draft_vocab as DV
from ds4tui.engine import reference as R
from ds4tui.engine import session as S
from ds4tui.engine.gguf_model import SupportModel
from gguf_edit import rewrite
from test_dspark_engine import PROMPTS, _run

N = 120


def _half(n_vocab: int, seed: int = 7) -> list[int]:
    """A random half of the vocabulary, in no particular order."""
    return np.random.default_rng(seed).permutation(n_vocab)[: n_vocab // 2].tolist()


def _greedy_list(tiny_q2, fitted_support, n_prompts: int = 3) -> list[int]:
    """The tokens target-only greedy decoding emits on the first prompts: a list that holds every
    token a perfect drafter would propose there."""
    e = S.Engine(tiny_q2["model"])
    seen: list[int] = []
    for p in PROMPTS[:n_prompts]:
        seen += _run(e, p, N)[0]
    return list(dict.fromkeys(seen))


def test_engine_drafts_match_the_reference_with_a_list(tiny_q2):
    """With a draft vocabulary the engine's proposals, acceptance and confidences are the numpy
    reference drafter's with the same list (argmax over the listed tokens, ties to the lowest id)."""
    prompt, n = PROMPTS[0], 24
    ids = _half(129280)
    e = S.Engine(tiny_q2["model"], support=tiny_q2["support"], draft_vocab=ids)
    assert e.support_status == "attached", e.support_message
    assert e.draft_vocab == len(ids)
    s = e.session(len(prompt) + n + 24)
    s.set_dspark(scheduler=False)
    s.prefill(prompt)
    out = s.step()
    cycles = []
    while len(out) < n + 12:
        r = s.step()
        cycles.append((len(r) - 1, *s.last_proposal()))
        out += r
    ref = R.ReferenceModel(tiny_q2["model"])
    res = R.speculative_generate(ref, R.ReferenceDrafter(ref, tiny_q2["support"], draft_vocab=ids), prompt, n)
    assert out[:n] == res.tokens
    listed = set(ids)
    compared, emitted = 0, 1
    for (acc, drafts, conf), rc in zip(cycles, res.cycles):
        if n - emitted < 5:
            break
        emitted += 1 + rc.accepted
        assert acc == rc.accepted
        assert drafts == rc.proposed[: len(drafts)] and len(drafts) >= 1
        assert set(drafts) <= listed
        np.testing.assert_allclose(conf, rc.confidence[: len(conf)], atol=1e-3)
        compared += 1
    assert compared > 10
    # and the list changed the drafts: the full-vocabulary reference proposes tokens outside it
    full = R.speculative_generate(ref, R.ReferenceDrafter(ref, tiny_q2["support"]), prompt, n)
    assert any(t not in listed for c in full.cycles for t in c.proposed)


def test_greedy_output_is_unchanged_and_drafts_stay_in_the_list(tiny_q2, fitted_support):
    """A list that holds what greedy decoding emits keeps the fitted drafter's acceptance; any list
    keeps the output token for token."""
    plain = S.Engine(tiny_q2["model"])
    want = [_run(plain, p, N)[0] for p in PROMPTS[:3]]
    good = _greedy_list(tiny_q2, fitted_support)
    full = S.Engine(tiny_q2["model"], support=fitted_support, draft_vocab="full")
    listed = S.Engine(tiny_q2["model"], support=fitted_support, draft_vocab=good)
    assert full.draft_vocab == 0 and listed.draft_vocab == len(good)
    acc = {}
    for name, e in (("full", full), ("listed", listed)):
        acc[name] = 0
        for p, w in zip(PROMPTS[:3], want):
            got, st, drafted = _run(e, p, N, scheduler=False)
            assert got == w, name
            assert st.check_invariants() == []
            acc[name] += st.accepted_draft
    # every token greedy emits is listed, so a draft the full drafter got right is listed too
    assert acc["listed"] >= acc["full"] > 0, acc


def test_sampled_drafts_come_from_the_list(tiny_q2, fitted_support):
    """At temperature > 0 the drafter draws from its distribution over the listed tokens only
    (every other token has probability 0), and acceptance sampling stays consistent."""
    ids = _greedy_list(tiny_q2, fitted_support)[:40]
    e = S.Engine(tiny_q2["model"], support=fitted_support, draft_vocab=ids)
    listed, drafted = set(ids), 0
    for seed in range(3):
        s = e.session(256)
        s.set_dspark(scheduler=False)
        s.set_sampling(S.SamplingParams(temperature=1.0, top_k=3, seed=seed))
        s.prefill(PROMPTS[seed])
        for _ in range(40):
            s.step()
            drafts, _ = s.last_proposal()
            assert set(drafts) <= listed
            drafted += len(drafts)
        assert s.dspark_stats().check_invariants() == []
        s.close()
    assert drafted > 0


def test_bad_lists_are_refused_by_name(tiny_q2):
    V = 129280
    with pytest.raises(DV.DraftVocabError, match="outside the vocabulary 0..129279"):
        S.Engine(tiny_q2["model"], support=tiny_q2["support"], draft_vocab=[5, V])
    with pytest.raises(DV.DraftVocabError, match="token id 5 is listed twice"):
        S.Engine(tiny_q2["model"], support=tiny_q2["support"], draft_vocab=[5, 9, 5])
    with pytest.raises(DV.DraftVocabError, match="a count must be >= 1"):
        S.Engine(tiny_q2["model"], support=tiny_q2["support"], draft_vocab=0)
    with pytest.raises(DV.DraftVocabError, match="expected auto, full or a count"):
        S.Engine(tiny_q2["model"], support=tiny_q2["support"], draft_vocab="most")
    # a count needs a list in the support file
    with pytest.raises(DV.DraftVocabError, match=r"has no draft vocabulary \(metadata key 'ds4tui.draft_vocab'\)"):
        S.Engine(tiny_q2["model"], support=tiny_q2["support"], draft_vocab=100)


def test_the_support_files_list_chooses_under_auto(tiny_q2, tmp_path):
    """auto takes the file's list, a count its first N, full none; a list that cannot be used is
    named under auto (full then) and refused under a count."""
    ranked = [int(i) for i in _half(129280)[:300]]
    path = tmp_path / "support_vd.gguf"
    DV.write_list(tiny_q2["support"], path, ranked, n_vocab=129280)
    e = S.Engine(tiny_q2["model"], support=path)
    assert e.draft_vocab == 300 and "the support file's list" in e.draft_vocab_note
    e = S.Engine(tiny_q2["model"], support=path, draft_vocab=50)
    assert e.draft_vocab == 50
    sm = SupportModel(path, e.config)
    assert DV.resolve(50, sm, 129280)[0] == ranked[:50]
    assert sm.summary()["draft_vocab"] == {"key": DV.KEY, "size": 300, "problem": None}  # what inspect shows
    assert SupportModel(tiny_q2["support"], e.config).summary()["draft_vocab"] is None
    assert S.Engine(tiny_q2["model"], support=path, draft_vocab="full").draft_vocab == 0
    assert DV.resolve("auto", sm, 129280) == (ranked, "auto: 300 of 129280 tokens, the support file's list")
    with pytest.raises(DV.DraftVocabError, match="lists 300 tokens; choose at most 300"):
        S.Engine(tiny_q2["model"], support=path, draft_vocab=301)
    plain = S.Engine(tiny_q2["model"], support=tiny_q2["support"])
    assert plain.draft_vocab == 0 and "has no draft vocabulary" in plain.draft_vocab_note
    bad = tmp_path / "support_bad.gguf"
    rewrite(tiny_q2["support"], bad, set_keys={DV.KEY: ([3, 3], GGUFValueType.ARRAY, GGUFValueType.UINT32)})
    e = S.Engine(tiny_q2["model"], support=bad)
    assert e.draft_vocab == 0 and "token id 3 is listed twice; ignored" in e.draft_vocab_note
    assert SupportModel(bad, e.config).summary()["draft_vocab"]["problem"] == "token id 3 is listed twice"
    with pytest.raises(DV.DraftVocabError, match="token id 3 is listed twice"):
        S.Engine(tiny_q2["model"], support=bad, draft_vocab=2)


def test_rank_tokens_counts_and_puts_the_always_ids_first():
    ranked = DV.rank_tokens([[5, 5, 7, 9], [7, 5, 2]], 10, always=[9, 1])
    # 9 and 1 first (1 never occurs), then 5 (3x), 7 (2x), 2 and 9's other occurrence by id
    assert ranked == [9, 1, 5, 7, 2]
    with pytest.raises(DV.DraftVocabError, match="outside 0..9"):
        DV.rank_tokens([[10]], 10)


def test_write_list_keeps_every_tensor_and_key(tiny_q2, tmp_path):
    """The copy differs from the support file only by the list; a bad list writes nothing."""
    from ds4tui.engine.gguf_model import field_value, open_gguf

    out = DV.write_list(tiny_q2["support"], tmp_path / "s.gguf", [7, 3, 11], n_vocab=129280)
    a, b = open_gguf(tiny_q2["support"]), open_gguf(out)
    assert [int(i) for i in field_value(b.fields[DV.KEY])] == [7, 3, 11]
    keys = lambda r: {k for k in r.fields if not k.startswith("GGUF.")}
    assert keys(b) == keys(a) | {DV.KEY}
    for k in keys(a):
        assert np.array_equal(np.asarray(field_value(a.fields[k]), dtype=object),
                              np.asarray(field_value(b.fields[k]), dtype=object)), k
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for ta, tb in zip(a.tensors, b.tensors):
        assert ta.tensor_type == tb.tensor_type and list(ta.shape) == list(tb.shape)
        assert np.array_equal(np.asarray(ta.data).view(np.uint8), np.asarray(tb.data).view(np.uint8)), ta.name
    with pytest.raises(DV.DraftVocabError, match="token id 3 is listed twice"):
        DV.write_list(tiny_q2["support"], tmp_path / "t.gguf", [3, 3], n_vocab=129280)
    assert not (tmp_path / "t.gguf").exists()


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from ds4tui.cli import main as cli_main

    rc = cli_main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_draft_vocab_command_ranks_the_files_tokens(tiny_q2, tmp_path, capsys):
    """`ds4tui draft-vocab` counts the files' tokens under the model's tokenizer and writes them,
    most frequent first after the chat template's tokens, into a copy of the support file."""
    import json

    from ds4tui.commands.draft_vocab import template_ids
    from ds4tui.engine.gguf_model import field_value, open_gguf
    from ds4tui.engine.tokenizer import Tokenizer

    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "a.py").write_text("def f(x):\n    return x + x + x\n")
    (src / "pkg" / "b.py").write_text("def g(y):\n    return y\n")
    (src / "notes.txt").write_text("not counted: not a .py file")
    out = tmp_path / "s.gguf"
    rc, so, err = _cli(capsys, "draft-vocab", str(tiny_q2["model"]), str(tiny_q2["support"]), "--from", str(src),
                       "--size", "12", "--out", str(out), "--json")
    assert rc == 0, err
    res = json.loads(so)
    tok = Tokenizer.from_gguf(tiny_q2["model"])
    texts = [(src / "a.py").read_text(), (src / "pkg" / "b.py").read_text()]
    ids = [tok.encode(t, parse_special=False) for t in texts]
    want = DV.rank_tokens(ids, 129280, always=template_ids(tok))[:12]
    got = [int(i) for i in field_value(open_gguf(out).fields[DV.KEY])]
    assert got == want and res["draft_vocab"] == 12 and res["files"] == 2
    assert res["tokens_counted"] == sum(map(len, ids))
    counts = np.bincount(np.concatenate(ids), minlength=129280)
    assert res["coverage"] == pytest.approx(counts[want].sum() / counts.sum(), abs=1e-6)
    assert "fewer than --size" not in err  # the files hold more than 12 distinct tokens
    # the engine drafts from it under auto
    e = S.Engine(tiny_q2["model"], support=out)
    assert e.draft_vocab == 12
    # a --size beyond the files' distinct tokens: all of them, and a note saying so
    rc, so, err = _cli(capsys, "draft-vocab", str(tiny_q2["model"]), str(tiny_q2["support"]), "--from", str(src),
                       "--out", str(tmp_path / "all.gguf"), "--json")
    everything = DV.rank_tokens(ids, 129280, always=template_ids(tok))
    assert set(everything) == set(np.concatenate(ids).tolist()) | set(template_ids(tok))  # each distinct id once
    assert rc == 0 and json.loads(so)["draft_vocab"] == len(everything) < 16384
    assert [int(i) for i in field_value(open_gguf(tmp_path / "all.gguf").fields[DV.KEY])] == everything
    assert err == (f"ds4tui draft-vocab: note: the list holds {len(everything)} tokens, fewer than --size 16384: the "
                   f"files hold no more distinct tokens (with the chat template's); the drafter never proposes any "
                   f"other, so count more files (--from) for a longer list\n")
    # errors: one line, status 2, nothing written
    rc, _, err = _cli(capsys, "draft-vocab", str(tiny_q2["model"]), str(tiny_q2["support"]), "--from",
                      str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.gguf"))
    assert rc == 2 and "--from" in err and "no such file or folder" in err and not (tmp_path / "x.gguf").exists()
    rc, so, err = _cli(capsys, "draft-vocab", str(tiny_q2["model"]), str(tiny_q2["support"]), "--from",
                       str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.gguf"), "--json")  # and on stdout
    assert rc == 2 and json.loads(so) == {"ok": False, "error": f"--from {tmp_path / 'nowhere'}: no such file or folder"}
    assert err == f"ds4tui draft-vocab: error: --from {tmp_path / 'nowhere'}: no such file or folder\n"
    rc, _, err = _cli(capsys, "draft-vocab", str(tiny_q2["model"]), str(tiny_q2["support"]), "--from", str(src),
                      "--glob", "*.rs", "--out", str(tmp_path / "x.gguf"))
    assert rc == 2 and "no readable UTF-8 text" in err and not (tmp_path / "x.gguf").exists()


def test_generate_names_its_draft_vocabulary(tiny_q2, tmp_path, capsys):
    """generate --json says which tokens the drafter proposed from; a count the support file cannot
    meet is a usage error naming the flag."""
    import json

    rc, so, err = _cli(capsys, "generate", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"]), "-p", "hi",
                       "-n", "4", "--json", "--scheduler-prices", "fresh")
    assert rc == 0, err
    res = json.loads(so.strip().splitlines()[-1])
    assert res["draft_vocab"] == 0 and res["draft_vocab_note"].startswith("full: all 129280 tokens")
    rc, _, err = _cli(capsys, "generate", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"]), "-p", "hi",
                      "-n", "4", "--draft-vocab", "64", "--scheduler-prices", "fresh")
    assert rc == 2
    assert "argument --draft-vocab: 64: " in err and "has no draft vocabulary" in err
    with pytest.raises(SystemExit) as exc:
        _cli(capsys, "generate", str(tiny_q2["model"]), "-p", "hi", "--draft-vocab", "lots")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --draft-vocab: expected auto, full or a count >= 1, found 'lots'" in err


def test_draft_vocab_from_a_pipe_is_refused_and_a_huge_file_is_skipped_unread(tiny_q2, tmp_path, capsys):
    """--from a named pipe blocked its read (a hang): refused by what it is; a file over 16 MiB in a
    folder (a model beside the sources) was read whole into memory: skipped, named in the note."""
    import os

    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    out = tmp_path / "s.gguf"
    rc, _, err = _cli(capsys, "draft-vocab", str(tiny_q2["model"]), str(tiny_q2["support"]), "--from", str(fifo),
                      "--size", "8", "--out", str(out))
    assert rc == 2 and err == (f"ds4tui draft-vocab: error: --from {fifo}: expected a text file or a folder, found a "
                               f"pipe (FIFO)\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    with open(src / "huge.py", "wb") as fh:  # sparse, 17 MiB
        fh.truncate(17 << 20)
    rc, _, err = _cli(capsys, "draft-vocab", str(tiny_q2["model"]), str(tiny_q2["support"]), "--from", str(src),
                      "--size", "8", "--out", str(out))
    assert rc == 0 and "1 file skipped (not UTF-8 text, over 16 MiB, or unreadable)" in err and "huge.py" in err


def test_draft_vocab_out_never_overwrites_what_it_should_not(tiny_q2, tmp_path, capsys, monkeypatch):
    """--out: the model file, a device or folder, the demo's unpacked support file, and an existing
    file without --force are refused before anything is written; SUPPORT itself is replaced."""
    import shutil

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    (src / "bad.py").write_bytes(b"\xff\xfe\x00binary")
    model = tmp_path / "model.gguf"
    support = tmp_path / "support.gguf"
    shutil.copy(tiny_q2["model"], model)
    shutil.copy(tiny_q2["support"], support)
    before = model.read_bytes()

    def run(out, *extra):
        return _cli(capsys, "draft-vocab", str(model), str(support), "--from", str(src), "--size", "8", "--out",
                    str(out), *extra)

    rc, _, err = run(model)
    assert rc == 2 and "is the model file" in err and model.read_bytes() == before
    rc, _, err = run(tmp_path)
    assert rc == 2 and "is not a regular file" in err
    other = tmp_path / "precious.txt"
    other.write_text("keep me")
    rc, _, err = run(other)
    assert rc == 2 and "exists: pass --force" in err and other.read_text() == "keep me"
    rc, _, err = run(other, "--force")
    assert rc == 0 and DV.KEY in open_fields(other)
    link = tmp_path / "link.gguf"
    link.symlink_to(support)
    rc, _, err = run(link)  # a link to SUPPORT: the file it names is replaced, the link stays
    assert rc == 0 and link.is_symlink() and DV.KEY in open_fields(support)
    assert "1 file skipped (not UTF-8 text, over 16 MiB, or unreadable)" in err and "bad.py" in err
    rc, _, err = _cli(capsys, "draft-vocab", str(model), str(support), "--from", str(src), "--out", "")
    assert rc == 2 and "an empty path" in err
    # a folder that does not exist, or a file where the folder should be: said before anything is counted
    rc, _, err = run(tmp_path / "no-such-folder" / "s.gguf")
    assert rc == 2 and err == (f"ds4tui draft-vocab: error: --out {tmp_path / 'no-such-folder' / 's.gguf'}: "
                               f"{tmp_path / 'no-such-folder'} does not exist: create the folder, or name a file in "
                               f"an existing one\n")
    rc, _, err = run(other / "s.gguf")
    assert rc == 2 and f"--out {other / 's.gguf'}: {other} is not a folder: create the folder" in err
    assert not (tmp_path / "no-such-folder").exists() and other.is_file()
    # the demo's unpacked support file: refused (the demo would unpack it again)
    monkeypatch.setenv("DS4TUI_DEMO_DIR", str(tmp_path / "demo"))
    (tmp_path / "demo" / "pair").mkdir(parents=True)
    demo_support = tmp_path / "demo" / "pair" / "support.gguf"
    shutil.copy(tiny_q2["support"], demo_support)
    rc, _, err = _cli(capsys, "draft-vocab", str(model), str(demo_support), "--from", str(src), "--out",
                      str(demo_support))
    assert rc == 2 and "bundled demo's unpacked support file" in err and DV.KEY not in open_fields(demo_support)


def open_fields(path) -> set:
    from ds4tui.engine.gguf_model import open_gguf

    return set(open_gguf(path).fields)


def test_a_list_that_cannot_be_used_is_said(tiny_q2, tmp_path, capsys):
    """generate notes a support file's unusable list on stderr (auto falls back to the whole
    vocabulary), inspect counts it as a problem (status 1), and --draft-vocab without a support model
    has a note that it does nothing."""
    bad = tmp_path / "support_bad.gguf"
    rewrite(tiny_q2["support"], bad, set_keys={DV.KEY: ([3, 3], GGUFValueType.ARRAY, GGUFValueType.UINT32)})
    rc, _, err = _cli(capsys, "generate", str(tiny_q2["model"]), "--mtp", str(bad), "-p", "hi", "-n", "2",
                      "--scheduler-prices", "fresh")
    assert rc == 0 and "its draft vocabulary (ds4tui.draft_vocab) cannot be used: token id 3 is listed twice" in err
    rc, out, _ = _cli(capsys, "inspect", str(tiny_q2["model"]), "--mtp", str(bad))
    assert rc == 1 and "draft vocabulary (ds4tui.draft_vocab) cannot be used: token id 3 is listed twice" in out
    rc, _, err = _cli(capsys, "generate", str(tiny_q2["model"]), "-p", "hi", "-n", "2", "--draft-vocab", "10")
    assert rc == 0 and "--draft-vocab 10 has no effect: no DSpark support model drafts" in err


def test_chat_refuses_a_count_the_support_file_cannot_meet_before_anything_loads(tiny_q2, capsys):
    """chat checks --draft-vocab N against the support file's metadata as generate does: one line,
    status 2, before the app opens."""
    from ds4tui import cli

    rc, _, err = _cli(capsys, "chat", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"]), "--draft-vocab", "99")
    assert rc == 2 and "argument --draft-vocab: 99: " in err and "has no draft vocabulary" in err


def test_the_memory_plan_counts_the_row_copies_the_engine_makes(tiny_q2, tmp_path):
    """memplan.draft_vocab_bytes (the fit check's and inspect's figure) equals what the engine adds
    to its expanded bytes when it copies the list's rows (native/engine.c draft_vocab), and inspect's
    plan counts them where the hip backend would draft from the list."""
    from ds4tui.commands import inspect as I
    from ds4tui.engine import memplan

    ranked = [int(i) for i in _half(129280)[:300]]
    path = tmp_path / "support_vd.gguf"
    DV.write_list(tiny_q2["support"], path, ranked, n_vocab=129280)
    full = S.Engine(tiny_q2["model"], support=path, draft_vocab="full")
    listed = S.Engine(tiny_q2["model"], support=path, draft_vocab=300)
    sm = SupportModel(path, full.config)
    added = listed.memory().scratch - full.memory().scratch  # engine-level scratch: the expanded bytes
    head_row = full.model.tensors["output.weight"].nbytes // 129280
    assert added == memplan.draft_vocab_bytes(full.model, sm, 300) > 300 * head_row
    assert memplan.draft_vocab_bytes(full.model, sm, 0) == 0 == memplan.draft_vocab_bytes(full.model, None, 300)
    # inspect's plan: the rows auto copies, and no copies for a support file without a list
    plan = I.memory_plan(full.model, sm, 64, budget=1 << 40)
    assert plan["draft_vocab_rows"] == 300 and plan["support"] == memplan.tensor_bytes(sm) + added
    plain = SupportModel(tiny_q2["support"], full.config)
    plan = I.memory_plan(full.model, plain, 64, budget=1 << 40)
    assert plan["draft_vocab_rows"] == 0 and plan["support"] == memplan.tensor_bytes(plain)
    assert "(with the draft vocabulary's 300 row copies)" in I.render_plan(I.memory_plan(full.model, sm, 64, None))


def test_bench_ab_refuses_a_count_the_support_file_cannot_meet_before_anything_loads(tiny_q2, tmp_path, capsys):
    """bench --ab checks --draft-vocab N against the support file's list as generate and chat do:
    one line naming the flag, the count and the file's own count, status 2 (with --json also
    ``{"ok": false}`` on stdout), no traceback, before the model loads."""
    import json

    listed = tmp_path / "support_listed.gguf"
    rewrite(tiny_q2["support"], listed,
            set_keys={DV.KEY: (list(range(40)), GGUFValueType.ARRAY, GGUFValueType.UINT32)})
    rc, out, err = _cli(capsys, "bench", str(tiny_q2["model"]), "--mtp", str(listed), "--ab", "--tokens", "16",
                        "--draft-vocab", "41")
    assert rc == 2 and out == ""
    assert err == (f"ds4tui bench: error: argument --draft-vocab: 41: {listed} lists 40 tokens; choose at most 40, "
                   f"or full for the whole vocabulary\n")
    rc, out, err = _cli(capsys, "bench", str(tiny_q2["model"]), "--mtp", str(tiny_q2["support"]), "--ab",
                        "--tokens", "16", "--draft-vocab", "7", "--json")
    assert rc == 2 and "Traceback" not in err
    res = json.loads(out)
    assert res["ok"] is False and res["error_type"] == "ValueError"
    assert res["error"].startswith(f"argument --draft-vocab: 7: {tiny_q2['support']} has no draft vocabulary")


def test_a_count_against_a_file_that_is_no_support_model_names_the_file_error(tiny_q2, tmp_path, capsys):
    """--draft-vocab N with an --mtp that cannot be read as a support model (the target model, a file
    cut short) gets that file's own error, status 1, as without the flag, not "has no draft
    vocabulary" (a usage error that would send the user to `ds4tui draft-vocab`); chat too, before its
    app opens (it used to let the file through to the load, after the model's)."""
    import dataclasses

    from ds4tui import cli
    from ds4tui.commands.chat import options_from_args
    from ds4tui.commands.environment import Settings
    from ds4tui.engine.errors import ModelFileError
    from ds4tui.engine.gguf_model import support_draft_vocab_size

    cut = tmp_path / "support_cut.gguf"
    data = open(tiny_q2["support"], "rb").read()
    cut.write_bytes(data[: len(data) // 2])
    assert support_draft_vocab_size(tiny_q2["support"]) == 0  # a support file without a list
    assert support_draft_vocab_size(cut) is None and support_draft_vocab_size(tiny_q2["model"]) is None
    arch = (f"{tiny_q2['model']}: general.architecture: expected 'deepseek4-dspark' or 'dflash', found 'deepseek4' "
            f"(this is a target model, not a support file)")
    for mtp, message in ((tiny_q2["model"], arch), (cut, f"{cut}: file is truncated")):
        rc, _, err = _cli(capsys, "generate", str(tiny_q2["model"]), "--mtp", str(mtp), "-p", "hi", "-n", "2",
                          "--draft-vocab", "5", "--backend", "cpu")
        assert rc == 1 and err.startswith(f"ds4tui generate: error: {message}") and "draft vocabulary" not in err
        rc, _, err = _cli(capsys, "bench", str(tiny_q2["model"]), "--mtp", str(mtp), "--ab", "--tokens", "16",
                          "--draft-vocab", "5", "--backend", "cpu")
        assert rc == 1 and err.startswith(f"ds4tui bench: error: {message}") and "draft vocabulary" not in err
        args = cli.build_parser().parse_args(["chat", str(tiny_q2["model"]), "--mtp", str(mtp), "--draft-vocab", "5"])
        args.settings = dataclasses.replace(Settings(), draft_vocab="5")  # as cli.main reads the flag
        with pytest.raises(ModelFileError) as refused:  # before the app opens, as generate and bench
            options_from_args(args)
        assert str(refused.value).startswith(message) and "draft vocabulary" not in str(refused.value)


def test_the_two_files_in_the_wrong_order_say_which_comes_first(tiny_q2, tmp_path, capsys):
    """SUPPORT given first: the message said "pass it with --mtp", an option draft-vocab does not have."""
    src = tmp_path / "a.py"
    src.write_text("x = 1\n")
    out = tmp_path / "out.gguf"
    rc, stdout, err = _cli(capsys, "draft-vocab", str(tiny_q2["support"]), str(tiny_q2["model"]), "--from", str(src),
                           "--out", str(out))
    assert (rc, stdout) == (1, "") and not out.exists()
    assert err == (f"ds4tui draft-vocab: error: {tiny_q2['support']}: general.architecture: expected 'deepseek4', "
                   f"found 'deepseek4-dspark' (this is a DSpark support file: give the target model first, then the "
                   f"support file: ds4tui draft-vocab MODEL.gguf SUPPORT.gguf --from PATH --out OUT.gguf)\n")
