"""The DSpark scheduler's measured prices, kept across sessions (spec dspark.md §7.4).

A fresh session's scheduler knows neither what a verify of n rows costs nor how often the drafter's
tokens are accepted, so it pays for one full proposal and verify to find out (the pricing cycle)
and for probes while the bounds on acceptance are loose.  The ``scheduler_prices`` option of
:class:`~ds4tui.engine.session.Engine` says where a new session's scheduler starts:

* ``"fresh"``: from nothing (every session prices itself; the engine's default for a Python caller);
* ``"engine"``: from what the earlier sessions of the same engine measured;
* ``"saved"``: as ``engine``, and the prices are also kept in a small JSON file between runs, keyed
  by what changes what is measured (:func:`identity`); the commands' default.

What is kept (:class:`SchedulerPrices`, the C engine's ``ds4_dspark_prices``): t_ver(n) in ms for
every verify width seen (n = 1: a plain decode), t_prop (the full proposal) and, per draft position
k, the verifies that reached k and those that accepted it.  The counts a session starts with are
scaled down to :data:`PRIOR_VERIFIES` verifies at position 0 (the ratios kept; the kept prices hold
up to :data:`KEPT_VERIFIES`), so that a session's own acceptance outweighs the carried one within a
few drafted cycles.  A session
that starts from kept prices still times a plain decode before it decides anything, and every
measured time still enters through the clamped moving average and the re-pricing decode (spec
dspark.md §7.4), so a stale price moves towards the measured one instead of latching a loss; verify
and proposal times no session has re-timed for :data:`RETIME_AFTER_S` are left out of a new
session's start (:func:`retime_reason`), so that its first drafted cycle prices them again, and so
are times measured while other work on the machine kept :data:`RETIME_OTHER_CORES` or more cores
busier or idler than it does now (:func:`cpu_mark`, :func:`other_work`).

Nothing here reads the environment: the command line passes the folder of the saved files.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ds4tui.engine.errors import SchedulerPricesError
from ds4tui.engine.fs import NAMED_CODES, fix_for, unwritable
from ds4tui.engine.stats import MAX_BLOCK

#: The ``scheduler_prices`` modes.
MODES = ("fresh", "engine", "saved")
#: The version of the saved file's layout.
FORMAT = 1
#: A session starts with at most this many carried verifies at draft position 0 (spec dspark.md §7.4):
#: its own acceptance (another kind of prompt's, say prose after code) outweighs them within a few
#: drafted cycles.
PRIOR_VERIFIES = 8
#: The kept prices hold at most this many verifies at draft position 0 (what the sessions so far
#: measured, of which each new session starts with PRIOR_VERIFIES' worth).
KEPT_VERIFIES = 32
#: A session's mean plain decode replaces the moving average's t_ver(1) in the kept prices after this many.
KEEP_MIN_DECODES = 8
#: The longest time a saved price may hold (ms): a pass of a minute is no price of a cycle.
MAX_MS = 60_000.0
#: The widest verify: the anchor and a full block (ds4_engine.h's DS4_DSPARK_MAX_BLOCK + 1).
MAX_WIDTH = MAX_BLOCK + 1
#: Kept verify and proposal times older than this (seconds since a session last measured one) are
#: left out of a new session's start, so that its first drafted cycle re-times them (spec dspark.md
#: §7.4): times measured while other work held the cores can price drafting out, and a scheduler that
#: never drafts never measures them again.
RETIME_AFTER_S = 3600.0
#: A time stamped later than the clock by more than this is not believed (a clock set back, prices
#: copied from another machine): the time counts as measured at an unknown time.
FUTURE_SLACK_S = 60.0
#: Kept verify and proposal times measured while other work kept this many cores more or fewer busy
#: than it does now are left out of a new session's start as well (spec dspark.md §7.4): a verify
#: slows with the load far more than a decode (on the demo model's CPU run verify(6) ~3.2 ms quiet and
#: 5.48 ms with another job on both cores, a decode ~1.5 and 1.58 ms), so the decode cannot tell that
#: the load changed.
RETIME_OTHER_CORES = 1.0
#: The shortest time over which :func:`other_work` measures the other work (s): over less, the
#: kernel's clock ticks (10 ms) make it too coarse to compare with a core.
OTHER_WORK_MIN_S = 0.1
#: Where Linux keeps the machine's CPU time.
PROC_STAT = "/proc/stat"


@dataclass(frozen=True)
class SchedulerPrices:
    """The scheduler's prices and acceptance counts (spec dspark.md §7.4).

    ``t_ver``: verify width n (1..17, 1 = a plain decode) → ms; ``t_prop``: the full proposal in ms
    (None: not measured); ``reached[k]`` / ``hit[k]`` (k = 0..15): verifies that reached draft
    position k, and those that accepted it; ``verify_timed_at`` (width n > 1 → Unix seconds) and
    ``proposal_timed_at``: when a session last measured each verify time and the proposal's (a time
    with no stamp, as in files written before they were recorded, was measured at an unknown time;
    the C struct holds no stamps, and ``==`` compares the prices, not their stamps);
    ``verify_other_work`` (width → cores) and ``proposal_other_work``: the cores other processes kept
    busy just before the session that measured each (:func:`other_work`; absent: not known)."""

    t_ver: dict[int, float] = field(default_factory=dict)
    t_prop: float | None = None
    reached: tuple[int, ...] = (0,) * MAX_BLOCK
    hit: tuple[int, ...] = (0,) * MAX_BLOCK
    verify_timed_at: dict[int, float] = field(default_factory=dict, compare=False)
    proposal_timed_at: float | None = field(default=None, compare=False)
    verify_other_work: dict[int, float] = field(default_factory=dict, compare=False)
    proposal_other_work: float | None = field(default=None, compare=False)

    @property
    def learnt(self) -> bool:
        """True when anything was measured."""
        return bool(self.t_ver) or self.t_prop is not None or any(self.reached)

    # -- the C struct --------------------------------------------------------------------------
    @classmethod
    def from_native(cls, p) -> "SchedulerPrices":
        """From a ``ds4_dspark_prices *``."""
        return cls(t_ver={n: float(p.t_ver[n]) for n in range(1, MAX_WIDTH + 1) if p.has_ver[n]},
                   t_prop=float(p.t_prop) if p.has_prop else None,
                   reached=tuple(int(p.reached[k]) for k in range(MAX_BLOCK)),
                   hit=tuple(int(p.hit[k]) for k in range(MAX_BLOCK)))

    def to_native(self, ffi):
        """A new ``ds4_dspark_prices *`` holding these prices."""
        p = ffi.new("ds4_dspark_prices *")
        for n, ms in self.t_ver.items():
            p.t_ver[n] = ms
            p.has_ver[n] = 1
        if self.t_prop is not None:
            p.t_prop, p.has_prop = self.t_prop, 1
        for k in range(MAX_BLOCK):
            p.reached[k], p.hit[k] = self.reached[k], self.hit[k]
        return p

    # -- JSON ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """``{"t_ver_ms": {"1": ms, ...}, "t_prop_ms": ms | None, "reached": [...], "hit": [...],
        "verify_timed_at": {"6": s, ...}, "proposal_timed_at": s | None, "verify_other_work_cores": {"6":
        cores, ...}, "proposal_other_work_cores": cores | None}``."""
        return {"t_ver_ms": {str(n): ms for n, ms in sorted(self.t_ver.items())}, "t_prop_ms": self.t_prop,
                "reached": list(self.reached), "hit": list(self.hit),
                "verify_timed_at": {str(n): at for n, at in sorted(self.verify_timed_at.items())},
                "proposal_timed_at": self.proposal_timed_at,
                "verify_other_work_cores": {str(n): c for n, c in sorted(self.verify_other_work.items())},
                "proposal_other_work_cores": self.proposal_other_work}

    @classmethod
    def from_dict(cls, d, where: str = "prices") -> "SchedulerPrices":
        """The inverse of :meth:`to_dict`; :class:`SchedulerPricesError` naming the field that is
        missing or out of range (``where`` prefixes it)."""
        def bad(name: str, expected: str, found) -> SchedulerPricesError:
            return SchedulerPricesError(f"{where}.{name}: expected {expected}, found {found!r}")

        def time(name: str, v) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= MAX_MS:
                raise bad(name, f"a time > 0 and <= {MAX_MS:g} ms", v)
            return float(v)

        if not isinstance(d, dict):
            raise SchedulerPricesError(f"{where}: expected an object, found "
                                       f"{'nothing' if d is None else 'a JSON ' + _json_kind(d)}")
        tv = d.get("t_ver_ms")
        if not isinstance(tv, dict):
            raise bad("t_ver_ms", "an object of width → ms", tv)
        t_ver = {}
        for key, v in tv.items():
            if not (isinstance(key, str) and key.isdigit() and 1 <= int(key) <= MAX_WIDTH):
                raise bad("t_ver_ms", f"widths 1..{MAX_WIDTH}", key)
            t_ver[int(key)] = time(f"t_ver_ms.{key}", v)
        tp = d.get("t_prop_ms")
        t_prop = None if tp is None else time("t_prop_ms", tp)
        counts = []
        for name in ("reached", "hit"):
            v = d.get(name)
            if (not isinstance(v, list) or len(v) != MAX_BLOCK
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)):
                raise bad(name, f"a list of {MAX_BLOCK} counts >= 0", v)
            counts.append(tuple(v))
        reached, hit = counts
        for k in range(MAX_BLOCK):
            if hit[k] > reached[k]:
                raise bad(f"hit[{k}]", f"at most reached[{k}] = {reached[k]}", hit[k])
        def stamp(name: str, v, what: str = "a time in Unix seconds") -> float | None:
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise bad(name, f"{what} >= 0, or null", v)
            return float(v)

        def by_width(name: str, unit: str, what: str) -> dict[int, float]:
            v = d.get(name)
            if v is None:
                return {}
            if not isinstance(v, dict):
                raise bad(name, f"an object of width → {unit}", v)
            out = {}
            for key, x in v.items():
                if not (isinstance(key, str) and key.isdigit() and 2 <= int(key) <= MAX_WIDTH):
                    raise bad(name, f"widths 2..{MAX_WIDTH}", key)
                if (got := stamp(f"{name}.{key}", x, what)) is not None:
                    out[int(key)] = got
            return out

        # all absent in files written before they were recorded: every time's moment and load unknown
        verify_at = by_width("verify_timed_at", "Unix seconds", "a time in Unix seconds")
        pa = stamp("proposal_timed_at", d.get("proposal_timed_at"))
        verify_other = by_width("verify_other_work_cores", "cores", "a number of cores")
        po = stamp("proposal_other_work_cores", d.get("proposal_other_work_cores"), "a number of cores")
        return cls(t_ver, t_prop, reached, hit, verify_at, pa, verify_other, po)

    # -- carrying them over ------------------------------------------------------------------------
    def capped(self, verifies: int = PRIOR_VERIFIES) -> "SchedulerPrices":
        """These prices with the counts scaled so that at most ``verifies`` reached position 0
        (every count times the same factor, rounded: the acceptance ratios stay)."""
        top = max(self.reached)
        if top <= verifies:
            return self
        f = verifies / top
        reached = tuple(int(round(r * f)) for r in self.reached)
        hit = tuple(min(int(round(h * f)), r) for h, r in zip(self.hit, reached))
        return SchedulerPrices(dict(self.t_ver), self.t_prop, reached, hit, dict(self.verify_timed_at),
                               self.proposal_timed_at, dict(self.verify_other_work), self.proposal_other_work)

    def stale(self, now: float) -> tuple[list[int], bool, float]:
        """The verify widths and whether the proposal whose times are too old to start a session from
        (``now`` in Unix seconds): measured over :data:`RETIME_AFTER_S` ago, at an unknown time, or
        stamped later than the clock by over :data:`FUTURE_SLACK_S`; and the oldest age in seconds
        among them (infinity for an unknown moment; 0.0 when nothing is stale)."""
        def age(at: float | None) -> float:
            return math.inf if at is None or at > now + FUTURE_SLACK_S else max(0.0, now - at)

        widths = [n for n in sorted(self.t_ver) if n > 1 and age(self.verify_timed_at.get(n)) > RETIME_AFTER_S]
        prop = self.t_prop is not None and age(self.proposal_timed_at) > RETIME_AFTER_S
        ages = [age(self.verify_timed_at.get(n)) for n in widths] + ([age(self.proposal_timed_at)] if prop else [])
        return widths, prop, max(ages, default=0.0)

    def reloaded(self, other: float | None) -> tuple[list[int], bool, float]:
        """The verify widths and whether the proposal whose times were measured while other work kept
        :data:`RETIME_OTHER_CORES` or more cores busier or idler than the ``other`` cores it keeps
        busy now (None: not known, nothing is named; a time whose load was not recorded is not named
        either), and the cores of other work at the time that differs most (0.0 when none)."""
        if other is None:
            return [], False, 0.0

        def changed(c: float | None) -> bool:
            return c is not None and abs(other - c) >= RETIME_OTHER_CORES

        widths = [n for n in sorted(self.t_ver) if n > 1 and changed(self.verify_other_work.get(n))]
        prop = self.t_prop is not None and changed(self.proposal_other_work)
        loads = [self.verify_other_work[n] for n in widths] + ([self.proposal_other_work] if prop else [])
        return widths, prop, max(loads, key=lambda c: abs(other - c), default=0.0)

    def last_timed(self, now: float) -> float | None:
        """Seconds since a session last measured one of the verify or proposal times (``now`` in Unix
        seconds; a stamp later than the clock by over :data:`FUTURE_SLACK_S` is not believed), or
        None when no stamp is believed (times only of files written before they were stamped)."""
        stamps = [at for at in (*self.verify_timed_at.values(), self.proposal_timed_at)
                  if at is not None and at <= now + FUTURE_SLACK_S]
        return max(0.0, now - max(stamps)) if stamps else None

    def without_stale(self, now: float, other: float | None = None) -> "SchedulerPrices":
        """These prices less the times :meth:`stale` and :meth:`reloaded` name: a session started from
        them drafts to price them again (spec dspark.md §7.4); the plain decode's time and the counts
        stay."""
        widths, prop, _ = self.stale(now)
        lw, lp, _ = self.reloaded(other)
        widths, prop = set(widths) | set(lw), prop or lp
        t_ver = {n: ms for n, ms in self.t_ver.items() if n not in widths}
        at = {n: a for n, a in self.verify_timed_at.items() if n in t_ver}
        load = {n: c for n, c in self.verify_other_work.items() if n in t_ver}
        return SchedulerPrices(t_ver, None if prop else self.t_prop, self.reached, self.hit, at,
                               None if prop else self.proposal_timed_at, load,
                               None if prop else self.proposal_other_work)

    def merged(self, start: "SchedulerPrices | None", end: "SchedulerPrices",
               now: float | None = None, other: float | None = None,
               left_out: tuple = ((), False)) -> "SchedulerPrices":
        """These (the engine's) prices after a session that started from ``start`` (None: fresh)
        ended with ``end``: every time the session holds replaces the kept one (its moving average
        already started from it), the others stay; a time the session started with and never
        re-timed (a session that did not draft times only plain decodes) is scaled by how its plain
        decode changed (``end`` over ``start``, within [½, 2]), so that the kept verify and proposal
        stay in the ratio to a decode they were measured in; the counts add what the session added;
        each time the session measured is stamped ``now`` (Unix seconds, default the clock's) and
        ``other`` (the cores of other work the session saw at its start, None: not known), the others
        keep their stamps; ``left_out`` (verify widths, the proposal: whether it was): the kept times
        :meth:`without_stale` left out of the session's start, of which those the session did not
        measure again go (else every later session would find them stale and say so again: a run that
        drafts 6 wide never re-times verify(2)); then :meth:`capped` at :data:`KEPT_VERIFIES`."""
        s = start or SchedulerPrices()
        gone_widths = {n for n in left_out[0] if n > 1 and n not in end.t_ver}
        gone_prop = bool(left_out[1]) and end.t_prop is None
        now = time.time() if now is None else now
        verify_at, verify_other = dict(self.verify_timed_at), dict(self.verify_other_work)
        for n, ms in end.t_ver.items():
            if n > 1 and s.t_ver.get(n) != ms:
                verify_at[n] = now
                verify_other.pop(n, None)
                if other is not None:
                    verify_other[n] = other
        proposal_at, proposal_other = self.proposal_timed_at, self.proposal_other_work
        if end.t_prop is not None and end.t_prop != s.t_prop:
            proposal_at, proposal_other = now, other
        t1, t1_start = end.t_ver.get(1), s.t_ver.get(1)
        scale = min(2.0, max(0.5, t1 / t1_start)) if t1 and t1_start else 1.0
        t_ver = dict(self.t_ver)
        for n, ms in end.t_ver.items():
            t_ver[n] = ms * scale if n > 1 and s.t_ver.get(n) == ms else ms
        for n in gone_widths:
            t_ver.pop(n, None)
            verify_at.pop(n, None)
            verify_other.pop(n, None)
        t_prop = self.t_prop
        if end.t_prop is not None:
            t_prop = end.t_prop * scale if s.t_prop == end.t_prop else end.t_prop
        elif gone_prop:
            t_prop, proposal_at, proposal_other = None, None, None
        reached = tuple(a + max(0, b - c) for a, b, c in zip(self.reached, end.reached, s.reached))
        hit = tuple(a + max(0, b - c) for a, b, c in zip(self.hit, end.hit, s.hit))
        hit = tuple(min(h, r) for h, r in zip(hit, reached))
        return SchedulerPrices(t_ver, t_prop, reached, hit, verify_at, proposal_at, verify_other,
                               proposal_other).capped(KEPT_VERIFIES)

    def summary(self) -> str:
        """One line: the decode, the widest verify and the proposal in ms, acceptance at position 0."""
        parts = []
        if 1 in self.t_ver:
            parts.append(f"decode {self.t_ver[1]:.2f} ms")
        wide = max((n for n in self.t_ver if n > 1), default=None)
        if wide is not None:
            parts.append(f"verify({wide}) {self.t_ver[wide]:.2f} ms")
        if self.t_prop is not None:
            parts.append(f"proposal {self.t_prop:.2f} ms")
        if self.reached[0]:
            parts.append(f"first draft accepted {self.hit[0]}/{self.reached[0]}")
        return ", ".join(parts) or "nothing measured"


def _names(widths, prop: bool) -> str:
    names = [f"verify({n})" for n in widths] + (["the proposal"] if prop else [])
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def age_words(seconds: float) -> str:
    """An age as the notes say it: minutes under an hour and a half, hours with one decimal from there."""
    if seconds < 60:
        return "under a minute"
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def retimed_words(retimed: list[dict]) -> str:
    """``Session.scheduler_prices_retimed``'s list in words: ``"drafting re-timed the kept
    verify(6) 4.12 → 3.05 ms and proposal 1.30 → 1.21 ms"``; "" for an empty list."""
    if not retimed:
        return ""
    parts = [f"{r['time']} {r['kept_ms']:.2f} → {r['now_ms']:.2f} ms" for r in retimed]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"drafting re-timed the kept {listed}"


def retime_reason(kept: SchedulerPrices, now: float, other: float | None = None) -> str:
    """Why a new session does not start from some of the verify and proposal times in ``kept``
    (:meth:`SchedulerPrices.stale`, and :meth:`SchedulerPrices.reloaded` for ``other``, the cores
    other work keeps busy now; ``now`` in Unix seconds), in words, or "" when it starts from all of
    them (spec dspark.md §7.4)."""
    widths, prop, age = kept.stale(now)
    parts = []
    if widths or prop:
        when = ("at a time they do not record (or one later than this machine's clock)" if math.isinf(age)
                else f"{age_words(age)} ago")
        parts.append(f"the kept times of {_names(widths, prop)} were measured {when} (over "
                     f"{RETIME_AFTER_S / 3600:g} h)")
    lw, lp, cores = kept.reloaded(other)
    lw, lp = [n for n in lw if n not in widths], lp and not prop
    if lw or lp:
        parts.append(f"the kept times of {_names(lw, lp)} were measured while other work kept {cores:.1f} cores "
                     f"busy, and it keeps {other:.1f} busy now (a change of {RETIME_OTHER_CORES:g} or more)")
    return "; ".join(parts) + ": drafting re-times them" if parts else ""


def cpu_mark(stat: str | os.PathLike = PROC_STAT) -> tuple[float, float | None, float]:
    """A mark for :func:`other_work`: (the monotonic clock, the CPU seconds every core of the machine
    spent busy — user, nice, system, irq, softirq and steal time in ``stat``, Linux's
    ``/proc/stat``; None where it cannot be read —, this process's CPU seconds, all its threads)."""
    busy = None
    try:
        with open(stat, encoding="ascii") as f:
            fields = f.readline().split()
        if fields and fields[0] == "cpu" and len(fields) >= 9:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
            busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        busy = None
    return time.monotonic(), busy, time.process_time()


#: :func:`open_mark` measures from :func:`mark_start`'s mark when an engine opens within this many
#: seconds of it.
START_MARK_MAX_S = 60.0
_start_mark: tuple | None = None


def mark_start() -> None:
    """Take the mark that an engine opening soon after measures the other work from
    (:func:`open_mark`): the command line takes it as a command that opens an engine starts, a few
    tenths of a second (its imports, the model's load) before the engine opens.  Once a process."""
    global _start_mark
    if _start_mark is None:
        _start_mark = cpu_mark()


def open_mark(now: tuple | None = None) -> tuple:
    """Where an engine that opens now measures the other work from (spec dspark.md §7.4): the
    :func:`mark_start` mark when it was taken at most :data:`START_MARK_MAX_S` ago, else ``now``
    (:func:`cpu_mark`).  The demo pair opens in milliseconds: from the open alone a command's first
    session could never tell the load (under :data:`OTHER_WORK_MIN_S`); this process's own CPU time
    in between (imports, the model's load) is left out as any of its own is."""
    now = cpu_mark() if now is None else now
    m = _start_mark
    return m if m is not None and 0.0 <= now[0] - m[0] <= START_MARK_MAX_S else now


def other_work(a: tuple, b: tuple) -> float | None:
    """The cores other processes kept busy, on average, between two :func:`cpu_mark`s (the machine's
    busy time less this process's, over the time between them); None when the machine's time cannot
    be read or the marks are less than :data:`OTHER_WORK_MIN_S` apart."""
    wall = b[0] - a[0]
    if a[1] is None or b[1] is None or wall < OTHER_WORK_MIN_S:
        return None
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / wall)


# ---- the saved file ----------------------------------------------------------------------------

def _file_identity(path) -> dict:
    p = Path(path).resolve()
    st = p.stat()
    return {"path": str(p), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def identity(engine) -> dict:
    """What the saved prices of ``engine`` are keyed by: everything that changes what the scheduler
    measures (the model and support files by path, size and modification time, the backend and its
    device, threads, numerics, activations, the GPU options, the block size, the draft vocabulary's
    size, the verify's LM head: lazy prices a verify at the mean over the acceptance it saw) and the
    ds4tui version."""
    from ds4tui import __version__

    gpu = getattr(engine, "gpu_info", None)
    return {"ds4tui": __version__,
            "model": _file_identity(engine.model.path),
            "support": _file_identity(engine.support.path),
            "backend": engine.backend,
            "device": f"{gpu.device_name} ({gpu.device_arch})" if gpu is not None and engine.backend == "hip" else None,
            "n_threads": engine.n_threads, "numerics": engine.numerics, "activations": engine.activations,
            "gpu_layout": engine.gpu_layout if engine.backend == "hip" else None,
            "prefill_gemm": engine.prefill_gemm, "gpu_graphs": engine.gpu_graphs, "block_size": engine.block_size,
            "draft_vocab": getattr(engine, "draft_vocab", 0), "verify_head": getattr(engine, "verify_head", "all"),
            "amx": getattr(engine, "amx", "off")}


#: Identity fields that name the file (the others are checked inside it: a change makes it stale).
_NAMED_BY = ("backend", "device", "n_threads", "numerics", "activations", "gpu_layout", "prefill_gemm",
             "gpu_graphs", "block_size", "draft_vocab", "verify_head", "amx")


def file_for(folder: str | os.PathLike, ident: dict) -> Path:
    """The saved file of ``ident`` in ``folder``: named by a hash of the model and support paths and
    the options, so that a changed file (size, time) or version finds its stale prices and says so."""
    named = {"model": ident["model"]["path"], "support": ident["support"]["path"],
             **{k: ident[k] for k in _NAMED_BY}}
    digest = hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()[:16]
    return Path(folder) / f"{digest}.json"


def load(path: str | os.PathLike, ident: dict) -> SchedulerPrices | None:
    """The prices saved in ``path`` for ``ident``; None when there is no file.
    :class:`SchedulerPricesError` (naming the file and what is wrong) when it cannot be read, is not
    this format, or was measured for something else (the differing keys named)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise SchedulerPricesError(f"{path}: not a scheduler prices file: expected JSON text, found a byte that is "
                                   f"not UTF-8 at offset {exc.start}") from exc
    except OSError as exc:
        raise SchedulerPricesError(f"{path}: cannot read the saved scheduler prices: expected a readable file, "
                                   f"found {_os_problem(exc, 'read')}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchedulerPricesError(f"{path}: not a scheduler prices file (invalid JSON: {exc})") from exc
    if not isinstance(doc, dict):
        raise SchedulerPricesError(f"{path}: expected a scheduler prices file (a JSON object of format {FORMAT}), "
                                   f"found a JSON {_json_kind(doc)}")
    if doc.get("format") != FORMAT:
        raise SchedulerPricesError(f"{path}: expected a scheduler prices file of format {FORMAT}, found format "
                                   f"{doc.get('format')!r}")
    saved = doc.get("identity")
    if saved != ident:
        saved = saved if isinstance(saved, dict) else {}
        keys = sorted((k for k in set(ident) | set(saved) if saved.get(k) != ident.get(k)), key=_identity_order)
        raise SchedulerPricesError(f"{path}: stale scheduler prices, measured for another setup: "
                                   + "; ".join(_difference(k, ident.get(k), saved.get(k), k in saved) for k in keys))
    return SchedulerPrices.from_dict(doc.get("prices"), where=f"{path}: prices")


#: The identity's fields in words, in the order a stale file's differences are said.
_IDENTITY_WORDS = {"ds4tui": "ds4tui version", "model": "model file", "support": "support file", "backend": "backend",
                   "device": "GPU device", "n_threads": "threads", "numerics": "numerics",
                   "activations": "activations", "gpu_layout": "GPU layout", "prefill_gemm": "prefill GEMM",
                   "gpu_graphs": "GPU graphs", "block_size": "block size", "verify_head": "verify head",
                   "amx": "AMX tiles"}


def _identity_order(key: str) -> tuple:
    order = list(_IDENTITY_WORDS)
    return (order.index(key) if key in order else len(order), key)


def _file_words(f: dict, keys) -> str:
    """A saved file identity's ``keys`` (path, bytes, mtime_ns) in words."""
    words = []
    for k in keys:
        v = f.get(k)
        if k == "bytes" and isinstance(v, int):
            words.append(f"{v} bytes")
        elif k == "mtime_ns" and isinstance(v, int):
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(v // 10**9))
            words.append(f"modified {when}.{v % 10**9:09d} UTC")
        elif k == "path":
            words.append(f"at {v}")
        else:
            words.append(f"{k} {v!r}")
    return ", ".join(words)


def _difference(key: str, mine, theirs, recorded: bool) -> str:
    """One field of a stale file in words, with both values: what this run has (expected) and what
    the file was measured with (found)."""
    name = _IDENTITY_WORDS.get(key, key)
    if not recorded:
        return f"{name}: expected {_value_words(mine)} (this run's), found none recorded in the file"
    if isinstance(mine, dict) and isinstance(theirs, dict):
        differ = [k for k in ("path", "bytes", "mtime_ns") if mine.get(k) != theirs.get(k)] or sorted(
            k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if mine.get("path") == theirs.get("path"):
            return (f"the {name} {mine.get('path')} changed since they were measured: expected "
                    f"{_file_words(mine, differ)} (as it is now), found {_file_words(theirs, differ)} (as the "
                    f"prices file records it)")
        return (f"{name}: expected {_file_words(mine, differ)} (this run's), found {_file_words(theirs, differ)} "
                f"(the prices file's)")
    return f"{name}: expected {_value_words(mine)} (this run's), found {_value_words(theirs)} (the prices file's)"


def _value_words(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, dict):
        return _file_words(v, sorted(v))
    return str(v)


def _json_kind(v) -> str:
    """The JSON name of a parsed value's kind (list, string, number, ...)."""
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            dict: "object"}.get(type(v), type(v).__name__)


def save(path: str | os.PathLike, ident: dict, prices: SchedulerPrices) -> None:
    """Write ``prices`` for ``ident`` to ``path`` (the folder made if needed) in one rename, so a
    reader never sees half a file.  OSError when it cannot be written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "what": "ds4tui DSpark scheduler prices (spec dspark.md §7.4)", "identity": ident,
           "prices": prices.to_dict()}
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---- in plain words: a folder or file that cannot be used ----------------------------------------

def _nearest_existing(p: Path) -> Path:
    """``p`` or the nearest folder above it that exists (a file or a link counts)."""
    for q in (p, *p.parents):
        if os.path.lexists(q):
            return q
    return Path(p.anchor or ".")


def folder_problem(folder: str | os.PathLike) -> tuple[str, str] | None:
    """Why ``folder`` cannot hold saved prices, as (what was found, what to do about it), or None
    when it can as far as the file system says: a file where the folder, or a folder above it,
    should be; a folder (or, not yet made, the folder to make it in) on a read-only file system, on a
    full disk, or that this user may not write into (:func:`ds4tui.engine.fs.unwritable`)."""
    folder = Path(folder)
    q = _nearest_existing(folder)
    if not q.is_dir():
        what = "a link to nothing" if q.is_symlink() and not q.exists() else "a file"
        return (f"{what} in its place" if q == folder else f"{what} at {q}, where a folder above it should be",
                f"move {q} away")
    code = unwritable(q)
    if code is None:
        return None
    if code not in NAMED_CODES:  # e.g. /proc: no files at all
        return (f"{'it' if q == folder else f'no such folder, and {q}'}, which cannot be written: {os.strerror(code)}",
                fix_for(q, code))
    if q == folder:
        return {errno.EROFS: "it on a read-only file system", errno.ENOSPC: "no space left on its disk"}.get(
            code, "no permission to write in it"), fix_for(folder, code)
    return {errno.EROFS: f"no such folder, and {q} on a read-only file system",
            errno.ENOSPC: f"no such folder, and no space left on the disk of {q} to make it"}.get(
        code, f"no such folder, and no permission to make it in {q}"), fix_for(q, code)


def keep_advice(fix: str | None = None) -> str:
    """What to do when the saved prices cannot be written: ``fix`` (the folder's own remedy) or
    another cache folder, or a mode that writes no file."""
    return ((f"{fix}, or " if fix else "") + "point XDG_CACHE_HOME at a writable folder (the command line keeps "
            "them in $XDG_CACHE_HOME/ds4tui/scheduler-prices); or run with --scheduler-prices engine (prices kept "
            "within the run) or fresh, which write no file")


def _os_problem(exc: OSError, doing: str) -> str:
    """What an OSError met while ``doing`` ("read" a file, "write" in a folder) found, in words,
    without its errno number or a temporary file's name."""
    code = exc.errno
    if isinstance(exc, IsADirectoryError) or code == errno.EISDIR:
        return "a folder"
    if isinstance(exc, PermissionError) or code in (errno.EACCES, errno.EPERM):
        return "no permission to read it" if doing == "read" else "no permission to write in it"
    if code == errno.ENOTDIR:
        return "a file where a folder above it should be"
    if code == errno.EROFS:
        return "it on a read-only file system"
    if code == errno.ENOSPC:
        return "no space left on its disk"
    if code == getattr(errno, "EDQUOT", None):
        return "its disk quota used up"
    return f"the error '{(exc.strerror or type(exc).__name__).lower()}'"


def blocked(path: str | os.PathLike) -> tuple[str, str, str] | None:
    """Why :func:`save` cannot write ``path`` whatever it holds, as (expected, found, what to do), or
    None when nothing in the way is known before trying: the folder cannot be used
    (:func:`folder_problem`), or a folder stands where the file should be."""
    path = Path(path)
    folder = path.parent
    found = folder_problem(folder)
    if found is not None:
        return (f"a writable folder {folder}", *found)
    if path.is_dir():
        return "a file there or none", "a folder", f"remove the folder {path}"
    return None


def read_advice(path: str | os.PathLike) -> str:
    """What to do about a saved prices file :func:`load` could not use, said after its problem: when
    :func:`blocked` knows a write would fail too, that (expected, found) and its remedy; else
    nothing, since a session that closes writes over the file."""
    known = blocked(path)
    if known is None:
        return ("Nothing to do: a session that closes writes its prices over the file if it can, and says so "
                "if it cannot")
    expected, what, fix = known
    return (f"A session that closes cannot write them there either: expected {expected}, found {what}. "
            f"To keep them between runs, {keep_advice(fix)}")


def write_problem(path: str | os.PathLike, exc: OSError) -> str:
    """Why :func:`save` could not write ``path`` (``exc``) in plain words: the file, what was
    expected and what was found in its place, and what to do."""
    path = Path(path)
    folder = path.parent
    known = blocked(path)
    if known is not None:
        expected, *found = known
    else:
        expected = f"a writable folder {folder}"
        fix = {errno.EACCES: fix_for(folder, errno.EACCES), errno.EPERM: fix_for(folder, errno.EACCES),
               errno.EROFS: fix_for(folder, errno.EROFS), errno.ENOSPC: fix_for(folder, errno.ENOSPC),
               getattr(errno, "EDQUOT", -1): fix_for(folder, errno.ENOSPC)}.get(exc.errno)
        found = (_os_problem(exc, "write"), fix)
    what, fix = found
    return (f"cannot write the scheduler prices to {path}: expected {expected}, found {what}; "
            f"this run keeps them in memory only. To keep them between runs, {keep_advice(fix)}")
