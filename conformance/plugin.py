"""pytest plug-in of the conformance suite (loaded by the root conftest.py).

--impl NAME (repeatable, or PNMIX_IMPL=a,b) picks the implementations; every test that takes
the `impl` fixture runs once per implementation, with its name in the test id. Known failures
per implementation live in conformance/xfails/<name>.txt (and --xfails FILE): one node id per
line, '#' starts a reason. Each run writes a JSON result (implementation, property, outcome,
reason, hypothesis statistics) to --conformance-json, by default a new timestamped file in
reports/inputs/.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from reference.records import record, utc_stamp, write_json

from . import loader

XFAIL_DIR = Path(__file__).parent / "xfails"
_IMPLS = pytest.StashKey[list]()
_RECORDS = pytest.StashKey[list]()


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


def pytest_configure(config: pytest.Config) -> None:
    names = config.getoption("--impl") or [n for n in os.environ.get("PNMIX_IMPL", "").split(",") if n]
    if not names:
        try:
            names = list(loader.builtins())
        except RuntimeError as err:
            raise pytest.UsageError(str(err)) from None
    impls = []
    for name in dict.fromkeys(names):
        try:
            impls.append(loader.load(name))
        except ValueError as err:
            raise pytest.UsageError(str(err)) from None
    config.stash[_IMPLS] = impls
    config.stash[_RECORDS] = []
    path = config.getoption("--conformance-json")
    if path and Path(path).exists():
        raise pytest.UsageError(f"--conformance-json {path} exists; results are never overwritten, pick a new path")


def implementations(config: pytest.Config) -> list:
    return config.stash[_IMPLS]


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    for impl in implementations(config):
        caps = impl.capabilities
        dtypes = ", ".join(str(d).removeprefix("torch.") for d in caps.dtypes)
        lines.append(
            f"pnmix conformance: implementation {impl.name} {impl.version} ({type(impl).__module__}); "
            f"dtypes {dtypes}; devices {', '.join(caps.devices)}; sinks {caps.sinks}; "
            f"max tokens {caps.max_tokens}, max head_dim {caps.max_head_dim}"
        )
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" in metafunc.fixturenames:
        impls = implementations(metafunc.config)
        metafunc.parametrize("impl", impls, ids=[impl.name for impl in impls])


def _xfail_lines(path: Path) -> list[tuple[str, str]]:
    out = []
    for raw in path.read_text().splitlines():
        nodeid, _, reason = raw.partition("#")
        if nodeid.strip():
            out.append((nodeid.strip(), reason.strip() or f"known failure listed in {path.name}"))
    return out


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    files = [XFAIL_DIR / f"{impl.name}.txt" for impl in implementations(config)]
    files += [Path(p) for p in config.getoption("--xfails")]
    collected_files = {item.nodeid.split("::")[0] for item in items}
    for path in files:
        if not path.exists():
            if path.parent != XFAIL_DIR:
                raise pytest.UsageError(f"--xfails {path} does not exist")
            continue
        for nodeid, reason in _xfail_lines(path):
            matched = [it for it in items if it.nodeid == nodeid or it.nodeid.startswith(nodeid + "[")]
            for item in matched:
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
            if not matched and nodeid.split("::")[0] in collected_files:
                warnings.warn(f"{path}: known-failure id matches no collected test: {nodeid}", stacklevel=1)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a property whose capability the implementation does not claim, before it runs."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or "impl" not in callspec.params:
        return
    impl = callspec.params["impl"]
    for mark in item.iter_markers("requires"):
        capability, what = mark.args
        if not getattr(impl.capabilities, capability):
            pytest.skip(f"{impl.name} does not claim {what}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = (yield).get_result()
    callspec = getattr(item, "callspec", None)
    if callspec is None or "impl" not in callspec.params:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
            reason = report.wasxfail
        else:
            outcome = report.outcome
            reason = ""
            if report.skipped and isinstance(report.longrepr, tuple):
                reason = str(report.longrepr[2]).removeprefix("Skipped: ")
            elif report.failed:
                reason = report.longreprtext.strip().splitlines()[-1][:500] if report.longreprtext else ""
        impl = callspec.params["impl"]
        item.config.stash[_RECORDS].append(
            {
                "implementation": impl.name,
                "version": impl.version,
                "property": item.originalname,
                "module": item.nodeid.split("::")[0],
                "nodeid": item.nodeid,
                "outcome": outcome,
                "reason": reason,
                "duration_s": round(report.duration, 4),
                "hypothesis_statistics": getattr(item, "hypothesis_statistics", None),
            }
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    records = config.stash.get(_RECORDS, [])
    if not records or config.getoption("--no-conformance-json") or hasattr(config, "workerinput"):
        return
    import torch
    from hypothesis import settings

    path = config.getoption("--conformance-json") or (
        Path(config.rootpath) / "reports" / "inputs" / f"conformance-{utc_stamp()}.json"
    )
    # the device the `device` fixture gave the tests (--device, auto: CUDA when available)
    choice = config.getoption("--device", "auto")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if choice == "auto" else choice
    data = record(
        "conformance",
        device,
        implementations=sorted({r["implementation"] for r in records}),
        hypothesis_profile=settings.get_current_profile_name(),
        exitstatus=int(exitstatus),
        results=records,
    )
    written = write_json(path, data)
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"pnmix conformance: results written to {written}")
