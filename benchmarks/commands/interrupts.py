"""Stopping a run that runs steps (the report): SIGTERM and SIGHUP end it the way Ctrl-C does, as an
exception that unwinds through the code that ends the steps' processes and removes the staging folder."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

#: Signals that stop a run like Ctrl-C (SIGINT is Python's KeyboardInterrupt already).
STOPPING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(BaseException):  # like KeyboardInterrupt, not caught by `except Exception`
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame) -> None:
    raise Terminated(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # signal handlers can be set only there


def _restore(handlers: dict) -> None:
    for s, handler in handlers.items():
        signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: one set outside Python


@contextlib.contextmanager
def as_exceptions() -> Iterator[None]:
    """Within the block, STOPPING signals raise Terminated; the previous handlers come back after."""
    if not _main_thread():
        yield
        return
    before = {s: signal.signal(s, _raise) for s in STOPPING}
    try:
        yield
    finally:
        _restore(before)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Within the block, Ctrl-C and STOPPING signals are ignored: for cleanup that a second Ctrl-C
    must not cut short (it would leave processes or a half-removed folder behind)."""
    if not _main_thread():
        yield
        return
    before = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, *STOPPING)}
    try:
        yield
    finally:
        _restore(before)
