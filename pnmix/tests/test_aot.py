"""The GPU-readiness gate: every kernel compiles for sm_80 and sm_90, fits and does not spill; the decode
kernel's two static bounds (issue rate, bytes in flight) and the targets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from pnmix import aot, calibration, perfmodel
from pnmix.gpus import (
    GPUS,
    PIPES,
    REQUIRED_CEILING,
    REQUIRED_MEMORY_BOUND,
    REQUIRED_PATH_SPEEDUPS,
    REQUIRED_SPEEDUP,
    SM_LIMITS,
    issue_bound,
    memory_bound,
    pipe_bound,
    pipe_counts,
    programs_per_sm,
)
from pnmix.kernels import ttgir

TOOLS = aot.toolchain()
needs_tools = pytest.mark.skipif(isinstance(TOOLS, str), reason=f"ptxas toolchain absent: {TOOLS}")


def run_gate(tmp_path_factory, *flags: str):
    """`python -m pnmix.aot --default [flags]` in its own process (kernels compiled, not interpreted)."""
    out = tmp_path_factory.mktemp("aot") / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "pnmix.aot", "--default", *flags, "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(proc.stdout)  # the tables, shown with pytest -s or on failure
    return proc, json.loads(out.read_text()) if out.exists() else None


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return run_gate(tmp_path_factory)


@pytest.fixture(scope="module")
def gate_plain(tmp_path_factory):
    """The gate with the plain unpack of the decode kernels' value codes (the PTX unpack's fallback)."""
    return run_gate(tmp_path_factory, "--plain-unpack", "--bounds-only")


@pytest.mark.gpu_gate
@needs_tools
def test_every_kernel_compiles_fits_and_does_not_spill(gate):
    proc, result = gate
    assert result is not None, proc.stderr[-3000:]
    assert result["failures"] == [], "\n".join(result["failures"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    archs = {row["arch"] for row in result["kernels"]}
    assert archs == {80, 90}
    names = {row["kernel"] for row in result["kernels"]}
    assert {"_split_kernel", "_merge_kernel", "_encode_pack_kernel", "_group_params_kernel"} <= names
    for row in result["kernels"]:
        assert row["shared_bytes"] <= row["smem_limit"] and row["local_bytes"] == 0, row


@pytest.mark.gpu_gate
@needs_tools
def test_the_gate_prints_both_bounds_and_every_target(gate):
    proc, result = gate
    assert result is not None, proc.stderr[-3000:]
    for e in result["decode"]:
        gpus = {g.name for g in GPUS if g.arch == e["arch"]}
        assert set(e["bounds"]) == gpus, e
        for gpu, b in e["bounds"].items():
            bounds = {"issue": b["issue"], b["pipe_name"]: b["pipe"], "memory": b["memory"]}
            assert b["ceiling"] == min(bounds.values()) and 0 < b["memory"] <= 1, (gpu, b)
            assert bounds[b["binds"]] == b["ceiling"], (gpu, b)
            assert b["pipe_name"] in {p.name for p in PIPES} and b["pipe"] is not None, (gpu, b)
        # imad is a part of fma (the integer multiplies): every other pipe counts distinct instructions
        assert e["pipes"]["imad"] <= e["pipes"]["fma"], e
        assert sum(n for p, n in e["pipes"].items() if p != "imad") <= e["warp_instructions_per_tile"], e
        assert e["in_flight_per_sm"] == e["programs_per_sm"] * e["stages"] * e["tile_bytes"] > 0, e
    # each default case x GPU: the memory target; and the predicted speed-up on its one GPU; the fragment-order path's
    # speed-ups on that GPU, and its bfloat16 time against float16's there
    assert len(result["targets"]) == len(aot.GQA) * len(aot.DTYPES) * (len(GPUS) + 1) + 2 * len(REQUIRED_PATH_SPEEDUPS)
    assert result["below_target"] == [c["text"] for c in result["targets"] if not c["passed"]]
    for c in result["targets"]:
        assert f"{'PASS' if c['passed'] else 'FAIL'} target: {c['text']}" in proc.stdout
    for column in ("programs/SM", "in flight B/SM", "needed B/SM", "issue", "pipe", "memory", "binds", "ceiling"):
        assert f" {column} " in proc.stdout


@pytest.mark.gpu_gate
@needs_tools
def test_the_default_launch_keeps_enough_bytes_in_flight_on_every_gpu(gate):
    """Two programs per SM x three or four stages of 4,608-byte tiles: the memory target on A100, H100 and H200."""
    proc, result = gate
    assert result is not None, proc.stderr[-3000:]
    memory = [c for c in result["targets"] if c["bound"] == "memory"]
    assert len(memory) == len(aot.DTYPES) * len(aot.GQA) * len(GPUS)
    assert all(c["passed"] for c in memory), [c["text"] for c in memory if not c["passed"]]
    for e in result["decode"]:
        assert e["stages"] >= 2 and e["programs_per_sm"] * e["stages"] * e["tile_bytes"] == e["in_flight_per_sm"], e


def default_entries(result: dict) -> list[dict]:
    entries = [e for e in result["decode"] if e["method"] == aot.DEFAULT_METHOD and e["head_dim"] == 128]
    assert {(e["dtype"], e["gqa"]) for e in entries} == {(t, g) for t in aot.DTYPES for g in aot.GQA}
    return entries


@pytest.mark.gpu_gate
@needs_tools
def test_the_default_decode_kernel_keeps_enough_bytes_in_flight(gate):
    proc, result = gate
    for e in default_entries(result):
        for gpu, b in e["bounds"].items():
            assert b["memory"] >= REQUIRED_MEMORY_BOUND, (gpu, e)
    assert not [line for line in proc.stdout.splitlines() if line.startswith("FAIL target: memory")]


@pytest.mark.gpu_gate
@needs_tools
def test_the_default_pipeline_stages_never_cost_a_program_per_sm(gate):
    """`attention.pipeline_stages` deepens the copy pipeline only as far as shared memory allows: the default decode
    kernel's programs per SM are those its registers allow, on every arch."""
    _, result = gate
    for e in default_entries(result):
        assert e["stages"] > 2, e  # deeper than the two stages before variant 18 on sm_80 and sm_90
        assert e["programs_per_sm"] == programs_per_sm(e["arch"], e["registers"], e["warps"], 0), e


@pytest.mark.gpu_gate
@needs_tools
def test_the_gate_predicts_every_workload_on_every_gpu(gate):
    """Per default decode kernel, GPU and workload: the predicted time (split, merge, launches), % of HBM and the
    ratio to FP16 SDPA, printed beside the bounds."""
    proc, result = gate
    for e in default_entries(result):
        assert set(e["predictions"]) == {g.name for g in GPUS if g.arch == e["arch"]}, e
        for gpu, rows in e["predictions"].items():
            assert [p["workload"] for p in rows] == [w.name for w in perfmodel.WORKLOADS]
            for p in rows:
                assert p["time_us"] == pytest.approx(
                    max(p["split_us"], p["bytes"] / next(g for g in GPUS if g.name == gpu).hbm_gbps / 1e3)
                    + p["merge_us"]
                    + p["launch_us"],
                    abs=2e-3,
                )
                assert p["speedup_vs_fp16"] == pytest.approx(p["fp16_us"] / p["time_us"], rel=1e-2)
                assert 0 < p["fraction_of_hbm"] <= 1 and p["fp16_source"]
                # below the binding bound: a prediction cannot beat what the compiled code can reach at best
                assert p["fraction_of_hbm"] <= e["bounds"][gpu]["ceiling"] + 1e-9, (gpu, p)
    for column in ("split / merge / launch us", "% of HBM", "FP16 us", "vs FP16", "lowest bound"):
        assert f" {column} " in proc.stdout


@pytest.mark.gpu_gate
@needs_tools
def test_every_calibration_point_is_predicted_within_its_tolerance(gate):
    """Each kernel a GPU timed (pnmix.calibration), compiled from its commit and predicted at the point it was
    timed: within TOLERANCE of the measurement, so the model cannot drift away from what a GPU showed."""
    proc, result = gate
    points = result["calibration"]
    assert len(points) == len(calibration.POINTS)
    unavailable = [p["error"] for p in points if "error" in p]
    if unavailable:
        pytest.skip(f"calibration kernels unavailable: {unavailable[0]}")
    for p in points:
        assert p["holds"] and 1 / calibration.TOLERANCE <= p["ratio"] <= calibration.TOLERANCE, p
        assert f"calibration: {p['label']}" in proc.stdout


@pytest.mark.gpu_gate
@needs_tools
def test_the_default_kernel_is_predicted_at_its_speedup_target(gate):
    """The target: PN-Mix's decode attention predicted REQUIRED_SPEEDUP x faster than FP16 SDPA (H100, B = 64,
    32K). An expected failure until the kernel gets there, whose reason is the predicted figure."""
    _, result = gate
    checks = [c for c in result["targets"] if c["bound"] == "speedup"]
    assert len(checks) == len(aot.DTYPES) * len(aot.GQA) and all(c["got"] is not None for c in checks)
    below = [c["text"] for c in checks if not c["passed"]]
    if below:
        pytest.xfail("; ".join(below))
    assert all(c["got"] >= REQUIRED_SPEEDUP["speedup"] for c in checks)


@pytest.mark.gpu_gate
@needs_tools
def test_the_fragment_order_loop_compiles_without_spills_and_keeps_codes_out_of_shared_memory(gate):
    """`pnmix.kernels.fragment_decode` on sm_80 and sm_90, in each form the package launches (merging its splits
    itself or leaving them to the merge kernel; with the inline-PTX pair unpack, `ptx.fragment_pair`, and without,
    the path a failed self-test takes): no spills, and no shared-memory store in its loop (the codes go from their
    cp.async copy to the MMA's registers; every layout conversion on the way is asserted trivial when it
    compiles)."""
    proc, result = gate
    designs = {(d["arch"], d["dtype"]): d for d in result["fragment_design"]}
    assert set(designs) == {(a, t) for a in (80, 90) for t in ("float16", "bfloat16")}, result["fragment_design"]
    for d in designs.values():
        assert d["problems"] == [] and d["local_bytes"] == 0 and d["loop_shared_stores"] == 0, d
        assert len(d["forms"]) == 4 and all(
            f["local_bytes"] == f["loop_shared_stores"] == 0 for f in d["forms"].values()
        )
        # batch 1 merges in the loop (one wave), batch 64 leaves it to the merge kernel
        forms = {p["workload"]: p["form"] for ps in d["predictions"].values() for p in ps}
        assert {w: f for w, f in forms.items() if "B=1," in w} == {
            w: "merging in the loop" for w in forms if "B=1," in w
        }
        assert {f for w, f in forms.items() if "B=64," in w} == {"with the merge kernel"}
    assert "Fragment-order path" in proc.stdout


@pytest.mark.gpu_gate
@needs_tools
def test_the_fragment_order_path_is_predicted_past_the_thresholds_on_an_h100(gate):
    """What the package runs at the default configuration in float16 where the loop passed its self-test, predicted
    on an H100 (`REQUIRED_PATH_SPEEDUPS`: 2.0x FP16 SDPA at B = 64, 32K, 1.5x at B = 1, 32K, no slower at 4K), and
    the gate's path targets say the same."""
    _, result = gate
    h100 = next(d for d in result["fragment_design"] if (d["arch"], d["dtype"]) == (90, "float16"))["predictions"][
        REQUIRED_SPEEDUP["gpu"]
    ]
    got = {p["workload"]: p["speedup_vs_fp16"] for p in h100}
    assert set(got) == set(REQUIRED_PATH_SPEEDUPS)
    below = {w: got[w] for w, t in REQUIRED_PATH_SPEEDUPS.items() if got[w] < t}
    path_checks = {c["workload"]: c for c in result["targets"] if c["bound"] == "path speedup"}
    assert {w for w, c in path_checks.items() if not c["passed"]} == set(below)
    assert not below, got
    # bfloat16 (queries as float16 under a power of two, the exact tiles in bfloat16) within 15 % of float16's time
    ratios = {c["workload"]: c for c in result["targets"] if c["bound"] == "path bfloat16"}
    assert set(ratios) == set(REQUIRED_PATH_SPEEDUPS) and all(c["passed"] for c in ratios.values()), ratios


#: The goal past the targets: the decode loop's issue bound at 70 % of HBM on an A100 and 50 % on an H100.
GOAL = {"A100-SXM4-40GB": 0.70, "H100-SXM": 0.50}


@pytest.mark.gpu_gate
@needs_tools
@pytest.mark.xfail(reason="the decode kernel is below the 70 % / 50 % goal (pnmix/kernels/NOTES.md)", strict=True)
def test_the_default_decode_kernel_reaches_the_goal(gate):
    for e in default_entries(gate[1]):
        for gpu, b in e["bounds"].items():
            assert b["ceiling"] >= GOAL.get(gpu, 0), (gpu, e)


@pytest.mark.gpu_gate
@needs_tools
def test_with_either_unpack_every_kernel_compiles_without_spills_and_the_ptx_groups_fours_of_one_shift(
    gate, gate_plain
):
    proc, result = gate
    assert result is not None, proc.stderr[-3000:]
    assert result["ptx_unpack"] is True and result["failures"] == [], "\n".join(result["failures"])
    assert proc.returncode == 0 and "PTX unpack (the default" in proc.stdout
    for row in result["kernels"]:
        assert row["grouping"] == [] and row["local_bytes"] == 0, row
    # the default decode kernels unpack their 2-bit values by inline PTX, in float16 and in bfloat16
    assert all(e["inline_asm"] > 0 for e in result["decode"]), result["decode"]
    plain_proc, plain = gate_plain
    assert plain is not None and plain_proc.returncode == 0, plain_proc.stderr[-3000:]
    assert plain["ptx_unpack"] is False and plain["failures"] == [], "\n".join(plain["failures"])
    assert all(e["inline_asm"] == 0 for e in plain["decode"])  # the fallback: none


#: Compiles the default float16 decode kernel with the PTX unpack for sm_80 and writes its TTGIR.
TTGIR_SCRIPT = """
import sys
from pnmix import _runtime, aot
from pnmix.kernels import ptx_unpack
with ptx_unpack.request(True):
    launches, _ = aot.record_launches(aot.Case(aot.DEFAULT_METHOD, "float16", 128, 4), _runtime.Target(80, 108))
(launch,) = [l for l in launches if l.name == aot.DECODE_KERNEL]
sys.stdout.write(aot._compile(launch, 80).asm["ttgir"])
"""


@pytest.mark.gpu_gate
@needs_tools
def test_the_grouping_check_reads_the_compiled_layout_and_fails_when_it_mixes_shifts():
    env = dict(os.environ, TRITON_INTERPRET="0")  # compiled, as pnmix.aot runs itself
    proc = subprocess.run([sys.executable, "-c", TTGIR_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = proc.stdout
    ops = ttgir.inline_asm_ops(real)
    assert ops and ttgir.grouping_problems(real) == [], ttgir.grouping_problems(real)
    aliases = {op.operands[0][2] for op in ops}
    print({a: ttgir.layouts(real)[a] for a in aliases})  # what Triton chose, shown with pytest -s
    # the same kernel whose operand layout gave each thread 2 x 2 elements: four elements of two columns
    broken = real
    for alias in aliases:
        line = next(x for x in real.splitlines() if x.startswith(f"{alias} = "))
        broken = broken.replace(line, re.sub(r"sizePerThread = \[[^\]]*\]", "sizePerThread = [2, 2]", line))
    assert broken != real and len(ttgir.grouping_problems(broken)) == len(ops)


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/                   ISETP.GE.AND P0, PT, R2, 0x10, PT ;
        /*0030*/               @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0040*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0050*/                   LOP3.LUT R3, R3, 0x1, RZ, 0xc0, !PT ;
        /*0060*/                   SHF.R.U32.HI R3, RZ, 0x1, R3 ;
        /*0070*/               @P1 BRA `(.L_x_1) ;
        /*0080*/                   EXIT ;
.L_x_2:
        /*0090*/                   BRA `(.L_x_2);
"""


def test_the_main_loop_is_the_largest_backward_branch_and_not_the_exit_trap():
    assert aot.main_loop_instructions(SASS) == 4
    assert aot.main_loop_instructions(SASS.split(".L_x_1:")[0]) == 3
    assert aot.main_loop_instructions("        /*0000*/    EXIT ;") is None


def test_opcodes_are_counted_without_predicates_and_modifiers_in_the_main_loop_only():
    body = aot.main_loop_body(SASS)
    assert body is not None and len(body) == 4 and body[0].startswith("HMMA")
    assert aot.opcodes(body) == {"HMMA": 1, "LOP3": 1, "SHF": 1, "BRA": 1}
    assert aot.opcodes(["@!P0 IMAD.MOV.U32 R1, RZ, RZ, R2", "@PT FFMA R1, R2, R3, R4", "I2F.F16 R1, R2"]) == {
        "IMAD": 1,
        "FFMA": 1,
        "I2F": 1,
    }
    assert pipe_counts({"HMMA": 1, "LOP3": 2, "SHF": 1, "BRA": 1, "IMAD": 3, "FFMA": 4, "F2F": 1}) == {
        "fma": 7,
        "imad": 3,
        "alu": 3,
        "xu": 1,
    }


def _pipes_entry(arch, ops, loop):
    row = _row(arch, loop=loop, stages=2) | {"loop_opcodes": ops}
    return aot.decode_entry(aot.Case(aot.DEFAULT_METHOD, "float16", 128, 4), arch, row, 4608)


def test_each_pipe_bounds_the_loop_at_its_own_rate_and_the_lowest_binds():
    a100, h100, _ = GPUS
    fma = next(p for p in PIPES if p.name == "fma")
    # fp32 at half the issue rate on sm_80 (64 results per clock per SM), the full rate on sm_90 (128)
    assert pipe_bound(a100, 4608, 1000, fma) == pytest.approx(issue_bound(a100, 4608, 1000) / 2)
    assert pipe_bound(h100, 4608, 1000, fma) == pytest.approx(issue_bound(h100, 4608, 1000))
    # a loop of 1,000 instructions per warp, 600 of them FFMA: fp32 binds on sm_80 (600 x 2 > 1,000 issue slots)
    ops = {"FFMA": 600, "LOP3": 100, "HMMA": 300}
    a = _pipes_entry(80, ops, 1000)["bounds"]["A100-SXM4-40GB"]
    assert a["pipe_name"] == "fma" and a["binds"] == "fma" and a["ceiling"] == a["pipe"]
    assert a["pipe"] == pytest.approx(a["issue"] * 1000 / (600 * 2), abs=1e-4)
    # ... not on sm_90, where fp32 issues at full rate: issue binds there
    h = _pipes_entry(90, ops, 1000)["bounds"]["H100-SXM"]
    assert h["binds"] == "issue" and h["ceiling"] == h["issue"] and h["pipe"] >= h["issue"]
    # IMAD at half rate on both, sharing fma with fp32 on sm_80: 300 IMAD + 300 FFMA bind on sm_80 only as fma
    ops = {"IMAD": 300, "FFMA": 300, "HMMA": 400}
    assert _pipes_entry(80, ops, 1000)["bounds"]["A100-SXM4-40GB"]["pipe_name"] == "fma"
    h = _pipes_entry(90, ops, 1000)["bounds"]["H100-SXM"]
    assert h["pipe_name"] == "fma" and h["pipe"] == pytest.approx(h["issue"] * 1000 / 600, abs=1e-4)
    ops = {"IMAD": 600, "HMMA": 400}
    h = _pipes_entry(90, ops, 1000)["bounds"]["H100-SXM"]
    assert h["binds"] == "imad" and h["pipe"] == pytest.approx(h["issue"] * 1000 / 1200, abs=1e-4)
    # conversions at 16 results per clock (1/8 of issue): 130 of 1,000 bind
    e = _pipes_entry(80, {"I2F": 130, "NOP": 870}, 1000)
    assert e["pipes"] == {"xu": 520} and e["bounds"]["A100-SXM4-40GB"]["binds"] == "xu"
    # integer and bit operations at half rate on both: 501 of 1,000 bind
    assert _pipes_entry(90, {"LOP3": 301, "SHF": 200, "NOP": 499}, 1000)["bounds"]["H200"]["binds"] == "alu"
    assert _pipes_entry(90, {"LOP3": 300, "SHF": 199, "NOP": 501}, 1000)["bounds"]["H200"]["binds"] == "issue"
    text = aot.render(
        {"archs": [80], "kernels": [], "decode": [_pipes_entry(80, {"FFMA": 600, "NOP": 400}, 1000)], "failures": []}
        | {"targets": []}
    )
    assert " fma |" in text and "| fma " in text


def test_the_issue_bound_is_bytes_per_warp_instruction_times_the_issue_rate_over_bandwidth():
    a100 = next(g for g in GPUS if g.name == "A100-SXM4-40GB")
    # 4.6 KB per 13.3K warp-instructions (the issue's measurement of the first kernel): about 14 %
    assert issue_bound(a100, 4608, 13292) == pytest.approx(4608 / 13292 * 108 * 4 * 1.41e9 / 1555e9)
    assert 0.13 < issue_bound(a100, 4608, 13292) < 0.14
    assert set(REQUIRED_CEILING) == set(aot.DTYPES)
    assert all(set(need) <= {g.name for g in GPUS} for need in REQUIRED_CEILING.values())


@pytest.mark.parametrize(
    ("arch", "registers", "warps", "shared", "programs"),
    [
        (80, 255, 4, 22528, 2),  # 255 x 32 -> 8,192 registers per warp: 8 warps of 65,536
        (90, 168, 4, 22528, 3),  # 168 x 32 = 5,376 per warp: 12 warps
        (90, 255, 8, 22528, 1),
        (80, 32, 4, 80_000, 2),  # shared memory: 167,936 // (80,000 + 1,024)
        (90, 32, 4, 80_000, 2),  # 233,472 // 81,024
        (80, 16, 32, 0, 2),  # warps: 64 // 32
        (80, 16, 1, 0, 32),  # block slots
        (80, 255, 16, 0, 0),  # does not fit
    ],
)
def test_programs_per_sm_are_the_occupancy_calculators(arch, registers, warps, shared, programs):
    assert programs_per_sm(arch, registers, warps, shared) == programs


def test_the_memory_bound_is_bytes_in_flight_over_latency_times_bandwidth():
    a100, h100, h200 = GPUS
    # Little's law per SM: bandwidth x latency / SMs
    assert h200.bytes_in_flight_per_sm == pytest.approx(4800e9 * 348e-9 / 132)  # 12,655 B
    assert a100.bytes_in_flight_per_sm == pytest.approx(1555e9 * 392e-9 / 108)  # 5,644 B
    # two programs of one 4,608-byte tile each: 9,216 B in flight
    assert memory_bound(h200, 2, 1, 4608) == pytest.approx(9216 / (4800e9 * 348e-9 / 132))  # 73 %
    assert memory_bound(h100, 2, 1, 4608) == 1.0  # 9,216 B >= 8,832 B needed
    assert memory_bound(a100, 1, 1, 4608) == pytest.approx(4608 / 5644.0, rel=1e-4)
    assert memory_bound(h200, 2, 2, 4608) == 1.0
    for gpu in GPUS:
        assert gpu.dram_latency_ns > 0 and "latency" in gpu.source and gpu.arch in SM_LIMITS


def _row(arch, registers=255, loop=2114, warps=4, stages=1, shared=22528):
    return {
        "kernel": aot.DECODE_KERNEL,
        "arch": arch,
        "warps": warps,
        "stages": stages,
        "registers": registers,
        "shared_bytes": shared,
        "loop_instructions": loop,
    }


def test_the_lower_bound_binds_and_the_targets_say_pass_or_fail():
    fp16 = aot.Case(aot.DEFAULT_METHOD, "float16", 128, 4)
    sm80 = aot.decode_entry(fp16, 80, _row(80), 4608)
    b = sm80["bounds"]["A100-SXM4-40GB"]
    assert b["issue"] == pytest.approx(4608 / (2114 * 4) * 108 * 4 * 1.41e9 / 1555e9, abs=1e-4)  # 21 %
    assert (b["memory"], b["binds"], b["ceiling"]) == (1.0, "issue", b["issue"])
    # a loop of 100 SASS per warp: the issue bound passes 100 %, the memory bound binds on the H200
    sm90 = aot.decode_entry(fp16, 90, _row(90, loop=100), 4608)
    assert set(sm90["bounds"]) == {"H100-SXM", "H200"}
    h200 = sm90["bounds"]["H200"]
    assert h200["issue"] > 1 and h200["binds"] == "memory" and h200["ceiling"] == h200["memory"] == 0.7283
    checks = aot.targets([sm80, sm90, aot.decode_entry(aot.Case("KIVI-2", "float16", 128, 4), 80, _row(80), 4608)])
    got = {(c["gpu"], c["bound"]): c["passed"] for c in checks}  # the non-default case is not a target
    # without predictions the speed-up target is "not predicted", a failure
    assert got == {
        ("A100-SXM4-40GB", "memory"): True,
        ("H100-SXM", "memory"): True,
        ("H100-SXM", "speedup"): False,
        ("H200", "memory"): False,
    }
    assert "not predicted" in next(c["text"] for c in checks if c["bound"] == "speedup")
    # a prediction at the target's workload decides it, either way
    point = {"workload": REQUIRED_SPEEDUP["workload"], "speedup_vs_fp16": REQUIRED_SPEEDUP["speedup"]}
    for speedup, passed in ((REQUIRED_SPEEDUP["speedup"], True), (REQUIRED_SPEEDUP["speedup"] - 0.01, False)):
        sm90["predictions"] = {"H100-SXM": [point | {"speedup_vs_fp16": speedup}]}
        (check,) = [c for c in aot.targets([sm90]) if c["bound"] == "speedup"]
        assert check["passed"] is passed and check["got"] == speedup
    del sm90["predictions"]
    result = {
        "archs": [80, 90],
        "kernels": [_row(80) | {"local_bytes": 0, "smem_limit": 1, "instructions": 9}],
        "decode": [sm80, sm90],
        "failures": [],
        "targets": checks,
    }
    text = aot.render(result)
    assert (
        "FAIL target: predicted speed-up of the Triton kernel (the fallback) over FP16 SDPA not predicted < 2.0x"
        in text
    )
    assert "PASS target: memory bound 100% >= 90% on A100-SXM4-40GB (float16, GQA 4)" in text
    assert "FAIL target: memory bound 73% < 90% on H200 (float16, GQA 4)" in text
    h200_rows = [line for line in text.splitlines() if "| H200 " in line]
    assert len(h200_rows) == 1 and " 12655 |" in h200_rows[0]


def test_tile_bytes_count_every_quantized_component_of_the_default_layout():
    import torch

    from reference import CacheLayout, PNMixConfig

    layout = CacheLayout(PNMixConfig(), 1, 1, 128, torch.float16, None)
    # keys: 1 bit x 128 + 2 high bits x 64 channels; fp16 scale and zero per channel per 128 tokens;
    # values: 2 bits x 128, fp16 scale and zero per token
    per_token = 128 / 8 + 64 * 2 / 8 + 2 * 2 * 128 / 128 + 128 * 2 / 8 + 2 * 2
    assert aot.tile_bytes(layout, 64) == pytest.approx(64 * per_token)


def test_a_block_whose_registers_exceed_the_register_file_is_a_failure():
    row = {"shared_bytes": 0, "smem_limit": 1, "local_bytes": 0, "registers": 255, "warps": 8}
    assert aot.problems(row) == []  # 255 x 256 threads fits 65,536
    (problem,) = aot.problems(row | {"warps": 16})
    assert "255 registers x 512 threads" in problem and "cannot launch" in problem
