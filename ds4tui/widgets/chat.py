"""Chat pane: the transcript (user and assistant turns) and the prompt input with history.

An assistant turn streams its answer into a Markdown widget through Textual's Markdown stream
(``Markdown.get_stream``, Textual ≥ 5) and its reasoning into a collapsed Markdown; at the end
both are written once more in full to repair blocks parsed half-way (ux.md §2.2).  A token trace
(toggle) shows the answer token by token with accepted-draft tokens highlighted, since Markdown
cannot style single tokens (ux.md §2.6).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Collapsible, Input, Markdown, Static

from ds4tui.widgets.pane import set_line

#: Accepted-draft tokens in the token trace; reasoning tokens are drawn in THINK_STYLE.
DRAFT_STYLE = "on $success 40%"
THINK_STYLE = "italic $text-muted"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage { margin: 1 0 0 0; padding: 0 1; background: $boost; border-left: thick $primary; }
    """

    def __init__(self, text: str):
        super().__init__(Content(text), markup=False)
        self.text = text


class AssistantMessage(Vertical):
    """One assistant turn: reasoning (collapsed), answer, token trace (hidden unless toggled) and
    a one-line summary."""

    DEFAULT_CSS = """
    AssistantMessage { height: auto; margin: 1 0 0 0; border-left: thick $success; padding: 0 0 0 1; }
    AssistantMessage Collapsible { display: none; }
    AssistantMessage.has-reasoning Collapsible { display: block; }
    AssistantMessage #trace { display: none; }
    AssistantMessage.trace #trace { display: block; }
    AssistantMessage.trace #answer { display: none; }
    AssistantMessage.trace Collapsible { display: none; }
    AssistantMessage #summary { color: $text-muted; }
    """

    def __init__(self, *, trace: bool = False):
        super().__init__(classes="trace" if trace else "")
        self.reasoning = ""
        self.answer = ""
        self._streams: dict = {}
        self._trace = Content("")
        self.n_tokens = 0
        self.n_draft = 0
        self.n_think = 0
        self.finished = False

    def compose(self) -> ComposeResult:
        with Collapsible(title="reasoning", collapsed=True):
            yield Markdown("", id="think")
        yield Markdown("", id="answer")
        yield Static("", id="trace", markup=False)
        yield Static(Content.styled("…", "$text-muted"), id="summary")

    def _stream(self, channel: str):
        if channel not in self._streams:
            md = self.query_one("#think" if channel == "think" else "#answer", Markdown)
            self._streams[channel] = Markdown.get_stream(md)
        return self._streams[channel]

    async def add(self, pieces) -> None:
        """Append ``TokenPiece`` s (one flush worth): one stream write per channel."""
        text = {"think": [], "answer": []}
        trace = []
        for p in pieces:
            if p.id >= 0:
                self.n_tokens += 1
                self.n_draft += p.from_draft
                self.n_think += p.channel == "think"
            if p.text:
                text[p.channel].append(p.text)
                base = THINK_STYLE if p.channel == "think" else ""
                style = f"{base} {DRAFT_STYLE}".strip() if p.from_draft else base
                trace.append(Content.styled(p.text, style) if style else Content(p.text))
        for channel in ("think", "answer"):
            chunk = "".join(text[channel])
            if not chunk:
                continue
            if channel == "think":
                self.reasoning += chunk
                self.add_class("has-reasoning")
                self.query_one(Collapsible).title = f"reasoning · {plural(self.n_think, 'token')}"
            else:
                self.answer += chunk
            await self._stream(channel).write(chunk)
        if trace:
            self._trace = Content("").join([self._trace, *trace])
            self.query_one("#trace", Static).update(self._trace)
        set_line(self.query_one("#summary", Static), f"{plural(self.n_tokens, 'token')} · {self.n_draft} from "
                 f"accepted drafts", "$text-muted")

    async def finish(self, summary: str) -> None:
        """End the streams and write the full text once more (repairs half-parsed blocks)."""
        for stream in self._streams.values():
            await stream.stop()
        self._streams.clear()
        if self.reasoning:
            await self.query_one("#think", Markdown).update(self.reasoning)
        await self.query_one("#answer", Markdown).update(self.answer)
        set_line(self.query_one("#summary", Static), summary, "$text-muted")
        self.finished = True

    def set_trace(self, on: bool) -> None:
        self.set_class(on, "trace")


class ChatView(VerticalScroll):
    """The transcript; stays pinned to the bottom while text streams unless the user scrolls up."""

    DEFAULT_CSS = """
    ChatView { padding: 0 1; }
    ChatView #welcome { color: $text-muted; }
    """

    def on_mount(self) -> None:
        self.anchor()


class PromptInput(Input):
    """The prompt line: Enter sends; ↑/↓ walk through the prompts sent before."""

    BINDINGS = [
        Binding("up", "history(-1)", "previous prompt", show=False),
        Binding("down", "history(1)", "next prompt", show=False),
    ]

    def __init__(self, **kw):
        super().__init__(placeholder="Ask something (Enter to send, ↑/↓ history, Esc stops generation)", **kw)
        self.history: list[str] = []
        self._pos = 0
        self._draft = ""

    def remember(self, text: str) -> None:
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._pos = len(self.history)
        self._draft = ""

    def action_history(self, step: int) -> None:
        if not self.history:
            return
        if self._pos == len(self.history):
            self._draft = self.value
        self._pos = max(0, min(len(self.history), self._pos + step))
        self.value = self._draft if self._pos == len(self.history) else self.history[self._pos]
        self.cursor_position = len(self.value)
