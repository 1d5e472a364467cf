"""Chat pane: the transcript (user and assistant turns) and the prompt input with history.

An assistant turn streams into light widgets and renders Markdown only for what is finished
(ux.md §2.2): the text of each channel (the answer, and the reasoning in a collapsed section)
grows in a :class:`~ds4tui.widgets.stream.StreamText`, which wraps and repaints only the rows
that changed and shows at most a view's height of its last rows; at the end the whole text is
rendered as Markdown once.  While the transcript follows the end of the answer nothing else is
rendered, so a write costs the same however long the answer is.  While the user has scrolled the
transcript back (to read what streamed earlier), every ``MARKDOWN_S`` the finished blocks
(paragraphs, closed code fences) move from the live text into the channel's Markdown, which
holds the text above the live rows (each such move lays out the screen, at a cost that grows with
the blocks: the user asked to read them).  A
token trace (toggle) shows the answer token by token with accepted-draft tokens highlighted,
since Markdown cannot style single tokens (ux.md §2.6).
"""

from __future__ import annotations

import math
import re
import time

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Collapsible, Input, Markdown, Static
from textual.widgets.markdown import MarkdownFence

from ds4tui.engine.telemetry import plural
from ds4tui.widgets.pane import set_line
from ds4tui.widgets.stream import StreamText, clean, no_second_layout

#: Accepted-draft tokens in the token trace; reasoning tokens are drawn in THINK_STYLE.
DRAFT_STYLE = "on $success 40%"
THINK_STYLE = "italic $text-muted"
#: While a turn streams and the user has scrolled the transcript back, its finished Markdown blocks
#: are rendered at most this often (seconds).
MARKDOWN_S = 2.0
#: An answer that outgrows the rows below its question takes 1/GROW_PARTS of the view more at a
#: time (the question moves up in a few steps, not row by row: each step is a layout of the screen),
#: and once it fills the view it scrolls by as much at a time (each scroll repaints the whole view;
#: the writes between two repaint only their new rows).
GROW_PARTS = 4
#: While a turn streams and the rows below its question are at least 1/KEEP_QUESTION_PARTS of the
#: view, the answer scrolls within those rows (the question stays in view above it, and the message
#: never changes height: no layout of the screen while the engine decodes); a longer question
#: leaves the answer to grow past them as above.
KEEP_QUESTION_PARTS = 2
#: While a turn streams, its summary line (tokens so far) is redrawn at most this often (seconds):
#: a line far below the text being written would make each frame repaint every row between them.
SUMMARY_S = 1.0

_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")


def finished_blocks(text: str, start: int = 0) -> int:
    """Where the finished Markdown blocks of ``text[start:]`` end: the index just after the last
    blank line outside a code fence, or after the last line that closes a fence (``start`` when
    no block has finished).  ``text[start:]`` must begin outside a fence."""
    fence = ""  # the open fence's marker ("" outside a fence)
    end = pos = start
    while (nl := text.find("\n", pos)) >= 0:
        line = text[pos:nl]
        m = _FENCE.match(line)
        if not fence:
            if m:
                fence = m.group(1)
            elif not line.strip():
                end = nl + 1
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line[m.end():].strip():
            fence = ""
            end = nl + 1
        pos = nl + 1
    return end


class Fence(MarkdownFence):
    """A code block of an answer: highlighted in the language its fence names; one that names
    none (or an indented block) is drawn as plain text.  Textual would guess the language by
    running every Pygments lexer's analyser over the code: ~30 ms a block here, on the UI thread
    while the engine decodes (finished blocks are rendered as the answer streams), and again at
    every style update of the block.  A line wider than the pane scrolls sideways, and a block that
    has one shows a one-row scrollbar under it (Textual's fence hides its scrollbar: such a line
    looked whole, cut at the pane's edge without a mark)."""

    DEFAULT_CSS = """
    Fence { overflow-x: auto; scrollbar-size-horizontal: 1; }
    """

    @classmethod
    def highlight(cls, code: str, language: str, ansi: bool = False, dark: bool = False) -> Content:
        return super().highlight(code, language or "text", ansi=ansi, dark=dark)


class AnswerMarkdown(Markdown):
    """The Markdown of an answer or its reasoning: :class:`Fence` for code blocks."""

    BLOCKS = {**Markdown.BLOCKS, "fence": Fence, "code_block": Fence}


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage { margin: 1 0 0 0; padding: 0 1; background: $boost; border-left: thick $primary; }
    """

    def __init__(self, text: str):
        super().__init__(Content(text), markup=False)
        self.text = text


class _Channel:
    """One channel of a turn (answer or reasoning): its Markdown (the finished blocks), its live
    text (the rest) and how much of the text the Markdown holds."""

    def __init__(self, markdown: Markdown, live: StreamText):
        self.markdown, self.live = markdown, live
        self.text = ""
        self.rendered = 0  # text[:rendered] is in the Markdown
        self.t_rendered = time.monotonic()

    async def add(self, chunk: str, reading_back: bool = False) -> None:
        """Append ``chunk``; ``reading_back``: the user scrolled the transcript back (the finished
        blocks move into the Markdown, at most every MARKDOWN_S)."""
        self.text += chunk
        live = self.live
        live.append(chunk)
        if not reading_back:
            return  # the view follows the end: nobody sees the rows above the live text's
        now = time.monotonic()
        if now - self.t_rendered < MARKDOWN_S or live.max_rows is None or live.row_count <= live.max_rows:
            return  # while the text fits the view it stays as it is (Markdown would change its height)
        self.t_rendered = now
        end = finished_blocks(self.text, self.rendered)
        if end == self.rendered:
            return
        block, self.rendered = self.text[self.rendered:end], end
        live.set(self.text[end:])
        await self.markdown.append(block)

    async def finish(self) -> None:
        """The whole text as Markdown (also repairs blocks a partial parse got wrong)."""
        if self.text:
            await self.markdown.update(self.text)
        self.rendered = len(self.text)
        self.live.clear()


class AssistantMessage(Vertical):
    """One assistant turn: reasoning (collapsed), answer, token trace (hidden unless toggled) and
    a one-line summary."""

    DEFAULT_CSS = """
    AssistantMessage { height: auto; margin: 1 0 0 0; border-left: thick $success; padding: 0 0 0 1; }
    AssistantMessage Collapsible { display: none; }
    AssistantMessage.has-reasoning Collapsible { display: block; }
    AssistantMessage #trace { display: none; }
    AssistantMessage.trace #trace { display: block; }
    AssistantMessage.trace #answer, AssistantMessage.trace #answer-live { display: none; }
    AssistantMessage.trace Collapsible { display: none; }
    AssistantMessage #answer-live, AssistantMessage #think-live { padding: 0 2; }
    AssistantMessage #summary { color: $text-muted; }
    """
    virtual_size = no_second_layout()

    def __init__(self, *, trace: bool = False):
        super().__init__(classes="trace" if trace else "")
        self._channels: dict[str, _Channel] = {}
        self._reserve: int | None = None  # rows the answer's live text takes while it streams
        self._spare = 0  # rows of the question's top margin (see size_live_text)
        self.n_tokens = 0
        self.n_draft = 0
        self.n_think = 0
        self.finished = False
        self._summary_t = -math.inf  # when the summary line was last redrawn while streaming (never: the first piece draws it)
        self._trace_pieces: list = []  # the token trace's pieces not yet drawn: text or (text, style)

    def compose(self) -> ComposeResult:
        with Collapsible(title="reasoning", collapsed=True):
            yield AnswerMarkdown("", id="think")
            yield StreamText(id="think-live")
        yield AnswerMarkdown("", id="answer")
        yield StreamText(id="answer-live")
        yield StreamText(id="trace")
        yield Static(Content.styled("…", "$text-muted"), id="summary")

    def on_mount(self) -> None:
        for name in ("think", "answer"):
            self._channels[name] = _Channel(self.query_one(f"#{name}", Markdown),
                                            self.query_one(f"#{name}-live", StreamText))
        self._trace = self.query_one("#trace", StreamText)
        self._summary = self.query_one("#summary", Static)
        self._collapsible = self.query_one(Collapsible)

    @property
    def reasoning(self) -> str:
        return self._channels["think"].text if self._channels else ""

    @property
    def answer(self) -> str:
        return self._channels["answer"].text if self._channels else ""

    @property
    def trace(self) -> Content:
        """The token trace: every token's text, accepted drafts in DRAFT_STYLE, reasoning in
        THINK_STYLE."""
        self._draw_trace()
        return self._trace.content

    def _rows_besides_answer(self) -> int:
        """The rows this message takes in the view besides the answer's live text while it streams:
        its top margin and gutter, the reasoning section's title when shown (its border and padding
        too) and the summary line.  Read from the styles, not from a layout: the first write, which
        shows the reasoning section, has not been laid out yet."""
        rows = self.styles.margin.top + self.styles.gutter.height + 1  # + the summary line
        if self.has_class("has-reasoning") and not self.has_class("trace"):
            rows += self._collapsible.styles.gutter.height + 1  # its title (collapsed: all of it)
        return rows

    def size_live_text(self) -> None:
        """The live texts show at most a view's height of rows (their last ones: in a transcript
        pinned to its bottom, all that can be seen), and the answer's takes the rows of the view
        below the question (and the rest of this message): a text growing within them costs a
        repaint of its new rows.  When those rows are at least 1/``KEEP_QUESTION_PARTS`` of the
        view, the answer never takes more: past them it scrolls a quarter of the view at a time
        (``GROW_PARTS``; a repaint of its rows, no layout of the screen) and the question stays
        in view above it until the turn ends.  Below a longer question the answer grows past its
        rows a quarter of the view at a time (each step a layout) up to the view's height, and
        scrolls from there.  Called at each write, when the view's size changes, and by the app
        once the question is laid out."""
        if self.finished:
            return
        view = self.parent
        height = view.scrollable_content_region.height if isinstance(view, VerticalScroll) else 0
        if height:
            i = view.children.index(self)
            question = view.children[i - 1] if i > 0 else None
            above = question.outer_size.height + question.styles.margin.top if question is not None else 0
            self._reserve = max(0, height - above - self._rows_besides_answer())
            self._spare = question.styles.margin.top if question is not None else 0
        # a question that leaves the answer at least 1/KEEP_QUESTION_PARTS of the view stays in view:
        # the answer scrolls within the rows below it instead of growing past them (each new height
        # of the message is a layout of the screen beside the decoding engine).  It takes the rows
        # of the question's top margin too (the view starts scrolled past that blank row, so that
        # even the first question of a chat leaves the view something to scroll back by: reading
        # back moves the finished blocks into the Markdown above the live text)
        below = self._reserve or 0
        keep = bool(height) and below * KEEP_QUESTION_PARTS >= height
        rows = below + self._spare if keep else below
        for live in (self._trace, *(c.live for c in self._channels.values())):
            if live is not self._channels["think"].live:
                live.max_rows = (rows if keep else height) or None
                live.reserve = rows
                live.grow_step = max(1, height // GROW_PARTS)
            else:
                live.max_rows = height or None

    async def add(self, pieces) -> None:
        """Append ``TokenPiece`` s (one flush worth): one write per channel."""
        text = {"think": [], "answer": []}
        trace = []
        view = self.parent
        reading_back = isinstance(view, ChatView) and view.reading_back
        for p in pieces:
            if p.id >= 0:
                self.n_tokens += 1
                self.n_draft += p.from_draft
                self.n_think += p.channel == "think"
            if p.text:
                text[p.channel].append(p.text)
                base = THINK_STYLE if p.channel == "think" else ""
                style = f"{base} {DRAFT_STYLE}".strip() if p.from_draft else base
                piece = clean(p.text)
                trace.append((piece, style) if style else piece)
        for channel in ("think", "answer"):
            chunk = "".join(text[channel])
            if not chunk:
                continue
            if channel == "think":
                self.add_class("has-reasoning")
                self._collapsible.title = f"reasoning · {plural(self.n_think, 'token')}"
            await self._channels[channel].add(chunk, reading_back)
        if trace:
            self._trace_pieces.extend(trace)
            if self.has_class("trace"):
                self._draw_trace()
        self.size_live_text()
        now = time.monotonic()
        if now - self._summary_t >= SUMMARY_S:
            self._summary_t = now
            set_line(self._summary, f"{plural(self.n_tokens, 'token')} · {self.n_draft} from accepted drafts",
                     "$text-muted")

    async def finish(self, summary: str) -> None:
        """Render each channel's whole text as Markdown once and give back the rows the answer
        reserved: the message is as tall as its text (the transcript, pinned to its bottom, shows
        the question above the answer, with no blank rows below it)."""
        for channel in self._channels.values():
            await channel.finish()
        for live in (self._trace, *(c.live for c in self._channels.values())):
            live.reserve = 0
        self._reserve = None
        set_line(self._summary, summary, "$text-muted")
        self.finished = True

    def set_trace(self, on: bool) -> None:
        if on:
            self._draw_trace()
        self.set_class(on, "trace")

    def _draw_trace(self) -> None:
        """The token trace's pieces not yet in its widget, into it (while the trace is hidden they
        wait: styled text built for every token would cost every write, for a view seldom shown)."""
        if self._trace_pieces:
            self._trace.append(Content.assemble(*self._trace_pieces))
            self._trace_pieces = []


class ChatView(VerticalScroll):
    """The transcript; stays pinned to the bottom while text streams unless the user scrolls up.
    Its scroll bar's column is kept free from the start, so the first answer that fills the view
    does not make every message wrap again."""

    DEFAULT_CSS = """
    ChatView { padding: 0 1; scrollbar-gutter: stable; }
    ChatView #welcome { color: $text-muted; }
    """
    virtual_size = no_second_layout()  # (its scroll bars follow the layout itself)

    def __init__(self, *children, **kw):
        super().__init__(*children, **kw)
        self._released = False  # the user scrolled (Textual released the anchor)

    def on_mount(self) -> None:
        self.anchor()

    def release_anchor(self) -> None:
        """(Textual calls this when the user scrolls.)"""
        super().release_anchor()
        self._released = True

    def scroll_end(self, *args, **kw) -> None:
        """(Scrolled to the end, the transcript follows the answer again.)"""
        super().scroll_end(*args, **kw)
        self._released = False

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self._released and round(new_value) >= self.max_scroll_y:
            self._released = False  # back at the end (Textual anchors the view again)

    @property
    def reading_back(self) -> bool:
        """The user scrolled the transcript away from its end (PageUp, the wheel, the scroll bar):
        it no longer follows the streaming answer until it is back at the end."""
        return self._released and round(self.scroll_y) < self.max_scroll_y

    def on_resize(self) -> None:
        """The view's size changed (the window, the panes shown or hidden, the prefill's bar gone
        at the first token): the rows the streaming answer reserves follow it (a few sums; the
        text's layout changes only if its height does)."""
        last = self.children[-1] if self.children else None
        if isinstance(last, AssistantMessage) and not last.finished and last._reserve is not None:
            last.size_live_text()


#: How the one-line prompt shows each line break of a pasted text (:meth:`PromptInput.question` sends it as one).
LINE_BREAK = "↵"


class PromptInput(Input):
    """The prompt line: Enter sends; ↑/↓ walk through the prompts sent before; PageUp/PageDown
    scroll the transcript (back at its bottom it follows the answer again).  A pasted text of several
    lines is kept whole, each line break shown as :data:`LINE_BREAK` and sent as a line break (Textual's
    line kept the first line only, without a word); a line no such paste went into sends a typed
    :data:`LINE_BREAK` as it is (``breaks``: a paste put line breaks into the line since it was empty)."""

    BINDINGS = [
        Binding("up", "history(-1)", "previous prompt", show=False),
        Binding("down", "history(1)", "next prompt", show=False),
        Binding("pageup", "page(-1)", "scroll the transcript up", show=False),
        Binding("pagedown", "page(1)", "scroll the transcript down", show=False),
    ]
    # Textual's Input sets its virtual size at every key, which by default lays the whole screen out
    # again (a frame of ~10 ms while an answer streams), and a placeholder wider than the line shows a
    # horizontal scroll bar of no size that the first key hides (one more layout).  The line scrolls
    # itself to the cursor: a key needs a repaint of the line only.
    DEFAULT_CSS = """
    PromptInput { overflow-x: hidden; }
    """
    virtual_size = no_second_layout()

    def action_page(self, step: int) -> None:
        view = self.screen.query_one(ChatView)
        if step < 0:
            view.scroll_page_up(animate=False)
        else:
            view.scroll_page_down(animate=False)

    def __init__(self, **kw):
        # select_on_focus off: back in the prompt (Tab, a knob's Enter, F12), the next key goes on with the
        # draft instead of replacing it
        super().__init__(placeholder="Ask something (Enter to send, ↑/↓ history, Esc stops generation)",
                         select_on_focus=False, **kw)
        self.history: list[str] = []  # the questions sent, line breaks and all
        self._pos = 0
        self._draft = ("", False)  # the line being written before ↑, with its breaks
        self.breaks = False

    def watch_value(self, value: str) -> None:
        if not value:  # an empty line holds no pasted breaks
            self.breaks = False

    def question(self, value: str | None = None) -> str:
        """The question the line (or ``value``) holds: its :data:`LINE_BREAK` marks as the line breaks they
        stand for where a paste put them in (:attr:`breaks`), else as typed."""
        value = self.value if value is None else value
        return value.replace(LINE_BREAK, "\n") if self.breaks else value

    def _show(self, text: str) -> None:
        """``text`` (a question, line breaks and all) on the line, its breaks as :data:`LINE_BREAK`."""
        self.value = text.replace("\n", LINE_BREAK)
        self.breaks = "\n" in text

    def _on_paste(self, event: events.Paste) -> None:
        text = event.text.replace("\r\n", "\n").replace("\r", "\n").strip("\n")
        if "\n" not in text:  # one line: Input's own handler (Textual calls it after this one)
            return
        event.prevent_default()  # (Input's handler would add the first line again)
        event.stop()
        shown = text.replace("\n", LINE_BREAK)
        if self.selection.is_empty:
            self.insert_text_at_cursor(shown)
        else:
            self.replace(shown, *self.selection)
        self.breaks = True
        self.notify(f"pasted {text.count(chr(10)) + 1} lines: {LINE_BREAK} marks each line break, sent as one",
                    timeout=3)

    def remember(self, text: str) -> None:
        """``text``: the question sent (:meth:`question`), line breaks and all."""
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._pos = len(self.history)
        self._draft = ("", False)

    def action_history(self, step: int) -> None:
        if not self.history:
            return
        if self._pos == len(self.history):
            self._draft = (self.value, self.breaks)
        self._pos = max(0, min(len(self.history), self._pos + step))
        if self._pos == len(self.history):
            self.value, self.breaks = self._draft
        else:
            self._show(self.history[self._pos])
        self.cursor_position = len(self.value)
