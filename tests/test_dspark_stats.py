"""DSparkStats, the ds4 stats line and JSON, checked on published ds4 numbers (spec dspark.md §6, §8)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import cffi
import pytest

import ds4tui
from ds4tui.engine.stats import (
    CONF_BINS,
    MAX_BLOCK,
    NO_DRAFT_REASONS,
    SESSION_FIELDS,
    DSparkStats,
    format_line,
    parse_line,
    to_json,
)

HEADER = Path(ds4tui.__file__).parent / "native" / "ds4_engine.h"

# The user's ROCm report decoded in spec §6: 1197 cycles, scheduler off, the stage chain fails
# every cycle (here counted as chain_fail at the attention op).  The totals are the spec's
# (propose 2207.187, spec_total 0.100, net_saved -2207.287, ~61 ms per target token); the split
# of propose into its buckets follows the spec's per-cycle figures (setup 0.30, chain 1.53,
# cache 0.01 ms).
USER_597 = {
    "cycles": 1197,
    "first_tokens": 1197,
    "no_draft": 1197,
    "chain_fail": 1197,
    "chain_fail_op": "attention",
    "no_draft_reasons": {"chain_fail": 1197},
    "propose": 2207.187,
    "prop_stage0": 0.009,
    "prop_setup": 359.412,
    "prop_cache": 11.63,
    "prop_chain": 1831.287,
    "spec_total": 0.1,
    "target": 73028.412,
    "net_saved": -2207.287,
    "t_decode_ms": 61.01,
    "t_decode_measured": True,
    "block_size": 5,
    "draft_len_hist": [1197],
    "accepted_len_hist": [1197],
}
USER_597_LINE = (
    "DSpark stats cycles=1197 first_tokens=1197 proposed=0 accepted_draft=0 accept_rate=0.00% "
    "avg_accept=0.000 full=0 partial=0 miss_first=0 no_draft=1197 no_room=0 invalid=0 "
    "scheduler_skips=0 tail_skips=0 verifier_unavailable=0 errors=0 time_ms propose=2207.187 "
    "prop_stage0=0.009 prop_setup=359.412 prop_cache=11.630 prop_chain=1831.287 prop_hidden=0.000 "
    "prop_conf0=0.000 prop_logits=0.000 prop_markov=0.000 prop_confidence=0.000 snapshot=0.000 "
    "verify=0.000 spec_total=0.100 target=73028.412 saved=0.000 net_saved=-2207.287 "
    "draft_len_hist=none accepted_len_hist=0:1197 "
    "chain_fail=1197 chain_fail_op=attention no_draft_reasons=chain_fail:1197"
)

# ds4 issue #695 (Metal, scheduler on): cycles=88 proposed=44 accepted_draft=31
# accept_rate=70.45% avg_accept=0.352, draft_len_hist=1:10,2:6,3:6,4:1,
# accepted_len_hist=0:72,1:6,2:5,3:5.  Our draft_len_hist adds bin 0 (the 65 no-draft cycles);
# the per-row counts follow from the two histograms.
METAL_695 = {
    "cycles": 88,
    "first_tokens": 88,
    "proposed": 44,
    "accepted_draft": 31,
    "full": 14,
    "partial": 2,
    "miss_first": 7,
    "no_draft": 65,
    "scheduler_skips": 52,
    "no_draft_reasons": {"scheduler_skip": 52, "confidence_gate": 13},
    "propose": 332.0,
    "verify": 964.4,
    "spec_total": 2039.9,
    "saved": 1045.3,
    "net_saved": -1326.6,
    "block_size": 5,
    "draft_len_hist": [65, 10, 6, 6, 1, 0],
    "accepted_len_hist": [72, 6, 5, 5, 0, 0],
    "pos_proposed": [23, 13, 7, 1, 0],
    "pos_accepted": [16, 10, 5, 0, 0],
    "conf_hist": [0] * 10 + [3, 4, 5, 6, 8, 9, 12, 10, 8, 5],
}

# A real ds4 line (issue #597, commit 54b36ed): newer build with the verify_* and replay keys,
# a log prefix and the bare word time_ms.
DS4_54B36ED = (
    "Jul 28 23:39:26 faex1 ds4-server[28356]: ds4: DSpark stats cycles=1475 first_tokens=1475 "
    "proposed=0 accepted_draft=0 accept_rate=0.00% avg_accept=0.000 full=0 partial=0 miss_first=0 "
    "no_draft=1475 no_room=0 invalid=0 scheduler_skips=1127 tail_skips=0 verifier_unavailable=0 "
    "errors=0 time_ms propose=660.213 prop_stage0=0.007 prop_setup=100.387 prop_cache=9.092 "
    "prop_chain=550.576 prop_hidden=0.000 prop_conf0=0.000 prop_logits=0.000 prop_markov=0.000 "
    "prop_confidence=0.000 snapshot=0.000 verify=0.000 verify_upload=0.000 verify_layer=0.000 "
    "verify_head=0.000 verify_read=0.000 verify_fused_head=0 replay=0.000 spec_total=0.128 "
    "target=93788.163 saved=0.000 net_saved=-660.341 draft_len_hist=none accepted_len_hist=0:1475"
)


def test_user_report_formats_as_ds4_line():
    s = DSparkStats.from_dict(USER_597)
    assert s.check_invariants() == []
    assert format_line(s) == USER_597_LINE
    assert s.accept_rate == 0.0 and s.avg_accept == 0.0 and s.tokens_per_cycle == 1.0
    assert s.dominant_no_draft_reason == "chain_fail"
    # every cycle ran the drafter (and failed in the chain): per pass = per cycle here
    t = s.stage_timing()
    assert t["drafter_passes"] == 1197 and t["drafted_cycles"] == 0 and t["plain_decodes"] == 1197
    per_pass = t["ms_per_drafter_pass"]
    assert per_pass["prop_setup"] == pytest.approx(0.30, abs=0.005)
    assert per_pass["prop_chain"] == pytest.approx(1.53, abs=0.005)
    assert per_pass["propose"] == pytest.approx(2207.187 / 1197)
    assert per_pass["prop_hidden"] == 0.0
    assert set(per_pass) == {
        "prop_stage0", "prop_setup", "prop_cache", "prop_chain", "prop_hidden", "prop_conf0",
        "prop_logits", "prop_markov", "prop_confidence", "propose",
    }
    assert t["verify_ms_per_drafted_cycle"] is None and t["verify_over_decode"] is None
    assert t["decode_ms_per_plain_decode"] == pytest.approx(73028.412 / 1197)  # ~61 ms, spec §6.3
    assert s.per_position_accept == (None,) * 5


def test_user_report_round_trips_through_parse_line():
    s = DSparkStats.from_dict(USER_597)
    p = parse_line(format_line(s))
    assert p["cycles"] == 1197 and p["first_tokens"] == 1197 and p["no_draft"] == 1197
    assert p["proposed"] == 0 and p["accepted_draft"] == 0
    assert p["accept_rate"] == 0.0 and p["avg_accept"] == 0.0
    assert p["propose"] == 2207.187 and p["prop_chain"] == 1831.287 and p["net_saved"] == -2207.287
    assert p["spec_total"] == 0.1 and p["target"] == 73028.412
    assert p["draft_len_hist"] == {} and p["accepted_len_hist"] == {0: 1197}
    assert p["chain_fail"] == 1197 and p["chain_fail_op"] == "attention"
    assert p["no_draft_reasons"] == {"chain_fail": 1197}
    for key in ("cycles", "proposed", "full", "partial", "miss_first", "no_room", "invalid",
                "scheduler_skips", "tail_skips", "verifier_unavailable", "errors"):
        assert isinstance(p[key], int) and p[key] == getattr(s, key)
    for key in ("propose", "prop_stage0", "prop_setup", "prop_cache", "prop_hidden", "snapshot",
                "verify", "saved"):
        assert isinstance(p[key], float) and p[key] == round(getattr(s, key), 3)
    assert "time_ms" not in p


def test_drafting_session_matches_ds4_rounding():
    s = DSparkStats.from_dict(METAL_695)
    assert s.check_invariants() == []
    line = format_line(s)
    # The values ds4 printed for these counts.
    for field in ("accept_rate=70.45%", "avg_accept=0.352", "draft_len_hist=1:10,2:6,3:6,4:1",
                  "accepted_len_hist=0:72,1:6,2:5,3:5", "net_saved=-1326.600", "propose=332.000",
                  "no_draft_reasons=confidence_gate:13,scheduler_skip:52", "chain_fail=0"):
        assert f" {field}" in line, field
    assert "chain_fail_op" not in line
    assert s.tokens_per_cycle == pytest.approx(119 / 88)
    ppa = s.per_position_accept
    assert ppa[:4] == pytest.approx((16 / 23, 10 / 13, 5 / 7, 0.0)) and ppa[4] is None
    assert s.dominant_no_draft_reason == "scheduler_skip"
    p = parse_line(line)
    assert p["draft_len_hist"] == {1: 10, 2: 6, 3: 6, 4: 1}
    assert p["accepted_len_hist"] == {0: 72, 1: 6, 2: 5, 3: 5}
    assert p["accept_rate"] == 70.45 and p["avg_accept"] == 0.352


def test_line_keys_follow_ds4_order_then_ours():
    keys = [w.split("=")[0] for w in format_line(DSparkStats.from_dict(USER_597)).split() if "=" in w]
    ds4_keys = [w.split("=")[0] for w in DS4_54B36ED.split() if "=" in w]
    newer = {"verify_upload", "verify_layer", "verify_head", "verify_read", "verify_fused_head", "replay"}
    ds4_keys = [k for k in ds4_keys if k not in newer]
    assert keys[: len(ds4_keys)] == ds4_keys
    assert keys[len(ds4_keys):] == ["chain_fail", "chain_fail_op", "no_draft_reasons"]


def test_format_reproduces_a_real_ds4_line():
    # The same counts as the ds4 line, minus the keys that newer ds4 builds added.
    p = parse_line(DS4_54B36ED)
    stats = DSparkStats(
        block_size=5,
        draft_len_hist=(1475,),
        accepted_len_hist=(1475,),
        chain_fail=348,
        no_draft_reasons={"scheduler_skip": 1127, "chain_fail": 348},
        **{k: v for k, v in p.items() if k in DSparkStats.__dataclass_fields__ and not k.endswith("_hist")},
    )
    assert stats.check_invariants() == []
    expected = re.sub(r" (verify_upload|verify_layer|verify_head|verify_read|verify_fused_head|replay)=\S+", "",
                      DS4_54B36ED)
    expected = expected[expected.index("DSpark stats"):]
    assert format_line(stats).startswith(expected + " chain_fail=348 ")


def test_parse_real_ds4_line():
    p = parse_line(DS4_54B36ED)
    assert p["cycles"] == 1475 and p["scheduler_skips"] == 1127 and p["no_draft"] == 1475
    assert p["prop_chain"] == 550.576 and p["target"] == 93788.163 and p["net_saved"] == -660.341
    assert p["verify_fused_head"] == 0 and isinstance(p["verify_fused_head"], int)
    assert p["replay"] == 0.0 and p["accept_rate"] == 0.0
    assert p["draft_len_hist"] == {} and p["accepted_len_hist"] == {0: 1475}
    assert "time_ms" not in p and "ds4:" not in p


def test_parse_tolerates_wrapped_partial_lines_and_ms_units():
    text = ("noise before\nds4: DSpark stats cycles=119 first_tokens=119 proposed=0 accepted_draft=0\n"
            "accept_rate=0.00% avg_accept=0.000 full=0 partial=0 miss_first=0\n"
            "no_draft=119 no_room=0 invalid=0\nverify=0.000 verify_layer=0.000 replay=0.000 propose=1.500ms\n")
    p = parse_line(text)
    assert p == {
        "cycles": 119, "first_tokens": 119, "proposed": 0, "accepted_draft": 0, "accept_rate": 0.0,
        "avg_accept": 0.0, "full": 0, "partial": 0, "miss_first": 0, "no_draft": 119, "no_room": 0,
        "invalid": 0, "verify": 0.0, "verify_layer": 0.0, "replay": 0.0, "propose": 1.5,
    }


BROKEN = [
    ("accepted_len_hist", lambda s: dataclasses.replace(s, accepted_len_hist=(1196, 0, 0, 0, 0, 0)),
     "sum(accepted_len_hist) 1196 != cycles 1197"),
    ("draft_len_hist", lambda s: dataclasses.replace(s, draft_len_hist=(1197, 1)),
     "sum(draft_len_hist) 1198 != cycles 1197"),
    ("outcomes",
     lambda s: dataclasses.replace(s, no_draft=1196, no_draft_reasons={"chain_fail": 1196}, chain_fail=1196),
     "full+partial+miss_first+no_draft+invalid+verifier_unavailable+errors 1196 != cycles 1197"),
    ("reasons", lambda s: dataclasses.replace(s, no_draft_reasons={"chain_fail": 1190}),
     "sum(no_draft_reasons) 1190 != no_draft 1197"),
    ("chain_fail", lambda s: dataclasses.replace(s, chain_fail=3),
     "chain_fail 3 != no_draft_reasons[chain_fail] 1197"),
    ("no_room", lambda s: dataclasses.replace(s, no_room=2),
     "no_room 2 != no_draft_reasons[no_room] 0"),
    ("scheduler", lambda s: dataclasses.replace(s, scheduler_skips=5),
     "scheduler_skips 5 != no_draft_reasons[scheduler_skip] 0"),
    ("tail", lambda s: dataclasses.replace(s, tail_skips=1),
     "tail_skips 1 != no_draft_reasons[tail_skip] 0"),
    ("accepted>proposed", lambda s: dataclasses.replace(s, accepted_draft=4, proposed=3),
     "accepted_draft 4 > proposed 3"),
    ("pos", lambda s: dataclasses.replace(s, pos_proposed=(1, 0, 0, 0, 0), pos_accepted=(1, 1, 0, 0, 0)),
     "pos_accepted[1] 1 > pos_proposed[1] 0"),
]


@pytest.mark.parametrize("name,breaks,message", BROKEN, ids=[b[0] for b in BROKEN])
def test_check_invariants_names_what_is_broken(name, breaks, message):
    good = DSparkStats.from_dict(USER_597)
    bad = breaks(good)
    assert message in bad.check_invariants()
    assert message in bad.to_dict()["invariant_violations"]


def test_pos_sums_are_checked():
    s = DSparkStats.from_dict(METAL_695)
    bad = dataclasses.replace(s, pos_accepted=(16, 10, 4, 0, 0))
    assert "sum(pos_accepted) 30 != accepted_draft 31" in bad.check_invariants()
    bad = dataclasses.replace(s, pos_accepted=(24, 10, 5, 0, 0), pos_proposed=(23, 13, 7, 1, 0))
    v = bad.check_invariants()
    assert "sum(pos_accepted) 39 != accepted_draft 31" in v and "pos_accepted[0] 24 > pos_proposed[0] 23" in v
    bad = dataclasses.replace(s, accepted_len_hist=(72, 7, 4, 5, 0, 0))
    assert bad.check_invariants() == ["sum(k*accepted_len_hist[k]) 30 != accepted_draft 31"]
    bad = dataclasses.replace(s, draft_len_hist=(65, 11, 5, 6, 1, 0))
    assert bad.check_invariants() == ["sum(pos_proposed) 44 != sum(k*draft_len_hist[k]) 43"]


def test_zero_default():
    s = DSparkStats()
    assert s.check_invariants() == []
    assert s.draft_len_hist == (0,) and s.accepted_len_hist == (0,) and s.pos_proposed == ()
    assert s.conf_hist == (0,) * CONF_BINS
    assert s.no_draft_reasons == dict.fromkeys(NO_DRAFT_REASONS, 0)
    assert s.accept_rate == 0.0 and s.avg_accept == 0.0 and s.tokens_per_cycle == 0.0
    assert s.dominant_no_draft_reason is None and s.chain_fail_op == ""
    line = format_line(s)
    assert " draft_len_hist=none accepted_len_hist=none chain_fail=0 no_draft_reasons=none" in line
    assert DSparkStats.from_dict(json.loads(to_json(s))) == s
    assert json.loads(to_json(s))["accept_rate"] is None  # nothing proposed: none in the JSON, 0.00% on the line
    assert hash(s) == hash(DSparkStats()) and s != DSparkStats(no_draft=1, no_draft_reasons={"disabled": 1})


def test_json_round_trip_has_derived_values():
    s = DSparkStats.from_dict(METAL_695)
    d = json.loads(to_json(s))
    assert d["accept_rate"] == pytest.approx(100 * 31 / 44)
    assert d["avg_accept"] == pytest.approx(31 / 88)
    assert d["per_position_accept"][4] is None
    assert d["dominant_no_draft_reason"] == "scheduler_skip"
    # 14 full + 2 partial + 7 miss_first cycles verified; 13 more ran the drafter and were gated
    t = d["stage_timing"]
    assert (t["drafted_cycles"], t["drafter_passes"], t["plain_decodes"]) == (23, 36, 65)
    assert t["verify_ms_per_drafted_cycle"] == pytest.approx(964.4 / 23)
    assert t["spec_total_ms_per_drafted_cycle"] == pytest.approx(2039.9 / 23)
    assert t["ms_per_drafter_pass"]["propose"] == pytest.approx(332.0 / 36)
    assert t["decode_ms_per_plain_decode"] == 0.0 and t["verify_over_decode"] is None  # #695 gives no target time
    assert "stage_ms_per_cycle" not in d  # every stage over all cycles hid what a verify costs
    assert DSparkStats.from_dict({**d, "stage_ms_per_cycle": {"verify": 1.0}}) == s  # older exports still read
    assert d["invariant_violations"] == []
    assert d["conf_hist"] == METAL_695["conf_hist"]
    assert DSparkStats.from_dict(d) == s
    assert to_json(s).startswith('{\n "cycles": 88,')


def test_a_tie_for_the_dominant_no_draft_reason_names_every_tied_reason():
    """The dominant reason used to be the first in index order on a tie, one of several equal ones;
    the JSON keeps that name under its key (a string) and lists the tied ones next to it."""
    s = DSparkStats(cycles=9, first_tokens=9, no_draft=9, scheduler_skips=4, tail_skips=4, no_room=1,
                    no_draft_reasons={"scheduler_skip": 4, "tail_skip": 4, "no_room": 1})
    assert s.dominant_no_draft_reason == "scheduler_skip"
    assert s.dominant_no_draft_reasons == ("scheduler_skip", "tail_skip")
    d = json.loads(to_json(s))
    assert d["dominant_no_draft_reason"] == "scheduler_skip" and d["dominant_no_draft_reasons"] == ["scheduler_skip",
                                                                                                     "tail_skip"]
    assert DSparkStats.from_dict(d) == s  # a derived value: read back without complaint, and ignored
    three = dataclasses.replace(s, no_draft=12, no_room=4,
                                no_draft_reasons={"scheduler_skip": 4, "tail_skip": 4, "no_room": 4})
    assert three.dominant_no_draft_reasons == ("scheduler_skip", "tail_skip", "no_room")
    one = DSparkStats.from_dict(METAL_695)  # confidence_gate 13, scheduler_skip 52
    assert one.dominant_no_draft_reasons == ("scheduler_skip",) and one.dominant_no_draft_reason == "scheduler_skip"
    assert DSparkStats().dominant_no_draft_reasons == () and DSparkStats().to_dict()["dominant_no_draft_reasons"] == []


def test_from_dict_refuses_unknown_names():
    with pytest.raises(ValueError, match="unknown keys"):
        DSparkStats.from_dict({"cycles": 1, "acepted_draft": 1})
    with pytest.raises(ValueError, match="unknown names"):
        DSparkStats.from_dict({"no_draft_reasons": {"chain_failure": 1}})


def _dspark_cdef() -> str:
    """#defines and typedef structs of the header's DSpark block (no functions: no library needed)."""
    text = HEADER.read_text()
    block = text[text.index("DSpark speculative decoding"): text.index("/* CDEF END */")]
    block = re.sub(r"/\*.*?\*/", "", block, flags=re.S)
    defines = re.findall(r"^#define \w+ +\d+(?= *$)", block, flags=re.M)
    structs = re.findall(r"typedef struct \{.*?\} \w+;", block, flags=re.S)
    # the knobs are declared before the session API (ds4_session_create takes the starting ones)
    knobs = re.search(r"typedef struct \{[^}]*\} ds4_dspark_knobs;", re.sub(r"/\*.*?\*/", "", text, flags=re.S))
    return "\n".join(defines + [knobs.group(0)] + structs)


@pytest.fixture(scope="module")
def dspark_ffi():
    ffi = cffi.FFI()
    ffi.cdef(_dspark_cdef())
    return ffi


def _fill(ffi, d: dict):
    p = ffi.new("ds4_dspark_stats *")
    for name, value in d.items():
        if name == "no_draft_reasons":
            for i, reason in enumerate(NO_DRAFT_REASONS):
                p.no_draft_reasons[i] = value.get(reason, 0)
        elif name == "chain_fail_op":
            ffi.memmove(p.chain_fail_op, value.encode() + b"\0", len(value) + 1)
        elif isinstance(value, list):
            getattr(p, name)[0: len(value)] = value
        elif name in ("t_decode_ms", "t_decode_measured", "block_size"):
            setattr(p, name, value)
        elif isinstance(value, float):
            setattr(p, name + "_ms", value)
        else:
            setattr(p, name, value)
    return p


def test_header_fields_and_sizes_match_the_dataclass(dspark_ffi):
    c_fields = [n for n, _ in dspark_ffi.typeof("ds4_dspark_stats").fields]
    ours = [n.removesuffix("_ms") if n != "t_decode_ms" else n for n in c_fields]
    # every field but those the session counts (Session.rewind's stop_cut)
    assert sorted(ours) == sorted(set(DSparkStats.__dataclass_fields__) - set(SESSION_FIELDS))
    assert SESSION_FIELDS == ("stop_cut",) and not set(SESSION_FIELDS) & set(ours)
    lib = dspark_ffi.dlopen(None)
    assert lib.DS4_DSPARK_MAX_BLOCK == MAX_BLOCK and lib.DS4_DSPARK_CONF_BINS == CONF_BINS
    assert lib.DS4_ND_COUNT == len(NO_DRAFT_REASONS)
    for i, name in enumerate(NO_DRAFT_REASONS):
        assert getattr(lib, f"DS4_ND_{name.upper()}") == i
    p = dspark_ffi.new("ds4_dspark_stats *")
    assert len(p.draft_len_hist) == MAX_BLOCK + 1 and len(p.pos_proposed) == MAX_BLOCK
    assert len(p.conf_hist) == CONF_BINS and len(p.no_draft_reasons) == len(NO_DRAFT_REASONS)


@pytest.mark.parametrize("scenario", [USER_597, METAL_695], ids=["user_597", "metal_695"])
def test_from_native(dspark_ffi, scenario):
    p = _fill(dspark_ffi, {**scenario, "n_events": 3})
    s = DSparkStats.from_native(dspark_ffi, p)
    assert s == DSparkStats.from_dict({**scenario, "n_events": 3})
    assert len(s.draft_len_hist) == 6 and len(s.accepted_len_hist) == 6
    assert len(s.pos_proposed) == 5 and len(s.conf_hist) == 20
    assert s.check_invariants() == []
    assert DSparkStats.from_native(dspark_ffi, p[0]) == s


def test_from_native_keeps_counts_past_the_block(dspark_ffi):
    p = _fill(dspark_ffi, {**USER_597, "draft_len_hist": [1196, 0, 0, 0, 0, 0, 0, 0, 1]})
    s = DSparkStats.from_native(dspark_ffi, p)
    assert s.draft_len_hist == (1196, 0, 0, 0, 0, 0, 0, 0, 1)
    assert "draft_len_hist has counts past block_size 5: [1196, 0, 0, 0, 0, 0, 0, 0, 1]" in s.check_invariants()
    assert " draft_len_hist=8:1 " in format_line(s)


def test_from_native_with_the_built_extension():
    native = pytest.importorskip("ds4tui._native")
    try:
        native.ffi.typeof("ds4_dspark_stats")
    except Exception:
        pytest.skip("the built extension predates ds4_dspark_stats")
    p = native.ffi.new("ds4_dspark_stats *")
    assert DSparkStats.from_native(native.ffi, p) == DSparkStats()


def test_every_no_draft_reason_is_explained_in_the_app_and_the_readme():
    from ds4tui.engine.stats import NO_DRAFT_HELP

    assert tuple(NO_DRAFT_HELP) == NO_DRAFT_REASONS
    readme = (Path(ds4tui.__file__).parent.parent / "README.md").read_text()
    for name, (why, todo) in NO_DRAFT_HELP.items():
        assert why.endswith(".") and todo
        assert f"| `{name}` | {why} | {todo} |" in readme, name


def test_the_stats_of_one_turn_are_the_difference_of_two_snapshots():
    from ds4tui.engine.worker import _diff

    before = DSparkStats.from_dict(USER_597)
    after = DSparkStats.from_dict({**USER_597, "cycles": 1297, "first_tokens": 1297, "no_draft": 1297,
                                   "chain_fail": 1297, "no_draft_reasons": {"chain_fail": 1297},
                                   "draft_len_hist": [1297], "accepted_len_hist": [1297], "propose": 2407.187})
    d = _diff(after.to_dict(), before.to_dict())
    assert d["cycles"] == 100 and d["propose"] == pytest.approx(200.0)
    assert d["stage_timing"]["drafter_passes"] == 100  # derived values come from the difference
    assert d["stage_timing"]["ms_per_drafter_pass"]["propose"] == pytest.approx(2.0)
    # what is no count is the later snapshot's: the plain decode's price, the failed op of the turn's failures
    priced = DSparkStats.from_dict({**after.to_dict(), "t_decode_ms": 3.524, "t_decode_measured": True,
                                    "chain_fail_op": "prop_chain"})
    d = _diff(priced.to_dict(), before.to_dict())
    assert (d["t_decode_ms"], d["t_decode_measured"], d["chain_fail_op"]) == (3.524, True, "prop_chain")
    d = _diff(priced.to_dict(), priced.to_dict())  # a turn without a chain failure names no op
    assert (d["t_decode_measured"], d["chain_fail_op"]) == (True, "")


def _users_two_turns(stop_cut: int) -> DSparkStats:
    """The counters of the report that found ``full`` without a full bin: 46 cycles, 22 of them
    drafted 5 drafts each (full 1, partial 10, miss_first 11), 24 drafted nothing; accepted
    lengths 0:35,1:5,2:4,3:2; per-position acceptance 11/22, 6/22, 2/22, 0, 0."""
    return DSparkStats(cycles=46, first_tokens=46, proposed=110, accepted_draft=19, full=1, partial=10,
                       miss_first=11, no_draft=24, scheduler_skips=24, no_draft_reasons={"scheduler_skip": 24},
                       block_size=5, draft_len_hist=(24, 0, 0, 0, 0, 22), accepted_len_hist=(35, 5, 4, 2, 0, 0),
                       pos_proposed=(22,) * 5, pos_accepted=(11, 6, 2, 0, 0), stop_cut=stop_cut)


def test_a_full_cycle_without_a_full_bin_needs_a_stop_cut():
    """A full cycle of 5 drafts is counted at 5 in both histograms unless a stop token among its
    drafts cut it (then it is counted at the drafts it kept, and stop_cut says so)."""
    seen = _users_two_turns(stop_cut=0)
    assert [round(r, 2) for r in seen.per_position_accept] == [0.5, 0.27, 0.09, 0.0, 0.0]
    assert seen.check_invariants() == [
        "full 1 > sum(min(draft_len_hist[k], accepted_len_hist[k]), k>=1) 0 + stop_cut 0: a full cycle must "
        "accept as many drafts as it verified, or be cut by a stop token"]
    cut = _users_two_turns(stop_cut=1)
    assert cut.check_invariants() == [] and cut.to_dict()["invariant_violations"] == []
    line = format_line(cut)
    assert " full=1 partial=10 miss_first=11 " in line and line.endswith(" stop_cut=1")
    assert " stop_cut" not in format_line(seen)  # ds4's line and ours stay as they were without one
    assert parse_line(line)["stop_cut"] == 1 and DSparkStats.from_dict(cut.to_dict()) == cut
    # the other relations: full + partial cycles are the ones with an accepted length >= 1
    assert "full+partial 11 is not within sum(accepted_len_hist[k>=1]) 12 .. that + stop_cut 1" in dataclasses.replace(
        cut, accepted_len_hist=(34, 6, 4, 2, 0, 0), accepted_draft=20, pos_accepted=(11, 7, 2, 0, 0)).check_invariants()
    assert "stop_cut 12 > full+partial 11" in dataclasses.replace(cut, stop_cut=12).check_invariants()
    # a rewind past the stop may leave a cut cycle no draft: then it is in bin 0, within stop_cut
    none_left = dataclasses.replace(cut, accepted_len_hist=(36, 4, 4, 2, 0, 0), accepted_draft=18,
                                    pos_accepted=(10, 6, 2, 0, 0))
    assert none_left.check_invariants() == []
    assert "full+partial 11 is not within sum(accepted_len_hist[k>=1]) 10 .. that + stop_cut 0" in \
        dataclasses.replace(none_left, stop_cut=0).check_invariants()
