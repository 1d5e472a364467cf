"""Modal dialogs: an error the user must read (bad file, refused support model, no GPU), and
longer explanations (the no-draft reasons), a path to open (a stats export), and a question
before an action discards unsaved work (quitting, a new chat, a new context size)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, ScreenResultType
from textual.widgets import Button, Input, Label, Static


class _TitledMessage(ModalScreen[ScreenResultType]):
    """A box over the app: ``title`` (a Label) above ``message`` (a Static shown as it is, no
    markup), then the subclass's :meth:`buttons`.  The two texts' ids are ``{ID_PREFIX}-title`` and
    ``{ID_PREFIX}-message``, which the subclass's CSS styles."""

    ID_PREFIX = ""

    def __init__(self, title: str, message: str):
        super().__init__()
        self.title_text = title
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, id=f"{self.ID_PREFIX}-title")
            yield Static(self.message, id=f"{self.ID_PREFIX}-message", markup=False)
            yield from self.buttons()

    def buttons(self) -> ComposeResult:
        """The dialog's buttons, under the message."""
        raise NotImplementedError


class ErrorDialog(_TitledMessage[None]):
    """Shows ``title`` and ``message`` (the engine's full error text) until dismissed with
    Enter, Esc or the OK button; the app behind it stays as it was."""

    DEFAULT_CSS = """
    ErrorDialog { align: center middle; }
    ErrorDialog > Vertical { width: 80%; max-width: 100; height: auto; border: thick $error; background: $surface; padding: 1 2; }
    ErrorDialog #error-title { text-style: bold; color: $error; }
    ErrorDialog #error-message { margin: 1 0; }
    ErrorDialog Button { width: 100%; }
    """
    BINDINGS = [Binding("escape", "dismiss", "close", show=False), Binding("enter", "dismiss", "close", show=False)]
    ID_PREFIX = "error"

    def buttons(self) -> ComposeResult:
        yield Button("OK", variant="error", id="ok")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)


class Confirm(_TitledMessage[bool]):
    """Asks before unsaved work is lost: ``title`` and ``message`` (what would be lost), and two
    buttons.  "Stay" has the focus (Enter on it, or Esc, returns False: nothing happens); the other
    one, labelled ``GO``, returns True, and so does the key of the action asked about pressed again."""

    DEFAULT_CSS = """
    Confirm { align: center middle; }
    Confirm > Vertical { width: 80%; max-width: 100; height: auto; border: thick $warning; background: $surface; padding: 1 2; }
    Confirm #confirm-title { text-style: bold; color: $warning; }
    Confirm #confirm-message { margin: 1 0; }
    Confirm Horizontal { height: auto; }
    Confirm Button { width: 1fr; margin: 0 1; }
    """
    BINDINGS = [Binding("escape", "stay", "stay", show=False)]
    ID_PREFIX = "confirm"
    GO = "Go on anyway"

    def buttons(self) -> ComposeResult:
        with Horizontal():
            yield Button("Stay (Esc)", variant="primary", id="stay")
            yield Button(self.GO, variant="error", id="go")

    def on_mount(self) -> None:
        self.query_one("#stay", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "go")

    def action_stay(self) -> None:
        self.dismiss(False)

    def action_go(self) -> None:
        self.dismiss(True)


class ConfirmQuit(Confirm):
    """Asks before quitting (Ctrl+Q again quits: the app's quit key, handled by the app)."""

    GO = "Quit anyway (Ctrl+Q)"


class ConfirmNewChat(Confirm):
    """Asks before a new chat clears the conversation (Ctrl+N again clears it)."""

    GO = "New chat anyway (Ctrl+N)"
    BINDINGS = [Binding("ctrl+n", "go", "new chat anyway", show=False)]


class ConfirmContext(Confirm):
    """Asks before a new context size (a new session) clears the conversation and the counters
    (Ctrl+G again changes it)."""

    GO = "New size anyway (Ctrl+G)"
    BINDINGS = [Binding("ctrl+g", "go", "new context size anyway", show=False)]


class InfoDialog(ModalScreen[None]):
    """Shows ``title`` and a longer ``text`` (plain, scrollable) until dismissed with Enter, Esc,
    F1 or the Close button."""

    DEFAULT_CSS = """
    InfoDialog { align: center middle; }
    InfoDialog > Vertical { width: 80%; max-width: 110; height: auto; max-height: 90%; border: thick $accent; background: $surface; padding: 1 2; }
    InfoDialog #info-title { text-style: bold; }
    InfoDialog VerticalScroll { height: auto; max-height: 30; margin: 1 0; }
    InfoDialog Button { width: 100%; }
    """
    BINDINGS = [Binding("escape", "dismiss", "close", show=False), Binding("enter", "dismiss", "close", show=False),
                Binding("f1", "dismiss", "close", show=False)]

    def __init__(self, title: str, text: str):
        super().__init__()
        self.title_text = title
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, id="info-title")
            with VerticalScroll():
                yield Static(self.text, id="info-text", markup=False)
            yield Button("Close", variant="primary", id="close")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)


class AskPath(ModalScreen["str | None"]):
    """Asks for a text — a file path, a number — prefilled with ``default``: Enter returns it, Esc
    returns None.  ``describe(text)``, when given, is shown under the title as the text changes
    (what the value would mean, e.g. the memory a context size needs)."""

    DEFAULT_CSS = """
    AskPath { align: center middle; }
    AskPath > Vertical { width: 80%; max-width: 110; height: auto; border: thick $accent; background: $surface; padding: 1 2; }
    AskPath #ask-title { text-style: bold; }
    AskPath #ask-hint { color: $text-muted; margin-bottom: 1; }
    """
    BINDINGS = [Binding("escape", "cancel", "cancel", show=False)]

    def __init__(self, title: str, default: str = "", hint: str = "", describe=None):
        super().__init__()
        self.title_text, self.default, self.hint, self.describe = title, default, hint, describe

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, id="ask-title")
            yield Static(self.hint, id="ask-hint", markup=False)
            yield Input(self.default, id="ask-path")
            if self.describe is not None:
                yield Static(self.describe(self.default), id="ask-about", markup=False)

    def on_mount(self) -> None:
        self.query_one("#ask-path", Input).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if self.describe is not None:
            self.query_one("#ask-about", Static).update(self.describe(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
