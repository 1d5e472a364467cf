"""The speculation panes: knobs, acceptance, stage timings, no-draft reasons, throughput, support.

Each pane renders one snapshot (``DSparkStats``, ``SpecView``, ``DSparkKnobs``) it is handed by
the app; none of them reads the engine.  Stat names are ds4's (spec dspark.md §6).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.validation import Integer, Number
from textual.widgets import Input, Label, Select, Static, Switch

from ds4tui.engine.backend import DEFAULT_SCHEDULER_POLICY, SCHEDULER_POLICIES
from ds4tui.engine.stats import NO_DRAFT_HELP, NO_DRAFT_REASONS, DSparkStats, timed_stages
from ds4tui.engine.timeline import RATE_S, SpecView
from ds4tui.widgets.pane import Pane
from ds4tui.widgets.series import bar, rows, spark

SPARK_WIDTH = 36


def seconds(ms: float, signed: bool = False) -> str:
    """``ms`` milliseconds as seconds to 0.01 s; ``signed``: with ``+`` for a gain and ``−`` for a
    loss.  A value that rounds to zero is ``0.00`` either way (no ``−0.00`` for a loss of 3 ms)."""
    s = round(ms / 1000, 2) + 0.0  # + 0.0: -0.0 is 0.0
    if s == 0:
        return "0.00"
    return f"{'+' if s > 0 else '−'}{abs(s):.2f}" if signed else f"{s:.2f}"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}%"


class PolicySelect(Select):
    """The knobs pane's selector of the scheduler's policy; posts :class:`Closed` when its list closes."""

    class Closed(Message):
        """The list closed: a policy chosen (the one shown too, which changes nothing) or Esc."""

    def watch_expanded(self, expanded: bool) -> None:
        if not expanded:
            self.post_message(self.Closed())


class KnobsPane(Vertical):
    """DSpark on/off, scheduler on/off, confidence threshold and max draft length: two pairs a row, or one
    a row in a pane narrower than :attr:`ROW_WIDTH`; then the scheduler's policy (spec dspark.md §7.6).

    The app listens to ``Switch.Changed`` (ids ``dspark``, ``scheduler``), ``Input.Submitted``
    (ids ``threshold``, ``max-draft``) and ``Select.Changed`` (id ``policy``) and calls the engine's
    setters; ``show`` reflects the knobs the engine reports without firing those events."""

    DEFAULT_CSS = """
    KnobsPane { height: auto; border: round $accent; padding: 0 1; }
    KnobsPane Horizontal { height: 1; }
    KnobsPane Label { width: 11; }
    KnobsPane Switch, KnobsPane Switch:focus { width: 8; height: 1; border: none; padding: 0; margin-right: 2; }
    KnobsPane Input, KnobsPane Input.-textual-compact { width: 8; padding: 0 1; margin-right: 2; }
    KnobsPane Input:focus { background: $accent 30%; }
    KnobsPane Input.-invalid:focus { background: $error 45%; }
    KnobsPane Switch:focus { background: $accent 30%; }
    KnobsPane #knob-note { color: $text-muted; }
    KnobsPane Select { width: 16; }
    KnobsPane.-stacked Horizontal { layout: grid; grid-size: 2; grid-columns: 11 10; grid-rows: 1; height: 2; }
    KnobsPane.-stacked #policy-row { grid-columns: 11 16; height: 1; }
    """

    #: Columns a row of two label + control pairs takes (labels 11, the first control 8 + its margin 2, the
    #: second 8); a narrower pane (the panes in the chat's place in a 40-column window) stacks the pairs, a
    #: pair a row, where the second pair was cut off at the border.
    ROW_WIDTH = 40

    def on_resize(self) -> None:
        self.set_class(self.content_size.width < self.ROW_WIDTH, "-stacked")

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Label("DSpark")
            yield Switch(value=False, id="dspark", disabled=True)
            yield Label("scheduler")
            yield Switch(value=False, id="scheduler", disabled=True)
        with Horizontal():
            yield Label("confidence")
            # compact: one row, no border, in every state (a focused or invalid field keeps its text in view).
            # Plain text fields checked by their validators: Textual's number/integer types drop any
            # input that would not parse as they type it, and a burst (a paste) of "1.5 " or "1,5" was
            # dropped whole, the field left empty; kept as typed, Enter's message quotes it.
            yield Input("", id="threshold", type="text", validators=[Number(0.0, 1.0)], disabled=True, compact=True,
                        tooltip="confidence threshold 0..1 (F7/F8: -/+0.05); Enter applies, Esc leaves the field")
            yield Label("max draft")
            yield Input("", id="max-draft", type="text", validators=[Integer(1, 16)], disabled=True, compact=True,
                        tooltip="drafts per cycle, 1..block size (F9/F10: -/+1); Enter applies, Esc leaves the field")
        with Horizontal(id="policy-row"):
            yield Label("policy")
            yield PolicySelect([(p, p) for p in SCHEDULER_POLICIES], allow_blank=False, value=DEFAULT_SCHEDULER_POLICY,
                         id="policy", disabled=True, compact=True,
                         tooltip="the scheduler's policy (Ctrl+R switches): confidence verifies the drafts whose "
                         "calibrated confidences pay; acceptance drafts where the acceptance measured so far pays")
        yield Static("", id="knob-note")

    _note = ""

    def on_mount(self) -> None:
        self.border_title = "DSpark knobs"

    def show(self, knobs, *, note: str = "", block: int = 16, read_only: bool = False) -> None:
        """``knobs``: ``DSparkKnobs`` or None (no support model: the controls are disabled);
        ``read_only``: the knobs of a stats export, shown with the controls disabled."""
        enabled = knobs is not None
        for sid, val in (("dspark", knobs.enabled if enabled else False),
                         ("scheduler", knobs.scheduler if enabled else False)):
            sw = self.query_one(f"#{sid}", Switch)
            sw.disabled = not enabled or read_only
            if sw.value != val:
                with sw.prevent(Switch.Changed):
                    sw.value = val
        for iid, text in (("threshold", threshold_text(knobs.threshold) if enabled else ""),
                          ("max-draft", str(knobs.max_draft) if enabled else "")):
            inp = self.query_one(f"#{iid}", Input)
            inp.disabled = not enabled or read_only
            if not inp.has_focus and inp.value != text:
                with inp.prevent(Input.Changed):
                    inp.value = text
        sel = self.query_one("#policy", Select)
        sel.disabled = not enabled or read_only
        if enabled and sel.value != knobs.policy:
            with sel.prevent(Select.Changed):
                sel.value = knobs.policy
        self.query_one("#max-draft", Input).validators = [Integer(1, max(1, block))]
        if enabled:
            state = knobs_state(knobs, policy=False)  # one row of the pane: the selector above shows the policy
            note = f"{state}\n{note}" if note else state
        if note != self._note:
            self._note = note
            self.query_one("#knob-note", Static).update(note)


#: The acceptance pane's tooltip once a stop token cut a cycle (``DSparkStats.stop_cut``).
STOP_CUT_HELP = ("stop_cut {n}: cycles where a stop token was among the accepted drafts. The drafts after it "
                 "were never emitted, so accepted_draft, the accepted-length histogram and per-position "
                 "acceptance count only the drafts up to the stop, while full/partial stay as the verifier "
                 "decided: a full cycle cut this way shows in no histogram bin at its draft length.")


class AcceptPane(Pane):
    """Accept rate (ds4's ``accept_rate``: accepted_draft / proposed, said "of proposed": not the
    answer summary's share of output tokens) for the session and the recent window, in one row of
    the narrowest pane (43 columns in a 150-column window), its series (▲ = knob change), mean
    accepted length and per-position acceptance (accepted / verified drafts at block row k); the
    counts (cycles, proposed, accepted_draft, with ``stop_cut`` and a tooltip that explains it once
    a stop token cut a cycle) and the outcomes, each line one row of that pane at five digits."""

    def show(self, st: DSparkStats | None, view: SpecView, *, support_status: str = "attached") -> None:
        if st is None:
            self.put(Content.styled("no support model: nothing is drafted", "$text-muted"))
            return
        if support_status == "refused":
            self.put(rows([Content.styled("support model refused: nothing is drafted", "$error"),
                           Content(f"cycles {st.cycles} · every one is a no_draft cycle (support_invalid)")]))
            return
        line, marks = spark(view.accept_series, SPARK_WIDTH, lo=0.0, hi=100.0, marks=view.marks)
        out = [
            # a share of the proposed drafts: named, beside the summary's share of output tokens
            Content.assemble("accept ", (_pct(view.session_accept), "bold"), " of proposed · ",
                             (_pct(view.recent_accept), "bold"), " recent"),
            Content(f"avg accepted {st.avg_accept:.2f}/cycle · {st.tokens_per_cycle:.2f} tok/cycle"),
            # the counts two by two, each line one row of the narrowest pane with five-digit counts (the
            # three on one line wrapped there, a count below the line of its name); stop_cut beside the
            # accepted_draft it qualifies
            Content(f"cycles {st.cycles} · proposed {st.proposed}"),
            Content(f"accepted_draft {st.accepted_draft}" + (f" · stop_cut {st.stop_cut}" if st.stop_cut else "")),
            Content(f"full {st.full} · partial {st.partial} · miss_first {st.miss_first}"),
            Content.styled(line or " ", "$success"),
        ]
        self.tooltip = STOP_CUT_HELP.format(n=st.stop_cut) if st.stop_cut else None
        if marks.strip():
            out.append(Content.styled(marks, "$warning"))
        # per block row k: accepted / verified drafts (a gap where none was verified)
        rates = st.per_position_accept
        glyphs, _ = spark([None if r is None else 100 * r for r in rates], len(rates), lo=0.0, hi=100.0)
        out.append(Content.assemble(("per position ", "$text-muted"), (glyphs, "$accent"), " ",
                                    " ".join("—" if r is None else f"{100 * r:.0f}" for r in rates), "%"))
        self.put(rows(out))


class StagesPane(Pane):
    """Stage times in the unit each is spent in (``DSparkStats.stage_timing``, spec dspark.md
    §6.2): the drafter's steps (prop_setup … prop_confidence) and their sum per drafter pass,
    verify per drafted cycle, and the plain one-token decode it is weighed against, each with the
    count it is based on; bars share one scale.  A step at 0 ms in every pass so far (one this
    drafter never runs) is left out; the stats line and the JSON keep every name.  Before the
    first cycle every row is drawn with "—", the drafter's steps those the engine times on
    ``backend`` (``timed_stages``: the rows it shows once cycles run; the pane is about as tall from
    the start as it will be: its first figures, while an answer streams, then cost no layout of the
    screen)."""

    def show(self, st: DSparkStats | None, *, backend: str = "cpu") -> None:
        if st is None:
            self.put(Content.styled("no cycles yet", "$text-muted"))
            return
        if st.cycles == 0:
            none = [Content.assemble((f"{name:<16}", "$text-muted"), f"{'—':>8}")
                    for name in (*timed_stages(backend), "propose (sum)")]
            self.put(rows([Content.styled("ms per drafter pass (no cycles yet)", "bold"), *none,
                           Content.styled("ms per drafted cycle · decode", "bold"),
                           *(Content.assemble((f"{name:<16}", "$text-muted"), f"{'—':>8}")
                             for name in ("verify", "plain decode"))]))
            return
        t = st.stage_timing()
        per_pass = t["ms_per_drafter_pass"]
        shown = {name: ms for name, ms in per_pass.items() if name != "propose" and ms}
        verify, decode = t["verify_ms_per_drafted_cycle"], t["decode_ms_per_plain_decode"]
        top = max([v for v in (*shown.values(), per_pass["propose"], verify, decode) if v] or [1.0])

        def row(name: str, ms: float | None) -> Content:
            if ms is None:
                return Content.assemble((f"{name:<16}", "$text-muted"), f"{'—':>8}")
            return Content.assemble((f"{name:<16}", "$text-muted"), f"{ms:8.3f} ", (bar(ms, top, 14), "$secondary"))

        n_pass, n_drafted, n_plain = t["drafter_passes"], t["drafted_cycles"], t["plain_decodes"]
        out: list[Content] = []
        if n_pass:
            out.append(Content.styled(f"ms per drafter pass ({n_pass} pass{'es' if n_pass != 1 else ''})", "bold"))
            out += [row(name, ms) for name, ms in shown.items()]
            out.append(row("propose (sum)", per_pass["propose"]))
        else:
            out.append(Content.styled(f"the drafter has not run in {st.cycles} cycles (see no-draft reasons)",
                                      "$text-muted"))
        out.append(Content.styled(f"ms per drafted cycle ({n_drafted}) · decode ({n_plain})", "bold"))
        out.append(row("verify", verify))
        out.append(row("plain decode", decode))
        if t["verify_over_decode"] is not None:
            out.append(Content(f"one verify = {t['verify_over_decode']:.2f} plain decodes"))
        self.put(rows(out))


class NoDraftPane(Pane):
    """Why cycles made no draft, with counts; the dominant reason is highlighted, and when several
    tie at the top count every one of them, named together ("scheduler_skip = tail_skip (4 each)")
    — the pane that explains a run with zero drafts.  Before the first cycle every reason is listed
    at 0 (the pane is about as tall from the start as it will be)."""

    def show(self, st: DSparkStats | None, *, support_status: str = "none", knobs=None) -> None:
        """``knobs``: the ``DSparkKnobs`` in force now (None: unknown); a dominant reason that they have
        since removed (F2 on after ``disabled``, F3 off after ``scheduler_skip``, a threshold of 0 after
        ``confidence_gate``) is advised as past, not with the key that already did it."""
        if st is None:
            why = "support model refused: every cycle is support_invalid" if support_status == "refused" else \
                "no support model (--mtp SUPPORT.gguf)"
            self.put(Content.styled(why, "$warning"))
            return
        if st.cycles == 0:
            self.put(rows([Content.styled("no cycles yet", "$text-muted"),
                           *(Content(f"{name:<16}{0:>7}") for name in NO_DRAFT_REASONS)]))
            return
        if st.no_draft == 0:
            self.put(Content(f"none — every one of {st.cycles} cycles drafted"))
            return
        top = st.dominant_no_draft_reasons
        mark = "  ◀ dominant" if len(top) == 1 else "  ◀ tied"
        out = [Content(f"no_draft {st.no_draft} of {st.cycles} cycles")]
        for name in NO_DRAFT_REASONS:
            n = st.no_draft_reasons.get(name, 0)
            if not n:
                continue
            if name in top:
                out.append(Content.assemble((f"{name:<16}{n:>7}", "bold reverse $warning"), (mark, "$warning")))
            else:
                out.append(Content(f"{name:<16}{n:>7}"))
        if len(top) > 1:
            out.append(Content.styled(f"dominant: {dominant_words(st)}", "$warning"))
        if st.chain_fail_op:
            out.append(Content.styled(f"last chain_fail op: {st.chain_fail_op}", "$error"))
        for name in top:  # what to do about each dominant reason
            todo = _done_since(name, knobs) or NO_DRAFT_HELP[name][1]
            out.append(Content.assemble(("→ ", "$warning"), f"{name}: {todo}" if len(top) > 1 else todo))
        if top:
            out.append(Content.styled("F1 explains every reason", "$text-muted"))
        self.put(rows(out))
        self.tooltip = explain_reasons(st) if top else None


def _done_since(reason: str, knobs) -> str | None:
    """What the pane says of a no-draft ``reason`` that ``knobs`` (in force now) have removed since its
    cycles ran, instead of the advice to do it; None while the reason can still end cycles."""
    if knobs is None:
        return None
    off = "" if knobs.enabled else "; DSpark is off now as well (F2 turns it on)"
    if reason == "disabled" and knobs.enabled:
        return "DSpark is on now (F2): these cycles ran while it was off; the next cycles draft"
    if reason == "scheduler_skip" and not knobs.scheduler:
        return ("The scheduler is off now (F3): these skips are from before"
                + (", and every cycle from here drafts" if knobs.enabled else off))
    if reason == "confidence_gate" and knobs.threshold == 0:
        return "The threshold is 0 now: these cycles are from before" + (
            ", and no draft is gated from here" if knobs.enabled else off)
    return None


def dominant_words(st: DSparkStats) -> str:
    """The dominant no-draft reasons of ``st`` in words: ``"scheduler_skip (52 cycles)"``, or the
    ones that tie at the top count joined, ``"scheduler_skip = tail_skip (4 each)"``; ``""`` when no
    cycle went without a draft."""
    top = st.dominant_no_draft_reasons
    if not top:
        return ""
    n = st.no_draft_reasons[top[0]]
    if len(top) == 1:
        return f"{top[0]} ({n} cycle{'s' if n != 1 else ''})"
    return f"{' = '.join(top)} ({n} each)"


def explain_reasons(st: DSparkStats | None = None) -> str:
    """Every no-draft reason with why it happens and what to do (:data:`NO_DRAFT_HELP`), with the
    count of each in ``st`` when given; the reasons that occurred first."""
    counts = st.no_draft_reasons if st is not None else {}
    order = sorted(NO_DRAFT_REASONS, key=lambda n: -counts.get(n, 0))
    out = []
    for name in order:
        why, todo = NO_DRAFT_HELP[name]
        n = counts.get(name, 0)
        head = f"{name} ({n} cycle{'s' if n != 1 else ''})" if st is not None else name
        out.append(f"{head}\n  why: {why}\n  what to do: {todo}")
    return "\n\n".join(out)


def knobs_state(knobs, *, policy: bool = True) -> str:
    """DSpark's knobs (``DSparkKnobs``) in one line: "DSpark on · sched confidence · conf 0.30 · max 5" (the
    scheduler's policy, or off); without ``policy`` "sched on" (the knobs pane, whose selector shows it)."""
    on = knobs.policy if policy else "on"
    return (f"DSpark {'on' if knobs.enabled else 'off'} · sched {on if knobs.scheduler else 'off'}"
            f" · conf {threshold_text(knobs.threshold)} · max {knobs.max_draft}")


def threshold_text(v: float) -> str:
    """A confidence threshold as the knobs show it: two decimals (F7/F8 step by 0.05), or as many digits as
    it needs where two would hide it (1e-09 gates drafts where "0.00" read as off)."""
    return f"{v:.2f}" if abs(v - round(v, 2)) < 1e-12 else f"{v:.6g}"


def knob_words(kw: dict, *, unchanged: bool = False) -> str:
    """A knob change in words, for the toast that confirms it ("DSpark off — from the next cycle"), or with
    ``unchanged`` for one that sets what is already in force ("… — already so: nothing changed")."""
    parts = []
    for k, v in kw.items():
        if k == "enabled":
            parts.append(f"DSpark {'on' if v else 'off'}")
        elif k == "scheduler":
            parts.append(f"scheduler {'on' if v else 'off'}")
        elif k == "threshold":
            parts.append(f"confidence threshold {threshold_text(v)}")
        elif k == "max_draft":
            parts.append(f"at most {v} draft{'s' if v != 1 else ''} per cycle")
        elif k == "policy":
            parts.append(f"scheduler policy {v}")
        else:
            parts.append(f"{k} {v}")
    return ", ".join(parts) + (" — already so: nothing changed" if unchanged else " — from the next cycle")


class ThroughputPane(Pane):
    """Decode tokens/s (engine time) and effective tokens/s (wall time of the turn, what the user
    sees) over the same tokens and the same last ``RATE_S`` seconds (``SpecView``; the title says so: an
    answer's line gives its own rate over the whole answer), so their ratio is at most 1,
    their series, the context in use, DSpark's net time saved, and what the interface
    itself costs: ``ui_share``, the UI thread's CPU seconds per second while answers stream (None:
    not measured yet).  The engine shares the interpreter and the cores with the interface, so a
    large share means the rates above are slower than the engine alone would be."""

    def show(self, view: SpecView, st: DSparkStats | None, *, n_tokens: int, n_ctx: int,
             ui_share: float | None = None, ui_streamed_s: float = 0.0, ui_min_s: float = 1.0) -> None:
        """``ui_streamed_s``: how long answers have streamed (while ``ui_share`` is None: shorter
        than ``ui_min_s``, too short to say)."""
        def tps(v: float | None) -> str:  # whole tokens from 100 t/s: the line fits a 43-column pane at 9999 t/s
            return "—" if v is None else f"{v:.1f}" if v < 99.95 else f"{v:.0f}"

        # the window the rates cover, in the title (an answer's own line gives its rate over the whole answer)
        self.border_title = f"throughput · last {RATE_S:g} s"
        ratio = (view.effective_tps / view.decode_tps) if view.effective_tps and view.decode_tps else None
        shown = view.decode_series[-SPARK_WIDTH:] + view.effective_series[-SPARK_WIDTH:]
        finite = [v for v in shown if v is not None]
        top = max(finite) if finite else None  # one scale for both series, so they compare: of the points drawn
        dec, marks = spark(view.decode_series, SPARK_WIDTH, hi=top, marks=view.marks)
        eff, _ = spark(view.effective_series, SPARK_WIDTH, hi=top)
        out = [
            Content.assemble("decode ", (tps(view.decode_tps), "bold"), " · effective ",
                             (tps(view.effective_tps), "bold"), " t/s",
                             "" if ratio is None else f" ({ratio:.2f}×)"),
            Content.assemble(("dec ", "$text-muted"), (dec, "$success")),
            Content.assemble(("eff ", "$text-muted"), (eff, "$accent")),
        ]
        if marks.strip():
            out.append(Content.styled("    " + marks, "$warning"))
        out += self._tail(st, n_tokens, n_ctx)
        if ui_share is None and ui_streamed_s > 0:
            out.append(Content.styled(f"interface cost: after {ui_min_s:g} s; {ui_streamed_s:.1f} s streamed",
                                      "$text-muted"))  # each line one row of the narrowest pane (43 columns)
        elif ui_share is None:
            out.append(Content.styled("interface cost: measured while streaming", "$text-muted"))
        else:
            out.append(Content.assemble("interface ", (f"{100 * ui_share:.1f}%", "bold"), " of a core while streaming"))
        self.put(rows(out))

    def show_export(self, stats, st: DSparkStats | None, *, n_tokens: int, n_ctx: int,
                    ui_share: float | None) -> None:
        """A stats export's figures: the decode rate its counters give (tokens over the engine's
        decode time: the session's average), no series and no effective rate (an export holds
        neither), and the interface cost it recorded (``ui_share`` None: none recorded)."""
        decode_tps = 1000.0 * stats.n_decode_tokens / stats.decode_ms if stats.decode_ms > 0 else None
        self.border_title = "throughput"
        out = [
            Content.assemble("decode ", ("—" if decode_tps is None else f"{decode_tps:.1f}", "bold"),
                             " t/s: the session's average"),
            Content.styled("effective —, series: not in an export", "$text-muted"),
        ]
        out += self._tail(st, n_tokens, n_ctx)
        if ui_share is None:
            out.append(Content.styled("interface cost: not in the export", "$text-muted"))
        else:
            out.append(Content.assemble("interface ", (f"{100 * ui_share:.1f}%", "bold"), " of a core while streaming"))
        self.put(rows(out))

    @staticmethod
    def _tail(st: DSparkStats | None, n_tokens: int, n_ctx: int) -> list[Content]:
        out = [Content(f"context {n_tokens}/{n_ctx} tokens")]
        if st is not None:
            if st.t_decode_measured:
                out.append(Content.assemble("net saved ", (f"{seconds(st.net_saved, signed=True)} s", "bold"),
                                            f" · saved {seconds(st.saved)} s"))
            else:
                out.append(Content.styled("net saved unknown: no plain decode timed yet", "$text-muted"))
        return out


class SupportPane(Pane):
    """The support model's health: attached / refused (with the reason) / none, and its summary."""

    def show(self, status: str, summary: str, message: str, knobs=None) -> None:
        style = {"attached": "bold $success", "refused": "bold $error"}.get(status, "$text-muted")
        out = [Content.assemble("support ", (status, style))]
        if summary:
            out.append(Content(summary))
        if status == "refused":
            out.append(Content.styled(message, "$error"))
        elif status == "none":
            out.append(Content.styled("start with --mtp SUPPORT.gguf to draft", "$text-muted"))
        self.put(rows(out))
