"""How the commands stop on a signal: SIGINT (Ctrl-C), SIGTERM (kill, timeout) and SIGHUP (a
dropped terminal) raise one KeyboardInterrupt in the main thread, once.

:func:`interrupt_on_signals` installs the handler for the running command.  The first of these
signals raises KeyboardInterrupt, so that the command cleans up after itself (a converter removes its
partial output, ``bench --ab`` waits for the native call it cancelled, closes its engine and writes
the runs that finished); every later one is ignored until the command ends, so that a Ctrl-C pressed
three times cannot interrupt that clean-up half-way (an engine freed twice, a result file half
written).  A later signal that comes :data:`HINT_AFTER_S` or more after the first says, once, on
stderr that the command is still stopping and that Ctrl-\\ (SIGQUIT) quits at once, so that a
clean-up that waits long (a native call finishing on a slow device) is not mistaken for a hang
that nothing can end.  The signals seen are in :data:`signals_seen` (the exit status names the
first: 128 + its number).

An interrupted command given ``--json`` still prints one JSON object, the same way in every command
(:func:`interrupted_result`): ``"ok": false, "interrupted": true``, ``error`` saying how far it got,
and what had finished kept beside them (``bench``'s finished runs, ``generate``'s tokens); the text
reports say the same in words (:data:`MARKED`).  A result goes out whole (:func:`print_whole`),
whatever the signals do while it is written."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

#: The signals that interrupt a command.
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: The signal that interrupted the running command (at most one: the later ones are ignored).
signals_seen: list[int] = []

#: Seconds after the first signal from which a later one prints :data:`STILL_STOPPING` (once).
HINT_AFTER_S = 2.0

#: What a later signal says when the clean-up has taken HINT_AFTER_S or more.
STILL_STOPPING = "ds4tui: still stopping (the engine finishes the call it is in); Ctrl-\\ quits at once\n"

#: How stderr names the mark of an interrupted result, where the result went out as JSON.
MARKED = '(marked "ok": false, "interrupted": true)'

_first_at: list[float] = []  # time.monotonic() of the first signal
_hinted: list[bool] = []
_holding: list[bool] = []  # while print_whole writes: [whether the first signal came meanwhile]


def interrupted_result(error: str, **kept) -> dict:
    """The JSON object of a command that an interrupt stopped, one convention for every command:
    ``ok`` false (what was asked did not finish), ``interrupted`` true (a signal stopped it, not a
    fault), ``error`` how far it got (``"interrupted after 2 of 3 runs"``), then ``kept``: what
    finished, as the finished result would carry it.  A finished result has no ``interrupted``."""
    return {"ok": False, "interrupted": True, "error": error, **kept}


def _interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    if signals_seen:  # the command is already stopping: its clean-up runs to the end
        if not _hinted and time.monotonic() - _first_at[0] >= HINT_AFTER_S:
            _hinted.append(True)
            try:
                os.write(2, STILL_STOPPING.encode())
            except OSError:
                pass
        return
    signals_seen.append(int(signum))
    _first_at[:] = [time.monotonic()]
    if _holding:  # a result is being written: raised once it is out
        _holding[0] = True
        return
    raise KeyboardInterrupt


def print_whole(text: str) -> None:
    """Print ``text`` and a newline on stdout whole: a result, one JSON object that a reader can
    parse whatever the signals do while it is written.  The first signal waits until the text is out
    and is raised then; a later one is ignored as always, and a write that it cuts short (a pipe
    takes 64 KiB at a time) is continued.  The bytes go to the stream's binary layer, a loop taking
    partial writes: with ``PYTHONUNBUFFERED=1`` the text layer writes straight to the file and drops
    what a partial write left."""
    stream = sys.stdout
    if stream is None:  # stdout closed (>&-): print writes nothing either
        return
    _holding[:] = [False]
    try:
        stream.flush()
        buffer = getattr(stream, "buffer", None)
        if buffer is None:  # a text stream with no bytes beneath (io.StringIO)
            stream.write(text + "\n")
            stream.flush()
        else:
            rest = memoryview((text + "\n").encode(stream.encoding or "utf-8", stream.errors or "strict"))
            while rest:
                rest = rest[buffer.write(rest) or 0:]
            buffer.flush()
    finally:
        came = _holding.pop()
    if came:
        raise KeyboardInterrupt


@contextlib.contextmanager
def interrupt_on_signals(exiting: bool = False):
    """Make SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, the first only
    (see the module docstring).  A SIGINT that is ignored when this starts (a shell's background
    job) stays ignored.  On leaving, the handlers before it come back; with ``exiting`` (the process
    exits next: the command has ended) the three signals are ignored instead, so that one during the
    interpreter's exit neither raises in its shutdown nor kills the process (Python puts the default
    action back for the signals it handles as it finalizes, but not for ignored ones)."""
    signals_seen.clear()
    _hinted.clear()
    previous = {}
    try:
        for sig in INTERRUPTS:
            if sig == signal.SIGINT and signal.getsignal(sig) in (signal.SIG_IGN, None):
                continue
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, _interrupt)
        yield
    finally:
        if exiting:
            for sig in INTERRUPTS:
                signal.signal(sig, signal.SIG_IGN)
        else:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
