"""The speculation panes: knobs, acceptance, stage timings, no-draft reasons, throughput, support.

Each pane renders one snapshot (``DSparkStats``, ``SpecView``, ``DSparkKnobs``) it is handed by
the app; none of them reads the engine.  Stat names are ds4's (spec dspark.md §6).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.validation import Integer, Number
from textual.widgets import Input, Label, Static, Switch

from ds4tui.engine.stats import NO_DRAFT_REASONS, DSparkStats
from ds4tui.engine.timeline import SpecView
from ds4tui.widgets.pane import Pane
from ds4tui.widgets.series import bar, rows, spark

SPARK_WIDTH = 36


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}%"


class KnobsPane(Vertical):
    """DSpark on/off, scheduler on/off, confidence threshold and max draft length.

    The app listens to ``Switch.Changed`` (ids ``dspark``, ``scheduler``) and ``Input.Submitted``
    (ids ``threshold``, ``max-draft``) and calls the engine's setters; ``show`` reflects the knobs
    the engine reports without firing those events."""

    DEFAULT_CSS = """
    KnobsPane { height: auto; border: round $accent; padding: 0 1; }
    KnobsPane Horizontal { height: 1; }
    KnobsPane Label { width: 11; }
    KnobsPane Switch, KnobsPane Switch:focus { width: 8; height: 1; border: none; padding: 0; margin-right: 3; }
    KnobsPane Input, KnobsPane Input:focus { width: 8; height: 1; border: none; padding: 0 1; margin-right: 3; }
    KnobsPane Input:focus { background: $accent 30%; }
    KnobsPane Switch:focus { background: $accent 30%; }
    KnobsPane #knob-note { color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Label("DSpark")
            yield Switch(value=False, id="dspark", disabled=True)
            yield Label("scheduler")
            yield Switch(value=False, id="scheduler", disabled=True)
        with Horizontal():
            yield Label("confidence")
            yield Input("", id="threshold", type="number", validators=[Number(0.0, 1.0)], disabled=True,
                        tooltip="confidence threshold 0..1 (F7/F8: -/+0.05); Enter applies")
            yield Label("max draft")
            yield Input("", id="max-draft", type="integer", validators=[Integer(1, 16)], disabled=True,
                        tooltip="drafts per cycle, 1..block size; Enter applies")
        yield Static("", id="knob-note")

    _note = ""

    def on_mount(self) -> None:
        self.border_title = "DSpark knobs"

    def show(self, knobs, *, note: str = "", block: int = 16) -> None:
        """``knobs``: ``DSparkKnobs`` or None (no support model: the controls are disabled)."""
        enabled = knobs is not None
        for sid, val in (("dspark", knobs.enabled if enabled else False),
                         ("scheduler", knobs.scheduler if enabled else False)):
            sw = self.query_one(f"#{sid}", Switch)
            sw.disabled = not enabled
            if sw.value != val:
                with sw.prevent(Switch.Changed):
                    sw.value = val
        for iid, text in (("threshold", f"{knobs.threshold:.2f}" if enabled else ""),
                          ("max-draft", str(knobs.max_draft) if enabled else "")):
            inp = self.query_one(f"#{iid}", Input)
            inp.disabled = not enabled
            if not inp.has_focus and inp.value != text:
                with inp.prevent(Input.Changed):
                    inp.value = text
        self.query_one("#max-draft", Input).validators = [Integer(1, max(1, block))]
        if enabled:
            state = (f"DSpark {'on' if knobs.enabled else 'off'} · sched {'on' if knobs.scheduler else 'off'}"
                     f" · threshold {knobs.threshold:.2f} · drafts ≤ {knobs.max_draft}")
            note = f"{state}\n{note}" if note else state
        if note != self._note:
            self._note = note
            self.query_one("#knob-note", Static).update(note)


class AcceptPane(Pane):
    """Accept rate for the session and the recent window, its series (▲ = knob change), mean
    accepted length and per-position acceptance (accepted / verified drafts at block row k)."""

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
            Content.assemble("accept ", (_pct(view.session_accept), "bold"), " session · ",
                             (_pct(view.recent_accept), "bold"), " recent"),
            Content(f"avg accepted {st.avg_accept:.2f}/cycle · {st.tokens_per_cycle:.2f} tok/cycle"),
            Content(f"proposed {st.proposed} · accepted_draft {st.accepted_draft} · cycles {st.cycles}"),
            Content(f"full {st.full} · partial {st.partial} · miss_first {st.miss_first}"),
            Content.styled(line or " ", "$success"),
        ]
        if marks.strip():
            out.append(Content.styled(marks, "$warning"))
        # per block row k: accepted / verified drafts (a gap where none was verified)
        rates = st.per_position_accept
        glyphs, _ = spark([None if r is None else 100 * r for r in rates], len(rates), lo=0.0, hi=100.0)
        out.append(Content.assemble(("per position ", "$text-muted"), (glyphs, "$accent"), " ",
                                    " ".join("—" if r is None else f"{100 * r:.0f}" for r in rates), "%"))
        self.put(rows(out))


class StagesPane(Pane):
    """Milliseconds per cycle of each proposal stage (prop_setup … prop_confidence), snapshot and
    verify, with bars scaled to the largest."""

    def show(self, st: DSparkStats | None) -> None:
        if st is None or st.cycles == 0:
            self.put(Content.styled("no cycles yet", "$text-muted"))
            return
        per = st.stage_ms_per_cycle()
        top = max(per.values()) or 1.0
        shown = {name: ms for name, ms in per.items() if ms > 0}
        out = [Content.assemble((f"{name:<16}", "$text-muted"), f"{ms:8.3f} ",
                                (bar(ms, top, 14), "$secondary")) for name, ms in shown.items()]
        out.append(Content(f"{'propose (sum)':<16}{st.propose / st.cycles:8.3f}"))
        idle = [name for name in per if name not in shown]
        if idle:
            out.append(Content.styled(f"at 0 ms: {', '.join(idle)}", "$text-muted"))
        self.put(rows(out))


class NoDraftPane(Pane):
    """Why cycles made no draft, with counts; the dominant reason is highlighted — the pane that
    explains a run with zero drafts."""

    def show(self, st: DSparkStats | None, *, support_status: str = "none") -> None:
        if st is None:
            why = "support model refused: every cycle is support_invalid" if support_status == "refused" else \
                "no support model (--mtp SUPPORT.gguf)"
            self.put(Content.styled(why, "$warning"))
            return
        if st.no_draft == 0:
            self.put(Content(f"none — every one of {st.cycles} cycles drafted" if st.cycles else "no cycles yet"))
            return
        dom = st.dominant_no_draft_reason
        out = [Content(f"no_draft {st.no_draft} of {st.cycles} cycles")]
        for name in NO_DRAFT_REASONS:
            n = st.no_draft_reasons.get(name, 0)
            if not n:
                continue
            if name == dom:
                out.append(Content.assemble((f"{name:<16}{n:>7}", "bold reverse $warning"), ("  ◀ dominant", "$warning")))
            else:
                out.append(Content(f"{name:<16}{n:>7}"))
        if st.chain_fail_op:
            out.append(Content.styled(f"last chain_fail op: {st.chain_fail_op}", "$error"))
        self.put(rows(out))


class ThroughputPane(Pane):
    """Decode tokens/s (engine time) and effective tokens/s (wall time of the turn, what the user
    sees), their series, the context in use, DSpark's net time saved, and what the interface
    itself costs: ``ui_share``, the UI thread's CPU seconds per second while answers stream (None:
    not measured yet).  The engine shares the interpreter and the cores with the interface, so a
    large share means the rates above are slower than the engine alone would be."""

    def show(self, view: SpecView, st: DSparkStats | None, *, n_tokens: int, n_ctx: int,
             ui_share: float | None = None) -> None:
        def tps(v: float | None) -> str:
            return "—" if v is None else f"{v:.1f}"

        ratio = (view.effective_tps / view.decode_tps) if view.effective_tps and view.decode_tps else None
        finite = [v for v in view.decode_series + view.effective_series if v is not None]
        top = max(finite) if finite else None  # one scale for both series, so they compare
        dec, marks = spark(view.decode_series, SPARK_WIDTH, hi=top, marks=view.marks)
        eff, _ = spark(view.effective_series, SPARK_WIDTH, hi=top)
        out = [
            Content.assemble("decode ", (tps(view.decode_tps), "bold"), " t/s · effective ",
                             (tps(view.effective_tps), "bold"), " t/s",
                             "" if ratio is None else f" ({ratio:.2f}×)"),
            Content.assemble(("dec ", "$text-muted"), (dec, "$success")),
            Content.assemble(("eff ", "$text-muted"), (eff, "$accent")),
        ]
        if marks.strip():
            out.append(Content.styled("    " + marks, "$warning"))
        out.append(Content(f"context {n_tokens}/{n_ctx} tokens"))
        if st is not None:
            if st.t_decode_measured:
                sign = "+" if st.net_saved >= 0 else "−"
                out.append(Content.assemble("net saved ", (f"{sign}{abs(st.net_saved) / 1000:.2f} s", "bold"),
                                            f" (saved {st.saved / 1000:.2f} s, decode {st.t_decode_ms:.1f} ms)"))
            else:
                out.append(Content.styled("net saved unknown: no plain decode timed yet", "$text-muted"))
        if ui_share is None:
            out.append(Content.styled("interface cost: measured while an answer streams", "$text-muted"))
        else:
            out.append(Content.assemble("interface ", (f"{100 * ui_share:.1f}%", "bold"), " of a core while streaming"))
        self.put(rows(out))


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
