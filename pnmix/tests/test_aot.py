"""The GPU-readiness gate: every kernel compiles for sm_80 and sm_90, fits and does not spill."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pnmix import aot
from pnmix.gpus import GPUS, REQUIRED_CEILING, ceiling

TOOLS = aot.toolchain()
needs_tools = pytest.mark.skipif(isinstance(TOOLS, str), reason=f"ptxas toolchain absent: {TOOLS}")


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    """`python -m pnmix.aot --default` in its own process (kernels compiled, not interpreted)."""
    out = tmp_path_factory.mktemp("aot") / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "pnmix.aot", "--default", "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=1200)  # fmt: skip
    print(proc.stdout)  # the tables, shown with pytest -s or on failure
    return proc, json.loads(out.read_text()) if out.exists() else None


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
@pytest.mark.xfail(reason="the decode kernel's static ceiling is below the target (pnmix/kernels/NOTES.md)")
def test_the_default_decode_kernel_reaches_its_static_ceiling(gate):
    _, result = gate
    entries = [e for e in result["decode"] if e["method"] == aot.DEFAULT_METHOD and e["head_dim"] == 128]
    assert {(e["dtype"], e["gqa"]) for e in entries} == {(t, g) for t in aot.DTYPES for g in aot.GQA}
    for e in entries:
        for gpu, need in REQUIRED_CEILING.items():
            if gpu in e["ceilings"]:
                assert e["ceilings"][gpu] >= need, (gpu, e)


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


def test_the_ceiling_is_bytes_per_warp_instruction_times_the_issue_rate_over_bandwidth():
    a100 = next(g for g in GPUS if g.name == "A100-SXM4-40GB")
    # 4.6 KB per 13.3K warp-instructions (the issue's measurement of the first kernel): about 14 %
    assert ceiling(a100, 4608, 13292) == pytest.approx(4608 / 13292 * 108 * 4 * 1.41e9 / 1555e9)
    assert 0.13 < ceiling(a100, 4608, 13292) < 0.14
    assert set(REQUIRED_CEILING) <= {g.name for g in GPUS}


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
