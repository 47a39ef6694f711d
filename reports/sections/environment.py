"""Section 1: the machine, versions, git state, date and command line of this report, what it ran
and every result file it read."""

from __future__ import annotations

from collections.abc import Sequence

from reports.inputs import Source
from reports.markdown import Citations, Section, table
from reports.steps import Outcome


def _source_record(s: Source) -> tuple[str, str, str]:
    """(device, date, command) as the file records them (`reference.records.environment`)."""
    d = s.data
    if s.kind == "pytest-benchmark":
        infos = [b.get("extra_info") or {} for b in d["benchmarks"]]
        devices = sorted({i["device"] for i in infos if "device" in i}) or [
            d["machine_info"].get("cpu", {}).get("brand_raw", d["machine_info"].get("machine", "?"))
        ]
        dates = sorted({i["date_utc"] for i in infos if "date_utc" in i})
        date = (dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}") if dates else d.get("datetime", "?")
        commands = sorted({i["command"] for i in infos if "command" in i})
        return "; ".join(devices), date, "; ".join(commands) or s.command or "not recorded"
    # conformance results written before the records had one date field carry `created_utc`
    date = d.get("date_utc") or d.get("created_utc", "?")
    return d.get("device", "?"), date, d.get("command") or s.command or "not recorded"


def render(
    machine: dict,
    versions: dict,
    git: dict,
    started: str,
    finished: str,
    command: str,
    outcomes: Sequence[Outcome],
    sources: Sequence[Source],
    given: Sequence = (),
) -> Section:
    """`given`: the implementations of --impl/--only as the argument check loaded them (`reports.cli.Given`)."""
    cite = Citations("R")
    this = "measured: this report's run " + cite.cite(
        "this report's run: the machine and versions from `reference.records` (platform, importlib.metadata), "
        "the git state taken before anything was written"
    )
    parts = [
        cite.legend(),
        table([[k, v] for k, v in machine.items()], ["machine", ""], this),
        table([[k, v] for k, v in versions.items()], ["package", "version"], this),
        table(
            [
                ["commit", git.get("commit")],
                ["branch", git.get("branch", "-")],
                ["dirty", git["dirty"]],
                ["started (UTC)", started],
                ["finished (UTC)", finished],
                ["command", f"`{command}`"],
            ],
            ["run", ""],
            this,
        ),
        "### What ran here\n",
        table(
            [
                [
                    o.name,
                    f"`{o.command}`",
                    o.status,
                    f"{o.seconds:.0f}",
                    "-" if o.cpu_seconds is None else f"{o.cpu_seconds:.0f}",
                    ", ".join(f"`{p.name}`" for p in o.outputs) or "-",
                ]
                for o in outcomes
            ]
            or [["(nothing: every step was switched off)", "", "", "", "", ""]],
            ["step", "command", "status", "wall s", "CPU s", "results"],
            this + "; results and logs are in this folder's `data/`",
        ),
        "### Implementations given\n",
        table(
            [[f"`{g.given}`", g.name, g.version, f"`{g.file}`", g.origin] for g in given]
            or [["(none: the built-ins only)", "", "", "", ""]],
            ["given as", "name", "version", "module file", "origin"],
            this + "; loaded once, by the argument check, before any step (each step imports it again itself)",
        ),
        "### Result files read\n",
        table(
            [[f"`{s.name}`", s.kind, s.origin, *_source_record(s)] for s in sources]
            or [["(none)", "", "", "", "", ""]],
            ["file", "kind", "origin", "device", "date", "command"],
            "the files themselves (device, date and command as each records them)",
        ),
    ]
    return Section("Environment and provenance", "\n".join(parts))
