"""pytest plug-in of the conformance suite: registered as the `pytest11` entry point named `conformance.plugin`
(`conformance.entry`, which loads this module where the `test` extra is installed), so that an installed package
runs it (`pytest --pyargs conformance --impl fp16`), and named by the repository's root conftest.py for a checkout
that is not installed (pytest registers it once, under that name).

Installed, it is loaded by every pytest run of the environment, so it stays inert unless the run is the suite's:
implementations named (--impl, PNMIX_IMPL), or a path or --pyargs name of the run inside the `conformance`
package (or above it, as the repository's own `pytest`). Inert, it adds its options (none that another plug-in
is likely to take: --impl, --xfails, --conformance-json, --no-conformance-json, --pnmix-device), its hypothesis
profiles where no profile of that name exists, and nothing else: no implementation is loaded, no test is
parametrized or skipped, no result is written.

--impl NAME (repeatable, or PNMIX_IMPL=a,b) picks the implementations; every test that takes
the `impl` fixture runs once per implementation, with its name in the test id. Known failures
per implementation live in conformance/xfails/<name>.txt (and --xfails FILE): one node id per
line, '#' starts a reason. Each run writes a JSON result to --conformance-json, by default a new
timestamped file in reports/inputs/: the code that judged (`code`: the suite and the spec), each
implementation with its code and its claims, and per property its outcome, its reason (a failure's
own message, each distinct one; a skip's reason alone), the failing example fitted to the claims
(`example`), how many examples ran (`examples`: run, and dropped as outside the claims; a
property is skipped only when none fits), what it measured and hypothesis' statistics.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis.errors import FailedHealthCheck, Unsatisfiable

from conformance import harness, loader, profiles, strategies
from conformance.runs import runs_inside
from reference import schema
from reference.contract import Capabilities
from reference.records import code_fingerprint, implementation_targets, record, utc_stamp, write_json

XFAIL_DIR = Path(__file__).parent / "xfails"
_IMPLS = pytest.StashKey[list]()
_RECORDS = pytest.StashKey[list]()
_ORIGINS = pytest.StashKey[dict]()
_NAMES = pytest.StashKey[dict]()  # implementation name -> the name it was loaded by
#: The suite's own tests (its deliberate mutants): they judge the suite, not the implementations chosen.
META = "conformance/meta/"

#: The outcomes a property's record takes (`pytest_runtest_makereport`).
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "measured")
#: What a conformance result holds (`pytest_sessionfinish` writes it), as the report reads it.
SCHEMA = {
    "results": schema.ListOf(
        {
            "implementation": str,
            "module": str,
            "property": str,
            "outcome": schema.OneOf(OUTCOMES),
            "duration_s": schema.SECONDS,
            "reason?": schema.TEXT,
            "example?": schema.TEXT,  # a failure's example, fitted to the claims and shrunk
            # figures (the largest of each is shown; a failing implementation may measure inf or NaN),
            # descriptions, and the workload's configuration as data
            "measured?": schema.Maybe({"realistic_config?": schema.CONFIG_RECORD, "*": (int, float, str)}),
            # examples run and dropped (outside the claims); results written before they were counted lack it
            "examples?": {"run": schema.EXAMPLES, "dropped": schema.EXAMPLES},
        }
    ),
    "device?": schema.TEXT,
    "date_utc?": schema.TEXT,
    "created_utc?": schema.TEXT,  # results written before reference.records
    "command?": schema.TEXT,
    "machine?": {"TRITON_INTERPRET?": schema.TEXT},
    "implementation_details?": schema.ListOf({"name": str}),
}
KIND = schema.Kind("conformance", SCHEMA)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pnmix conformance")
    group.addoption(
        "--impl",
        action="append",
        default=[],
        help="implementation to check: a built-in name, an installed plug-in or 'package.module:factory' "
        "(repeatable; env PNMIX_IMPL=a,b; default: every built-in)",
    )
    group.addoption("--xfails", action="append", default=[], help="extra known-failure file of node ids")
    group.addoption("--conformance-json", default=None, help="where to write the JSON result of this run")
    group.addoption("--no-conformance-json", action="store_true", help="write no JSON result")
    add_device_option(group, "--pnmix-device")


def add_device_option(group, name: str) -> None:
    """The device option under `name`: the plug-in's --pnmix-device, and the repository's conftest's --device (a
    name other projects use too, which an installed plug-in must leave to them), one setting."""
    group.addoption(
        name,
        dest=DEVICE_DEST,
        default=os.environ.get("PNMIX_DEVICE", "auto"),
        choices=("auto", "cpu", "cuda"),
        help="device of the tests that take the `device` fixture (auto: cuda when available); env PNMIX_DEVICE; "
        "--pnmix-device and, in the repository, --device",
    )


#: The markers the suite's properties use, registered for a run outside the repository (its pyproject has them).
MARKERS = (
    "measurement: a conformance test that records what an implementation holds and asserts nothing; recorded as "
    "measured, never as a verdict",
    "token_precision: a conformance property of per-token precision caches (property 11)",
    "requires(capability, what): a conformance property that needs a capability the implementation may not claim",
    "slow: takes more than a few seconds on two CPU cores",
)
#: Where the device option lands (--pnmix-device; the repository's root conftest adds --device to it).
DEVICE_DEST = "pnmix_device"
#: The suite's test directory: a run whose paths reach it is the suite's (`active`).
SUITE_DIR = Path(__file__).parent.resolve()
_ACTIVE = pytest.StashKey[bool]()


def resolve_device(config: pytest.Config) -> torch.device:
    """The device the `device` fixture gives (auto: CUDA when available); UsageError for CUDA without one."""
    choice = config.getoption(DEVICE_DEST)
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda was asked for but torch.cuda.is_available() is False")
    return torch.device(choice)


def active(config: pytest.Config) -> bool:
    """Whether this run is the suite's: implementations named, or a path (or --pyargs name) of the run inside the
    conformance package or above it. Otherwise the plug-in, loaded by every pytest run where the package is
    installed, changes nothing."""
    if _ACTIVE in config.stash:
        return config.stash[_ACTIVE]
    found = bool(_chosen(config)) or runs_inside(config, SUITE_DIR, SUITE_DIR.name)
    config.stash[_ACTIVE] = found
    return found


def suite_id(item: pytest.Item) -> str:
    """A test's node id as the suite names it, from its package folder on ("conformance/test_p1_packing.py::..."),
    wherever pytest's root is: an installed suite's ids are relative to the root pytest chose (the package folder
    itself, or the directory it runs in)."""
    path = Path(item.path).resolve()
    _, sep, rest = item.nodeid.partition("::")
    if path.is_relative_to(SUITE_DIR):
        return path.relative_to(SUITE_DIR.parent).as_posix() + sep + rest
    return item.nodeid


def _chosen(config: pytest.Config) -> list[str]:
    """The implementations named on the command line or in PNMIX_IMPL (empty: every built-in)."""
    return config.getoption("--impl") or [n for n in os.environ.get("PNMIX_IMPL", "").split(",") if n]


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    config.stash[_IMPLS], config.stash[_ORIGINS], config.stash[_NAMES], config.stash[_RECORDS] = [], {}, {}, []
    if not active(config):
        return
    profiles.activate(config)
    names = _chosen(config)
    if not names:
        try:
            names = list(loader.builtins())
        except RuntimeError as err:
            raise pytest.UsageError(str(err)) from None
    impls, origins, loaded_as = [], {}, {}
    for name in dict.fromkeys(names):
        try:
            impl = loader.load(name)
        except ValueError as err:
            raise pytest.UsageError(str(err)) from None
        if impl.name in origins:  # results, known failures and report rows are keyed by the name
            raise pytest.UsageError(
                f"--impl {name} is named {impl.name!r}, as is {loaded_as[impl.name]} ({origins[impl.name]}): "
                "implementation names must be unique in a run; rename one (its `name` attribute)"
            )
        impls.append(impl)
        origins[impl.name] = loader.origin(name)
        loaded_as[impl.name] = name
    config.stash[_IMPLS] = impls
    config.stash[_ORIGINS] = origins
    config.stash[_NAMES] = loaded_as
    config.stash[_RECORDS] = []
    path = config.getoption("--conformance-json")
    if path and Path(path).exists():
        raise pytest.UsageError(f"--conformance-json {path} exists; results are never overwritten, pick a new path")
    if path:  # now, not after the run: a result that cannot be written is lost
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=Path(path).parent).close()
        except OSError as err:
            why = f"{err.strerror}: {err.filename}"
            raise pytest.UsageError(f"--conformance-json {path}: cannot write there ({why})") from None


def implementations(config: pytest.Config) -> list:
    return config.stash[_IMPLS]


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> torch.device:
    """The device of the properties (--device / --pnmix-device, PNMIX_DEVICE; auto: CUDA when available)."""
    return resolve_device(pytestconfig)


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not active(config):
        return []
    lines = []
    for impl in implementations(config):
        caps = impl.capabilities
        dtypes = ", ".join(str(d).removeprefix("torch.") for d in caps.dtypes)
        lines.append(
            f"pnmix conformance: implementation {impl.name} {impl.version} ({type(loader.unwrap(impl)).__module__}); "
            f"dtypes {dtypes}; devices {', '.join(caps.devices)}; sinks {caps.sinks}; "
            f"max tokens {caps.max_tokens}, max head_dim {caps.max_head_dim}"
        )
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" in metafunc.fixturenames and active(metafunc.config):
        impls = implementations(metafunc.config)
        metafunc.parametrize("impl", impls, ids=[impl.name for impl in impls])


#: The line of a known-failure file that binds it to the implementation it was written for.
FACTORY_LINE = re.compile(r"factory\s*=\s*(.*)")
_FACTORY_FORM = re.compile(r"[\w.]+:[\w.]+")


@dataclasses.dataclass(frozen=True)
class KnownFailures:
    """A known-failure file: the factory it was written for ('package.module:factory', from its
    'factory = ...' line; None: whichever implementation its node ids name) and its (node id, reason) lines."""

    path: Path
    factory: str | None
    lines: list[tuple[str, str]]


def read_known_failures(path: Path, flag: str) -> KnownFailures:
    """The file's factory and node ids; UsageError naming `flag`, the file and the line for what is unreadable,
    a malformed factory or a second one."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise pytest.UsageError(f"{flag} {path}: cannot read it ({why})") from None
    factory, lines = None, []
    for number, raw in enumerate(text.splitlines(), 1):
        nodeid, _, reason = raw.partition("#")
        bound = FACTORY_LINE.fullmatch(nodeid.strip())
        if bound is None:
            if nodeid.strip():
                lines.append((nodeid.strip(), reason.strip() or f"known failure listed in {path.name}"))
            continue
        if factory is not None or _FACTORY_FORM.fullmatch(bound[1].strip()) is None:
            said = "a second factory line" if factory is not None else f"got {nodeid.strip()!r}"
            raise pytest.UsageError(
                f"{flag} {path}:{number}: expected one line 'factory = package.module:factory' (the implementation "
                f"whose known failures the file lists), {said}"
            )
        factory = bound[1].strip()
    return KnownFailures(path, factory, lines)


def _factory_of(config: pytest.Config, impl) -> str:
    """The 'package.module:factory' the implementation was loaded from (`conformance.loader.factory`)."""
    return loader.factory(config.stash[_NAMES][impl.name])


def _owners(config: pytest.Config, known: KnownFailures, impls: list) -> list:
    """The implementations among `impls` whose known failures `known` lists: those loaded from its factory
    (a file that names none: every one). A name makes no owner: a plug-in named like a built-in is judged
    without the built-in's known failures."""
    if known.factory is None:
        return impls
    return [impl for impl in impls if _factory_of(config, impl) == known.factory]


def _known_failure_files(config: pytest.Config) -> list[tuple[KnownFailures, list]]:
    """Each known-failure file of this run with the implementations it belongs to: an implementation's
    own file (conformance/xfails/<name>.txt, which must name its factory) and every --xfails FILE; a file
    that belongs to none is said once."""
    impls, out = implementations(config), []
    for impl in impls:
        path = XFAIL_DIR / f"{impl.name}.txt"
        if not path.exists():
            continue
        known = read_known_failures(path, "known-failure file")
        if known.factory is None:
            raise pytest.UsageError(
                f"{path}: expected a line 'factory = package.module:factory' naming the implementation whose "
                "known failures it lists (its entry point in pyproject.toml)"
            )
        owners = _owners(config, known, [impl])
        if not owners:
            warnings.warn(
                f"{path} lists the known failures of {known.factory}, not of {impl.name!r} loaded from "
                f"{_factory_of(config, impl)}: none of them applied to it",
                stacklevel=1,
            )
        out.append((known, owners))
    for given in config.getoption("--xfails"):
        path = Path(given)
        if not path.exists():
            raise pytest.UsageError(f"--xfails {path} does not exist")
        known = read_known_failures(path, "--xfails")
        owners = _owners(config, known, impls)
        if not owners:
            warnings.warn(
                f"--xfails {path} lists the known failures of {known.factory}, which no implementation of this run "
                "is loaded from: none of them applied",
                stacklevel=1,
            )
        out.append((known, owners))
    return out


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not active(config):
        return
    if _chosen(config):  # checking named implementations never runs the suite's mutation tests
        meta = [item for item in items if suite_id(item).startswith(META)]
        if meta:
            config.hook.pytest_deselected(items=meta)
            items[:] = [item for item in items if not suite_id(item).startswith(META)]
    collected_files = {suite_id(item).split("::")[0] for item in items}
    for known, owners in _known_failure_files(config):
        # a file bound to a factory marks only its implementations' tests, whatever its ids say
        theirs = items if known.factory is None else [it for it in items if any(_impl_of(it) is o for o in owners)]
        for nodeid, reason in known.lines:
            matched = [it for it in theirs if suite_id(it) == nodeid or suite_id(it).startswith(nodeid + "[")]
            for item in matched:
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
            if owners and not matched and nodeid.split("::")[0] in collected_files:
                warnings.warn(f"{known.path}: known-failure id matches no collected test: {nodeid}", stacklevel=1)


def _impl_of(item: pytest.Item):
    """The implementation a test runs on; None for a test that takes none (or in a run that is not the suite's)."""
    if not active(item.config):
        return None
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("impl") if callspec is not None else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a property whose capability the implementation does not claim, before it runs."""
    if _impl_of(item) is None:
        return
    harness.forget_fitted()
    callspec = item.callspec
    handle = getattr(item.obj, "hypothesis", None)
    if handle is not None:  # each example the property runs is counted (`harness.TALLY`)
        handle.inner_test = harness.counting(handle.inner_test)
    impl = callspec.params["impl"]
    per_token = item.get_closest_marker("token_precision") is not None
    if not per_token and not impl.capabilities.channel_precision:
        pytest.skip(f"{impl.name} does not claim the per-channel cache family (PNMixConfig); it is per-token")
    if per_token and not impl.capabilities.token_precision:
        pytest.skip(f"{impl.name} does not claim per-token precision")
    for mark in item.iter_markers("requires"):
        capability, what = mark.args
        if not getattr(impl.capabilities, capability):
            pytest.skip(f"{impl.name} does not claim {what}")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """A property is skipped only when none of its examples fits the claims (each that does not is
    dropped, `harness.drop`); one that ran some examples and had every drawn case dropped passed on
    the examples that ran. A test of one fixed case counts as one example."""
    if _impl_of(pyfuncitem) is None:
        return (yield)
    tally, drawn = harness.TALLY, hasattr(pyfuncitem.obj, "hypothesis")
    try:
        result = yield
    except harness.Dropped:
        pytest.skip(f"no example fits its claims: {tally.reasons()}")
    except (Unsatisfiable, FailedHealthCheck) as err:
        if not tally.dropped or (isinstance(err, FailedHealthCheck) and "filter_too_much" not in str(err)):
            raise
        if tally.run == 0:
            pytest.skip(f"no example fits its claims: {tally.reasons()}")
        return None  # every drawn case lay outside the claims; the examples that fit passed
    except pytest.skip.Exception as skipped:
        _without_example_notes(skipped)
        raise
    except BaseException:
        tally.run += 0 if drawn else 1
        raise
    tally.run += 0 if drawn else 1
    return result


def _without_example_notes(skipped: BaseException) -> None:
    """A skip raised inside an example (a configuration the implementation does not claim) keeps its
    reason alone: hypothesis notes an explicit example that raised as 'Failing explicit example', and
    `harness.fitted` the fitted case, though nothing failed."""
    notes = getattr(skipped, "__notes__", None)
    if notes:
        notes[:] = [n for n in notes if not n.startswith((*_HYPOTHESIS_REPORT, harness.FITTED_NOTE))]
        if not notes:
            del skipped.__notes__


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, such as hypothesis' distinct failures.

    Read through the groups' `exceptions` tuple: Python 3.10 has no builtin BaseExceptionGroup.
    """
    inner = getattr(exc, "exceptions", None)
    if isinstance(inner, tuple) and inner and all(isinstance(e, BaseException) for e in inner):
        return [leaf for e in inner for leaf in leaves(e)]
    return [exc]


def _measured(properties: list[tuple[str, object]]) -> dict[str, object]:
    """What a property recorded (record_property, once per example): the largest of each number, the
    last of each text (a workload's description) and of each record (a workload's configuration)."""
    out: dict[str, object] = {}
    for name, value in properties:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = max(out.get(name, value), value)
        elif isinstance(value, (str, dict)):
            out[name] = value
    return out


#: Lines that end a message's own words: pytest's rewritten `assert` explanation, a tensor's dump.
_EXPLANATION = re.compile(r"^(assert |tensor\(|\[)")
_FILE_LINE = re.compile(r"^\S+\.py:\d+")
#: The text hypothesis adds to an exception it reports (its notes), which starts with one of these.
_HYPOTHESIS_REPORT = ("Failing explicit example", "Failing test case", "Falsifying example")


def _own_words(exc: BaseException) -> str:
    """'Class: message' of one exception: its first lines up to pytest's assertion explanation or a
    tensor dump (a bare `assert` keeps its first line), no file:line, on one line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not _FILE_LINE.match(line.strip())]
    kept = lines[:1]
    for line in lines[1:4]:
        if _EXPLANATION.match(line) or line.startswith(_HYPOTHESIS_REPORT):
            break
        kept.append(line)
    text = "; ".join(line[:300] for line in kept)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def failure_message(excinfo: pytest.ExceptionInfo) -> str:
    """What a failure says: the message of each distinct exception (hypothesis' distinct failures),
    joined by ' | ': the property's own words, not the file and line it was raised at."""
    return " | ".join(dict.fromkeys(_own_words(exc) for exc in leaves(excinfo.value)))[:1000]


def failing_example(excinfo: pytest.ExceptionInfo) -> str | None:
    """The fitted case of each distinct failure (hypothesis' shrunk example, as noted by
    `harness.fitted`), joined by ' | '; else the case the test fitted last; None if it fitted none."""
    noted = [case for exc in leaves(excinfo.value) for case in harness.failing_examples(exc)]
    if noted:
        return " | ".join(dict.fromkeys(noted))
    case = harness.last_fitted()
    return strategies.compact(case) if case is not None else None


def skip_reason(report: pytest.TestReport, call: pytest.CallInfo) -> str:
    """The reason given to pytest.skip, without what hypothesis appends to it (the example's report)."""
    if call.excinfo is not None and call.excinfo.errisinstance(pytest.skip.Exception):
        return str(call.excinfo.value.msg or "")
    text = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else ""
    kept = []
    for line in text.removeprefix("Skipped: ").splitlines():
        if line.startswith(_HYPOTHESIS_REPORT):
            break
        kept.append(line)
    return "\n".join(kept).strip()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = (yield).get_result()
    if _impl_of(item) is None:
        return
    callspec = item.callspec
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        raised = call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception)
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
            reason = report.wasxfail
        else:
            outcome = report.outcome
            if outcome == "passed" and item.get_closest_marker("measurement") is not None:
                outcome = "measured"  # it records numbers and asserts nothing: never a passing verdict
            if report.skipped:
                reason = skip_reason(report, call)
            elif raised:
                reason = failure_message(call.excinfo)
            else:  # failed without an exception: a strict xfail that passed
                reason = str(report.longrepr or "")
        impl = callspec.params["impl"]
        item.config.stash[_RECORDS].append(
            {
                "implementation": impl.name,
                "version": impl.version,
                "origin": item.config.stash[_ORIGINS].get(impl.name, impl.name),
                "property": item.originalname,
                "module": suite_id(item).split("::")[0],
                "nodeid": suite_id(item),
                "outcome": outcome,
                "reason": reason,
                # the failing example, fitted to the claims (and shrunk): also for a known failure
                "example": failing_example(call.excinfo) if raised else None,
                # what a property measured besides its verdict, e.g. P7's spec_distance
                "measured": _measured(item.user_properties),
                # examples run (dropped ones, outside the claims, not counted): 0 means the property never ran
                "examples": {"run": harness.TALLY.run, "dropped": sum(harness.TALLY.dropped.values())},
                "duration_s": round(report.duration, 4),
                "hypothesis_statistics": getattr(item, "hypothesis_statistics", None),
            }
        )


def claims(caps: Capabilities) -> dict[str, object]:
    """Every claim of `caps` as JSON: dtypes as their names, sets as sorted lists, the preset by its
    qualified name."""

    def plain(value: object) -> object:
        if isinstance(value, torch.dtype):
            return str(value).removeprefix("torch.")
        if isinstance(value, (frozenset, set)):
            return [plain(v) for v in sorted(value)]
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if callable(value):
            return f"{value.__module__}.{value.__qualname__}"
        return value

    return {f.name: plain(getattr(caps, f.name)) for f in dataclasses.fields(caps)}


def details(impl, config: pytest.Config) -> dict:
    """What an implementation is, where it came from, the code judged (its factory's package or
    module, `reference.records.implementation_targets`) and everything it claims."""
    cls = type(loader.unwrap(impl))
    return {
        "name": impl.name,
        "version": str(impl.version),
        "origin": config.stash[_ORIGINS].get(impl.name),
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "code": code_fingerprint(*implementation_targets(loader.factory_module(config.stash[_NAMES][impl.name]))),
        "claims": claims(impl.capabilities),
    }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    records = config.stash.get(_RECORDS, [])
    if not records or config.getoption("--no-conformance-json") or hasattr(config, "workerinput"):
        return
    from hypothesis import settings

    path = config.getoption("--conformance-json") or (
        Path(config.rootpath) / "reports" / "inputs" / f"conformance-{utc_stamp()}.json"
    )
    # the device the `device` fixture gave the tests (--device, auto: CUDA when available)
    choice = config.getoption(DEVICE_DEST)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if choice == "auto" else choice
    data = record(
        "conformance",
        device,
        # the judge: the suite and the spec it compares with
        code=code_fingerprint("conformance", "reference"),
        implementations=sorted({r["implementation"] for r in records}),
        implementation_details=[details(impl, config) for impl in implementations(config)],
        hypothesis_profile=settings.get_current_profile_name(),
        exitstatus=int(exitstatus),
        results=records,
    )
    written = write_json(path, data)
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"pnmix conformance: results written to {written}")
