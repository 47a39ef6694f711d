"""The performance model (`pnmix.perfmodel`) on hand-written SASS whose time is known, and the control-code reader."""

from __future__ import annotations

import pytest

from pnmix import perfmodel, sass
from pnmix.gpus import GPUS
from pnmix.sass import Instruction

H100 = next(g for g in GPUS if g.name == "H100-SXM")
A100 = next(g for g in GPUS if g.name == "A100-SXM4-40GB")


def ins(text: str, stall: int = 1, write: int | None = None, read: int | None = None, wait: int = 0) -> Instruction:
    return Instruction(text, stall, write, read, wait)


def loop_code(body: list[Instruction], before: list[Instruction] = ()) -> perfmodel.Code:
    """`before`, then a loop over `body` (a backward branch closing it), then EXIT."""
    listing = [*before, ".L_x_0", *body, ins("@P0 BRA `(.L_x_0)"), ins("EXIT")]
    return perfmodel.Code.of(listing)


def per_iteration(code: perfmodel.Code, machine: perfmodel.Machine, programs: int = 1) -> float:
    sim = perfmodel.simulate(code, {0: 6}, machine, programs, 4)
    return sim.per_iteration[0]


def test_the_control_code_is_read_from_the_upper_bits_of_the_encoding():
    # LDC R1, c[0x0][0x28] (sm_90, ptxas of triton 3.7.1): stall 1, sets scoreboard 1
    assert sass.control_code(0x000E620000000800) == (1, 1, None, 0)
    # SHF.R.U32.HI R157, RZ, 0x4, R0 waiting on scoreboard 2 (the S2R of R0), stall 2
    _, write, read, wait = sass.control_code(0x000FE40000000800 | (0b000100 << 52))
    assert wait == 0b000100 and write is None and read is None
    listing = sass.instructions(
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */\n"
        "                                                                          /* 0x000e620000000800 */\n"
        ".L_x_0:\n"
        "        /*0010*/                   EXIT ;                                   /* 0x000000000000794d */\n"
        "                                                                          /* 0x000fea0003800000 */\n"
    )
    assert listing[0] == Instruction("LDC R1, c[0x0][0x28]", 1, 1, None, 0) and listing[1] == ".L_x_0"
    assert listing[2].base == "EXIT"
    with pytest.raises(ValueError, match="second encoding word"):
        sass.instructions("        /*0000*/  EXIT ;   /* 0x000000000000794d */\n")


def test_a_chain_of_stalls_takes_its_stall_counts_and_warps_fill_each_others_gaps():
    machine = perfmodel.Machine.of(H100, 1.0)
    body = [ins("FFMA R0, R0, R1, R2", stall=4) for _ in range(10)]
    one = per_iteration(loop_code(body), machine)
    assert one == pytest.approx(10 * 4 + 1, abs=1)  # the loop's 10 stalls of 4 and its branch
    # three warps interleave into the stalls: each still takes its chain, the scheduler issues 3x as much
    assert per_iteration(loop_code(body), machine, programs=3) == pytest.approx(one, abs=2)
    # eight warps over-subscribe the scheduler: issue binds (11 instructions per warp per iteration)
    assert per_iteration(loop_code(body), machine, programs=8) == pytest.approx(8 * 11, rel=0.05)


def test_a_load_waited_in_the_same_iteration_exposes_its_dram_latency_and_a_prefetch_hides_it():
    machine = perfmodel.Machine.of(H100, 1.0)
    waited = [ins("LDG.E.128 R4, desc[UR4][R2.64]", write=0), ins("FFMA R0, R4, R4, R0", wait=0b1)]
    assert per_iteration(loop_code(waited), machine) == pytest.approx(machine.dram_cycles, rel=0.05)
    # the wait is found where it is: before the FFMA (index 1), on DRAM, a round trip per iteration
    waits = perfmodel.simulate(loop_code(waited), {0: 6}, machine, 1, 4).waits
    assert set(waits) == {1} and waits[1][0] == "dram"
    assert waits[1][1] == pytest.approx(3 * machine.dram_cycles, rel=0.05)  # each of the 3 simulated iterations
    # the same load for the next iteration as an asynchronous copy waited one group later: only the work is exposed
    work = [ins("FFMA R0, R0, R1, R2", stall=4) for _ in range(100)]
    piped = [
        ins("DEPBAR.LE SB0, 0x1"),
        *work,
        ins("LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]", read=1),
        ins("LDGDEPBAR", write=0),
    ]
    first = [ins("LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]"), ins("LDGDEPBAR", write=0)]
    prefetched = per_iteration(loop_code(piped, before=first), machine)
    assert prefetched == pytest.approx(100 * 4 + 3, rel=0.05)  # two tiles in flight: the copy hides behind the work
    # waited at once (DEPBAR.LE SB0, 0x0 at the top after a copy at the end of the body): the latency is exposed
    serial = per_iteration(loop_code([ins("DEPBAR.LE SB0, 0x0"), *piped[1:]], before=first), machine)
    assert serial == pytest.approx(100 * 4 + machine.dram_cycles, rel=0.05)


def test_shared_memory_wavefronts_share_the_data_path():
    machine = perfmodel.Machine.of(A100, 1.0)
    assert perfmodel.wavefronts(ins("LDS.128 R4, [R2]")) == 4
    assert perfmodel.wavefronts(ins("LDSM.16.MT88.4 R4, [R2]")) == 4
    assert perfmodel.wavefronts(ins("LDS.U16 R4, [R2]")) == 1
    assert perfmodel.wavefronts(ins("FFMA R0, R0, R1, R2")) == 0
    # 50 independent 128-bit stores per warp: 4 wavefronts each at the scheduler's quarter of 128 B per clock
    body = [ins("STS.128 [R2], R4") for _ in range(50)]
    assert per_iteration(loop_code(body), machine) == pytest.approx(50 * 4 * 4, rel=0.05)


def test_a_barrier_holds_a_warp_until_its_program_arrives():
    machine = perfmodel.Machine.of(A100, 1.0)
    body = [ins("FFMA R0, R0, R1, R2", stall=10), ins("BAR.SYNC.DEFER_BLOCKING 0x0")]
    with_barrier = perfmodel.simulate(loop_code(body), {0: 6}, machine, 1, 8).per_iteration[0]
    assert with_barrier >= 10 + perfmodel.BARRIER_CYCLES


def test_the_decode_split_rule_and_trips_follow_the_kernel():
    # the package's rule: twice the SMs over batch x KV heads, at most a split per 4 tiles
    assert perfmodel.default_splits(H100, 8, 32768, 64) == 33
    assert perfmodel.default_splits(H100, 512, 32768, 64) == 1
    assert perfmodel.default_splits(H100, 8, 300, 64) == 2
    body = [ins("FFMA R0, R0, R1, R2") for _ in range(40)]
    listing = [".L_x_0", *body[:20], ins("@P0 BRA `(.L_x_0)"), ".L_x_1", *body[:20], ins("@P0 BRA `(.L_x_1)")]
    listing += [".L_x_2", *body[:3], ins("@P0 BRA `(.L_x_2)"), ".L_x_3", *body, ins("@P0 BRA `(.L_x_3)"), ins("EXIT")]
    code = perfmodel.Code.of(listing)
    storage = perfmodel.Storage(n_sink=32, residual_length=128, group_size=128, quantized_bytes_per_token=72)
    trips = perfmodel.split_trips(code, storage, 32768, 64, 33)
    # 32,640 quantized tokens in 33 splits of 1,024 (16 tiles, 8 groups); the 32 sinks in split 0
    assert trips[0] == {0: 1, 1: 1, 2: 8, 3: 16}  # the residual's 96 tokens in whole tiles: 64 here, 32 next
    assert trips[1] == {0: 0, 1: 1, 2: 8, 3: 16}
    assert trips[31] == {0: 0, 1: 0, 2: 7, 3: 14} and trips[32] == {0: 0, 1: 0, 2: 0, 3: 0}


def test_a_grid_runs_in_waves_of_its_occupancy():
    assert perfmodel._waves(264, 2, 132) == [(1, 2)]
    assert perfmodel._waves(128, 2, 132) == [(1, 1)]
    assert perfmodel._waves(512, 2, 132) == [(1, 2), (1, 2)]
    assert perfmodel._waves(600, 2, 132) == [(2, 2), (1, 1)]


def test_fp16_is_timed_at_its_stated_rate_and_the_speedup_is_fp16_over_pnmix():
    from pnmix.gpus import FP16_DECODE_RATES, fp16_decode_rate

    for gpu in GPUS:
        for batch, context in ((1, 4096), (1, 32768), (64, 4096), (64, 32768)):
            rate, source = fp16_decode_rate(gpu, batch, context)
            assert 0 < rate < 1 and source
    assert fp16_decode_rate(next(g for g in GPUS if g.name == "H200"), 1, 32768)[0] == pytest.approx(2672 / 4800, 1e-2)
    assert len(FP16_DECODE_RATES) == 3 * len(GPUS)


@pytest.mark.parametrize(
    ("body", "programs", "cause"),
    [
        ([ins("FFMA R0, R0, R1, R2", stall=4) for _ in range(10)], 1, "chain"),
        ([ins("HADD2 R0, R0, R1", stall=4) for _ in range(10)], 8, "issue"),  # fp16 at the issue rate
        ([ins("LDG.E.128 R4, desc[UR4][R2.64]", write=0), ins("FFMA R0, R4, R4, R0", wait=0b1)], 1, "dram"),
        ([ins("LDS.128 R4, [R2]", write=2), ins("FFMA R0, R4, R4, R0", wait=0b100)], 1, "shared"),
        ([ins("STS.128 [R2], R4") for _ in range(50)], 1, "data path"),
        ([ins("MUFU.EX2 R0, R1") for _ in range(20)], 1, "pipe"),
    ],
)
def test_what_holds_the_warps_is_named(body, programs, cause):
    sim = perfmodel.simulate(loop_code(body), {0: 6}, perfmodel.Machine.of(H100, 1.0), programs, 4)
    held = sim.causes[0]
    assert max(held, key=held.get) == cause, held
    assert set(held) == set(perfmodel.CAUSES)


def test_a_shared_simulation_cache_never_lends_one_codes_simulation_to_another():
    """`program_cycles` keys its cache by the code's id: an entry whose code is not the one asked about (freed, its id
    taken by another) is simulated again, not reused."""
    machine = perfmodel.Machine.of(H100, 1.0)
    short = loop_code([ins("FFMA R0, R0, R1, R2", stall=4) for _ in range(2)])
    long = loop_code([ins("FFMA R0, R0, R1, R2", stall=4) for _ in range(20)])
    alone = perfmodel.program_cycles(long, {0: 6}, {}, machine, 1, 4)["cycles"]
    cache: dict = {}
    perfmodel.program_cycles(short, {0: 6}, {}, machine, 1, 4, cache)
    # the id collision a freed code would leave: `long` now has the key `short`'s entry was made under
    (key,) = cache
    cache[(id(long), *key[1:])] = cache.pop(key)
    assert perfmodel.program_cycles(long, {0: 6}, {}, machine, 1, 4, cache)["cycles"] == alone
    assert perfmodel.program_cycles(long, {0: 6}, {}, machine, 1, 4, cache)["cycles"] == alone  # and from the cache


def test_a_kernel_that_merges_its_splits_gives_every_program_the_merge_loop_after_its_main_loop():
    """The fragment-order loop's form that merges its splits itself: loops before the main one are the exact
    regions' (on the exact program alone), the loop after it the merge, ceil(programs / merge_chunk) trips for every
    program (the one that merges is the one the step waits for)."""

    def loop(label: int, n: int) -> list:  # sinks 0, residual 1, main 2, merge 3
        return [f".L_x_{label}", *(ins("FFMA R0, R0, R1, R2") for _ in range(n)), ins(f"@P0 BRA `(.L_x_{label})")]

    code = perfmodel.Code.of([*loop(0, 2), *loop(1, 2), *loop(2, 9), *loop(3, 3), ins("EXIT")])
    storage = perfmodel.Storage(n_sink=32, residual_length=128, group_size=128, quantized_bytes_per_token=72.0)
    plan = perfmodel.split_plan(8, 8, 264)  # batch 1: a program of its own for the exact regions
    trips = perfmodel.split_trips_exact_last(code, storage, 4096, 128, plan, 64, merge_chunk=4)
    assert len(trips) == plan[2] == 9
    assert all(t[3] == 3 for t in trips)  # 9 programs, 4 a trip
    assert [t[0] for t in trips] == [0] * 8 + [1] and [t[1] for t in trips] == [0] * 8 + [2]
    assert sum(t[2] for t in trips) == 31  # the 31 key groups of 3,968 quantized tokens
    with pytest.raises(ValueError, match="give merge_chunk"):
        perfmodel.split_trips_exact_last(code, storage, 4096, 128, plan, 64)
