"""Resolve an implementation name: an installed plug-in (the built-in ones are plug-ins of this
package, registered in its pyproject.toml) or an import path `package.module:factory`."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

from packaging.requirements import Requirement

from reference.contract import ENTRY_POINT_GROUP, REQUIRED, Capabilities, missing_names

#: The distribution whose plug-ins are the built-in implementations.
DISTRIBUTION = "pnmix"


class NotDefined(Exception):
    """Raised when the suite calls a protocol name the implementation does not define."""


class _Stubbed:
    """An implementation with its missing protocol names replaced by functions that say so."""

    def __init__(self, impl: object, missing: list[str], origin: str) -> None:
        self._impl, self._missing, self._origin = impl, set(missing), origin

    def __getattr__(self, name: str):
        if name in self._missing:
            if name == "capabilities":
                return Capabilities()
            if name in ("name", "version"):
                return getattr(self._impl, "__name__", self._origin) if name == "name" else "unknown"

            def stub(*args, **kwargs):
                raise NotDefined(f"{name} is not defined in {self._origin}")

            return stub
        return getattr(self._impl, name)


def unwrap(impl: object) -> object:
    """The implementation object itself (without the stubs of `_Stubbed`)."""
    return impl._impl if isinstance(impl, _Stubbed) else impl


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _extras_installed(ep: importlib.metadata.EntryPoint) -> bool:
    """Whether the distributions the entry point's extras need (`name = module:factory [extra]`) are installed."""
    if not ep.extras or ep.dist is None:
        return True
    for line in ep.dist.requires or ():
        req = Requirement(line)
        if req.marker is not None and any(req.marker.evaluate({"extra": extra}) for extra in ep.extras):
            try:
                importlib.metadata.version(req.name)
            except importlib.metadata.PackageNotFoundError:
                return False
    return True


def builtins() -> dict[str, str]:
    """The implementations this package registers, name -> 'module:factory', in its own order;
    adapters of third-party code whose extra is not installed (pip install pnmix[adapters]) are left out."""
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    mine = [ep for ep in eps if ep.dist is not None and ep.dist.name == DISTRIBUTION]
    found = {ep.name: ep.value.partition(" ")[0] for ep in mine if _extras_installed(ep)}
    # The executable specs first (the order tables list them in), then the compiled ones.
    found = dict(sorted(found.items(), key=lambda item: (not item[1].startswith("reference."), item[1])))
    if not found:
        raise RuntimeError(
            f"no implementation is registered under the entry-point group {ENTRY_POINT_GROUP!r}: install this "
            "package (pip install -e .) so that its built-in implementations are found"
        )
    return found


def available_names() -> list[str]:
    return sorted(_entry_points())


#: Seconds an implementation's import and factory get (`load`); the environment variable overrides it.
LOAD_TIMEOUT_S = 300.0
LOAD_TIMEOUT_ENV = "PNMIX_LOAD_TIMEOUT_S"


class _LoadTimeout(BaseException):
    """Raised into a load past its time budget (a BaseException: a plug-in's `except Exception` keeps it not)."""


def load_timeout_s() -> float | None:
    """The time budget of loading an implementation: PNMIX_LOAD_TIMEOUT_S (0: none) or LOAD_TIMEOUT_S;
    ValueError naming the variable for a value that is no number of seconds."""
    text = os.environ.get(LOAD_TIMEOUT_ENV)
    if text is None:
        return LOAD_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{LOAD_TIMEOUT_ENV}={text!r}: expected a number of seconds >= 0 (0: no time limit)")
    return value or None


#: Seconds into a load after which it is said, once, on stderr, that it is still running and where.
LOAD_NOTICE_S = 30.0


@contextmanager
def _time_budget(seconds: float | None, name: str):
    """Interrupt the block after `seconds` (SIGALRM; only in the main thread of a POSIX process, elsewhere
    the block runs unbounded), saying on stderr after LOAD_NOTICE_S that it is still running and where;
    then put back the handler and any timer that were in place."""
    main = threading.current_thread() is threading.main_thread()
    if seconds is None or not hasattr(signal, "setitimer") or not main:
        yield
        return
    start = time.monotonic()

    def expire(signum, frame):
        left = seconds - (time.monotonic() - start)
        if left > 0.01:  # the notice: the load goes on until its budget
            print(
                f"loading implementation {name!r}: still running after {time.monotonic() - start:.0f} s, in "
                f"{_where(frame)} (stopped at {seconds:g} s)",
                file=sys.stderr,
                flush=True,
            )
            signal.setitimer(signal.ITIMER_REAL, left)
            return
        raise _LoadTimeout(_where(frame))

    previous = signal.signal(signal.SIGALRM, expire)
    earlier = signal.setitimer(signal.ITIMER_REAL, min(seconds, LOAD_NOTICE_S))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if earlier[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *earlier)


def _where(frame) -> str:
    """'file:line in function' of the innermost frame outside this module and the import machinery: what a
    load was waiting on."""
    while frame is not None and (
        frame.f_code.co_filename == __file__ or frame.f_code.co_filename.startswith("<frozen importlib")
    ):
        frame = frame.f_back
    if frame is None:
        return "unknown"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def load(name: str) -> object:
    """The implementation object named `name`; ValueError, one line naming the module, the factory and
    the cause, if it is unknown, cannot be imported, its factory raises or returns no implementation, or
    its import and factory take longer than `load_timeout_s` (naming where it was waiting)."""
    budget = load_timeout_s()
    try:
        with _time_budget(budget, name):
            return _load(name)
    except _LoadTimeout as late:
        raise ValueError(
            f"implementation {name!r}: loading did not finish within {budget:g} s (its import and factory); it was "
            f"waiting in {late}; fix the plug-in, or give it more time with {LOAD_TIMEOUT_ENV}=SECONDS"
        ) from None


def _load(name: str) -> object:
    if ":" in name:
        obj, factory, origin = _import(name), name, name
    else:
        eps = _entry_points()
        if name not in eps:
            raise ValueError(
                f"unknown implementation {name!r}: expected one of {available_names()}, a plug-in registered "
                f"under the entry-point group {ENTRY_POINT_GROUP!r}, or an import path 'package.module:factory'"
            )
        factory, origin = eps[name].value.partition(" ")[0], f"{ENTRY_POINT_GROUP}:{name}"
        obj = _guarded(eps[name].load, f"cannot import {factory!r} for implementation {name!r}: ")
    impl = _make(obj, factory, name)
    missing = missing_names(impl)
    if "name" not in missing:
        check_name(getattr(impl, "name", None), _subject(factory, name))
    return _Stubbed(impl, missing, origin) if missing else impl


#: Seconds a child process (`check_in_child`) gets beyond the load's own budget: its interpreter's start.
CHILD_START_S = 60.0
#: Run by `check_in_child` in a fresh interpreter: argv name, the parent's sys.path as JSON. stdout carries
#: the verdict alone (the plug-in's own output goes to stderr); os._exit keeps teardown out of it.
_CHILD = """
import json, os, sys
sys.path[:] = json.loads(sys.argv[2])
verdict = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
from conformance import loader
try:
    loader.load(sys.argv[1])
except ValueError as error:
    verdict.write(json.dumps({"refused": str(error)}))
else:
    verdict.write(json.dumps({"loaded": True}))
verdict.flush()
os._exit(0)
"""
_survived: set[str] = set()  # names whose load returned in a child process (`check_in_child`)


def check_in_child(name: str) -> None:
    """Load `name` once in a child process (a fresh interpreter on this one's sys.path) before a tool loads it:
    ValueError, one line naming it, if that load ends the process (`os._exit`, a signal, a crash) instead of
    returning, which in the tool itself would end it without a word, perhaps with status 0; or `load`'s own
    one-line refusal. Once per name and process; this package's own plug-ins are not checked (a child costs
    seconds, importing torch)."""
    if name in _survived or _own(name):
        return
    budget = load_timeout_s()
    try:
        ran = subprocess.run(
            [sys.executable, "-c", _CHILD, name, json.dumps(sys.path)],
            capture_output=True,
            text=True,
            timeout=None if budget is None else budget + CHILD_START_S,
        )
    except subprocess.TimeoutExpired:
        raise ValueError(
            f"implementation {name!r}: loading it in a child process did not finish within "
            f"{budget + CHILD_START_S:g} s, nor did its own time budget stop it ({budget:g} s); fix the plug-in, "
            f"or give it more time with {LOAD_TIMEOUT_ENV}=SECONDS"
        ) from None
    verdict = _verdict(ran.stdout)
    if verdict is None:
        raise ValueError(
            f"implementation {name!r}: loading it (its import and factory) ended the process "
            f"({_status(ran.returncode)}){_last_words(ran.stderr)} instead of returning an implementation "
            "(seen in a child process loading it first); a plug-in must not exit the process"
        )
    if "refused" in verdict:
        raise ValueError(verdict["refused"])
    _survived.add(name)


def _own(name: str) -> bool:
    """Whether `name` is a plug-in this package registers."""
    ep = _entry_points().get(name)
    return ep is not None and ep.dist is not None and ep.dist.name == DISTRIBUTION


def _verdict(stdout: str) -> dict | None:
    try:
        verdict = json.loads(stdout)
    except ValueError:
        return None
    return verdict if isinstance(verdict, dict) else None


def _status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _last_words(stderr: str) -> str:
    """'; its last line on stderr: ...', shortened, or nothing when it said nothing."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return f"; its last line on stderr: {lines[-1][:160]!r}" if lines else ""


#: An implementation's name names its files (known failures) and the report's columns: plain words.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def check_name(value: object, subject: str) -> None:
    """ValueError unless `value` is 1-64 letters, digits, '.', '_', '+' or '-' (starting with a letter or
    digit): no path, no markup, no line break."""
    if not isinstance(value, str) or NAME.fullmatch(value) is None:
        shown = repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:40]) + "..."
        raise ValueError(
            f"{subject}: its name {shown} must be 1-64 letters, digits, '.', '_', '+' or '-', starting with a "
            "letter or digit (it names the known-failures file and the report's columns)"
        )


def _cause(err: BaseException) -> str:
    """'Class: first line of the message': a fault is reported on one line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def _guarded(call, context: str):
    """`call()`; any Exception it raises (a plug-in's own fault) becomes a one-line ValueError: context + cause."""
    try:
        return call()
    except (Exception, SystemExit) as err:  # a plug-in's sys.exit() ends no run of the suite's tools
        raise ValueError(f"{context}{_cause(err)}") from err


def _make(obj: object, factory: str, name: str) -> object:
    """Call a class or a factory function (an implementation object is used as it is) and refuse what
    is no implementation at all; a partial one is kept (its missing names become stubs)."""
    called = isinstance(obj, type) or (callable(obj) and not hasattr(obj, "create"))
    if called:
        obj = _guarded(obj, f"{_subject(factory, name)}: its factory raised ")
    operations = [n for n in REQUIRED if n not in ("name", "version", "capabilities")]
    missing = missing_names(obj)
    # with none of the operations every property would fail with NotDefined: say so once, here
    if set(operations) <= set(missing):
        raise ValueError(
            f"{_subject(factory, name)}: {'its factory returned' if called else 'it is'} {_short(obj)}, "
            f"not an implementation: it lacks {', '.join(missing)}"
        )
    return obj


def _subject(factory: str, name: str) -> str:
    """The implementation and, for a plug-in, the 'module:factory' it is registered as."""
    return f"implementation {name!r}" + ("" if factory == name else f" (factory {factory})")


def _short(obj: object) -> str:
    """`obj` for a one-line message: its repr's first 60 characters and its type."""
    text = " ".join(repr(obj).split())
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(obj).__name__})"


def origin(name: str) -> str:
    """Where the implementation `name` comes from: its import path, and for a plug-in the
    distribution that registers it with its version ('triton = pnmix.protocol:make (pnmix 0.3.0)')."""
    if ":" in name:
        return name
    ep = _entry_points().get(name)
    if ep is None:
        return name
    dist = f" ({ep.dist.name} {ep.dist.version})" if ep.dist is not None else ""
    return f"{name} = {ep.value}{dist}"


def factory(name: str) -> str:
    """The 'package.module:factory' the implementation loaded as `name` comes from: an import path as
    given, a plug-in's entry point (without its extras), whichever distribution registers it;
    ValueError for a name that is neither."""
    if ":" in name:
        return name
    ep = _entry_points().get(name)
    if ep is None:
        raise ValueError(f"unknown implementation {name!r}: expected one of {available_names()} or an import path")
    return f"{ep.module}:{ep.attr}"


def factory_module(name: str) -> str:
    """The module that holds the factory of the implementation loaded as `name` (an import path's
    module, a plug-in's entry-point module); ValueError for a name that is neither."""
    return factory(name).partition(":")[0]


def _import(target: str) -> object:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"an import path must look like 'package.module:factory', got {target!r}")
    # a module that raises on import is the implementation's fault, reported like a missing one
    module = _guarded(
        lambda: importlib.import_module(module_name), f"cannot import {module_name!r} for implementation {target!r}: "
    )
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{module_name!r} has no attribute {attr!r} (implementation {target!r})") from None
