"""The PTX unpack's switch (`pnmix.kernels.ptx_unpack`): asked for, never on under the interpreter, on a device only
after its self-test passed there, off with one warning naming the device and what differed; the TTGIR check of which
four elements each inline-asm call gets (`pnmix.kernels.ttgir`); the self-test's probe pattern and its plain unpack.
The CUDA part (the probe's PTX run, the decode kernel with the switch on) runs only on a GPU."""

from __future__ import annotations

import contextlib
import warnings
from types import SimpleNamespace

import pytest
import torch

import reference as R
from pnmix import PNMixCache, _runtime
from pnmix.kernels import attention, ptx, ptx_unpack, ttgir, unpack
from reference.channels.layout import CacheLayout

DEVICE = "NVIDIA H200 (cuda:0)"
KERNELS = pytest.mark.interpreter if _runtime.INTERPRETED else pytest.mark.gpu


@pytest.fixture(autouse=True)
def no_decisions_yet(monkeypatch):
    monkeypatch.setattr(ptx_unpack, "_decisions", {})
    monkeypatch.setattr(ptx_unpack, "_kernels", {})
    monkeypatch.delenv(ptx_unpack.ENV, raising=False)


def probe_results(wrong: dict | None = None, plain_wrong: dict | None = None) -> dict:
    """The codes a self-test returns, (PTX, plain) per (dtype, width): right, but for {(dtype, width): (row, col,
    value)} put in."""
    out = {}
    for key in unpack.PROBED:
        codes = [unpack.expected_codes(key[1], key[0]), unpack.expected_codes(key[1], key[0])]
        for which, changes in enumerate((wrong, plain_wrong)):
            if changes and key in changes:
                row, col, value = changes[key]
                codes[which][row, col] = value
        out[key] = tuple(codes)
    return out


# -- the decision ------------------------------------------------------------------------------


def test_codes_equal_to_the_hosts_turn_the_path_on_once_per_device_without_a_warning():
    calls = []

    def probe():
        calls.append(1)
        return probe_results()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ptx_unpack.decide(DEVICE, probe) and ptx_unpack.decide(DEVICE, probe)
    assert calls == [1]


def test_one_wrong_code_turns_the_path_off_with_one_warning_naming_the_device_and_the_code():
    dp = unpack.PROBE_COLUMNS // 4  # 2-bit codes: four fields per byte, dp columns each
    col = dp + 1  # the second field (shift 2) of the row's second byte
    byte = int(unpack.probe_bytes(2)[0, 1])
    right = float((byte >> 2) & 3)
    with pytest.warns(RuntimeWarning) as caught:
        assert not ptx_unpack.decide(DEVICE, lambda: probe_results({("bfloat16", 2): (0, col, (right + 1) % 4)}))
        assert not ptx_unpack.decide(DEVICE, probe_results)  # kept: a right probe later changes nothing
    assert len(caught) == 1
    message = str(caught[0].message)
    assert DEVICE in message and "PTX unpack is off" in message and "decoding unpacks plainly" in message
    assert f"1 of {16 * 128} 2-bit bfloat16 codes by the PTX unpack" in message
    assert f"byte {byte:#04x} at shift 2, {(right + 1) % 4} instead of {right}" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ptx_unpack.decide("NVIDIA A100-SXM4-40GB (cuda:1)", probe_results)  # each device decides for itself


@pytest.mark.parametrize(
    ("probe", "said"),
    [
        (lambda: probe_results(plain_wrong={("float16", 8): (3, 5, 0.5)}), "8-bit float16 codes by the plain unpack"),
        (lambda: {k: c for k, c in probe_results().items() if k[1] != 4}, "[('bfloat16', 4), ('float16', 4)]"),
        (lambda: {b: (p.float(), q) for b, (p, q) in probe_results().items()}, "came back torch.float32"),
        (lambda: (_ for _ in ()).throw(RuntimeError("ptxas fatal: unknown\nmore")), "did not run (RuntimeError"),
    ],
)
def test_any_failure_of_the_self_test_keeps_the_plain_path_with_one_warning(probe, said):
    with pytest.warns(RuntimeWarning) as caught:
        assert not ptx_unpack.decide(DEVICE, probe)
        assert not ptx_unpack.decide(DEVICE, probe)
    assert len(caught) == 1 and said in str(caught[0].message) and DEVICE in str(caught[0].message)


def test_the_switch_is_asked_for_by_the_environment_or_by_request():
    assert ptx_unpack.requested()  # on by default (where a device's self-test passes: `active`)
    for value, on in (("1", True), ("on", True), ("0", False), ("", True), ("off", False)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(ptx_unpack.ENV, value)
            assert ptx_unpack.requested() is on
            with ptx_unpack.request(not on):
                assert ptx_unpack.requested() is (not on)
            with ptx_unpack.request(None):
                assert ptx_unpack.requested() is on
            assert ptx_unpack.requested() is on
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ptx_unpack.ENV, "maybe")
        with pytest.raises(ValueError, match="PNMIX_PTX_UNPACK='maybe'"):
            ptx_unpack.requested()


@pytest.mark.skipif(not _runtime.INTERPRETED, reason="the interpreter's refusal")
def test_never_on_under_the_interpreter_even_when_asked_for():
    with ptx_unpack.request(True):
        assert not ptx_unpack.active()
        state = ptx_unpack.state()
    assert state == {"requested": True, "device": None, "on": False, "why": "the Triton interpreter runs no inline PTX"}
    assert ptx_unpack._decisions == {}


def test_while_recording_the_request_alone_decides(monkeypatch):
    monkeypatch.setattr(ptx_unpack._runtime, "recording_launches", lambda: True)
    with ptx_unpack.request(True):
        assert ptx_unpack.active()
    with ptx_unpack.request(False):
        assert not ptx_unpack.active()


@pytest.mark.parametrize(
    ("config", "d", "dtype", "on"),
    [
        ({}, 128, torch.float16, True),
        ({}, 128, torch.bfloat16, True),
        ({"value_bits": 8}, 128, torch.bfloat16, False),  # bfloat16 holds codes below 128 under its exponent
        ({"value_bits": 8}, 128, torch.float16, True),
        ({}, 128, torch.float32, False),
        ({"value_group_size": 32}, 128, torch.float16, False),  # per-element values, no field-major columns
        ({"value_bits": 4}, 64, torch.float16, True),  # 32 columns per field
        ({"value_bits": 1}, 16, torch.float16, False),  # 2 columns per field: fours would mix shifts
        ({"value_bits": 3}, 128, torch.float16, False),  # two planes: no field-major path
    ],
)
def test_only_field_major_values_the_dtype_holds_in_runs_of_four_columns_take_the_ptx_path(
    monkeypatch, config, d, dtype, on
):
    layout = CacheLayout(R.PNMixConfig(**config), 1, 1, d, dtype, None)
    monkeypatch.setattr(ptx_unpack, "active", lambda: True)
    assert attention.value_ptx(layout, dtype) is on
    monkeypatch.setattr(ptx_unpack, "active", lambda: False)
    assert attention.value_ptx(layout, dtype) is False


# -- the compiled grouping (TTGIR) ----------------------------------------------------------------

BLOCKED = "#ttg.blocked<{{sizePerThread = {size}, threadsPerWarp = [8, 4], warpsPerCTA = [4, 1], order = {order}}}>"
ASM = (
    '    %12 = tt.elementwise_inline_asm "{{\\0Ashr.b32 w, $2, $3;\\0A}}" {{constraints = "=r,=r,r,r,r,r,r", '
    "packed_element = {pack} : i32, pure = true}} %10, %11 : tensor<64x128x{elem}, #lay>, tensor<64x128xi32, #lay> "
    "-> tensor<64x128xf16, #lay> loc(#loc7)"
)


def module(layout: str, pack: int = 4, elem: str = "i8") -> str:
    return f"#lay = {layout}\nmodule {{\n{ASM.format(pack=pack, elem=elem)}\n}}\n"


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        (BLOCKED.format(size=[1, 16], order=[1, 0]), None),  # 4 adjacent columns from a multiple of 4
        (BLOCKED.format(size=[1, 4], order=[1, 0]), None),
        (BLOCKED.format(size=[4, 1], order=[0, 1]), None),  # 4 rows of one column
        (BLOCKED.format(size=[8, 2], order=[0, 1]), None),
        (BLOCKED.format(size=[1, 2], order=[1, 0]), "fewer than 4 elements"),
        (BLOCKED.format(size=[2, 2], order=[1, 0]), "offsets 0, (0, 1), (1, 0)"),
        (BLOCKED.format(size=[2, 4], order=[0, 1]), "offsets 0, (1, 0), (0, 1)"),
        ("#ttg.linear<{register = [[0, 1], [0, 2], [0, 4]], lane = [[0, 8], [1, 0]], warp = [], block = []}>", None),
        ("#ttg.linear<{register = [[0, 1], [0, 2]], lane = [[0, 2], [1, 0]], warp = [], block = []}>", "multiple of 4"),
        ("#ttg.linear<{register = [[0, 1], [0, 64]], lane = [[0, 2]], warp = [], block = []}>", "offsets 0"),
        ("#ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 2}>", "neither blocked nor linear"),
    ],
)
def test_the_ttgir_check_accepts_only_fours_of_one_shift(layout, problem):
    found = ttgir.grouping_problems(module(layout))
    assert (found == []) if problem is None else (len(found) == 1 and problem in found[0]), found
    (op,) = ttgir.inline_asm_ops(module(layout))
    assert op.pack == 4 and op.operands[0] == ((64, 128), "i8", "#lay") and op.results[0][1] == "f16"


def test_the_ttgir_check_refuses_another_pack_or_operand():
    good = BLOCKED.format(size=[1, 16], order=[1, 0])
    assert "packed_element = 2" in ttgir.grouping_problems(module(good, pack=2))[0]
    assert "not the tile of packed bytes" in ttgir.grouping_problems(module(good, elem="i32"))[0]
    assert ttgir.grouping_problems(module(good).replace("xf16, #lay>", "xf16, #other>"))[0].endswith("one layout")
    assert ttgir.grouping_problems("module {\n}\n") == [] and ttgir.inline_asm_ops("module {\n}\n") == []


@pytest.fixture
def on_a_device(monkeypatch):
    monkeypatch.setattr(ptx_unpack.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ptx_unpack, "device_key", lambda index: DEVICE)


def compiled(layout: str, name: str = "k") -> SimpleNamespace:
    return SimpleNamespace(hash=f"{name}-{layout}", name="_split_kernel", asm={"ttgir": module(layout)})


def test_a_compiled_kernel_that_may_mix_shifts_turns_the_path_off_with_one_warning(on_a_device):
    good, bad = BLOCKED.format(size=[1, 16], order=[1, 0]), BLOCKED.format(size=[1, 2], order=[1, 0])
    assert ptx_unpack.decide(DEVICE, probe_results)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ptx_unpack.kernel_groups_by_shift(compiled(good))
    with pytest.warns(RuntimeWarning) as caught:
        assert not ptx_unpack.kernel_groups_by_shift(compiled(bad))
        assert not ptx_unpack.kernel_groups_by_shift(compiled(bad, "another"))
    assert len(caught) == 1 and DEVICE in str(caught[0].message) and "_split_kernel" in str(caught[0].message)
    assert not ptx_unpack.decide(DEVICE, probe_results)  # off for the device from now on


@KERNELS
@pytest.mark.parametrize(("layout", "again"), [(BLOCKED.format(size=[1, 16], order=[1, 0]), False), ("#ttg.x<>", True)])
def test_a_decode_launch_whose_kernel_may_mix_shifts_is_computed_again_plainly(monkeypatch, on_a_device, layout, again):
    cfg = R.PNMixConfig(group_size=16, residual_length=16, n_sink=2)
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, h, 40, 16, generator=gen).half().to(_runtime.kernel_device()) for h in (2, 1))
    cache = PNMixCache.from_prefill(q, k, k, cfg)
    launches = []

    def launch(kernel, grid, *args, **constexprs):
        ptx_on = constexprs.get("PTX_UNPACK")
        launches.append((_runtime.Launch(kernel, grid, args, constexprs, 4, 1).name, ptx_on))
        return compiled(layout) if ptx_on else None

    monkeypatch.setattr(attention._runtime, "launch", launch)
    monkeypatch.setattr(attention, "value_ptx", lambda layout, dtype: True)
    with pytest.warns(RuntimeWarning, match="PTX unpack is off") if again else contextlib.nullcontext():
        attention.decode_attention(q[:, :, -1:], cache.region(), cache.cache_layout)
    plain = [("_split_kernel", False)] if again else []
    assert launches == [("_split_kernel", True), *plain, ("_merge_kernel", None)]


# -- the probe ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "bits"), unpack.PROBED)
def test_the_probe_puts_every_byte_under_every_shift_of_every_width(dtype, bits):
    packed = unpack.probe_bytes(bits).to(torch.int64)
    codes = unpack.expected_codes(bits, dtype)
    dp = unpack.PROBE_COLUMNS // (8 // bits)
    assert set(packed.flatten().tolist()) == set(range(256))
    for field in range(8 // bits):
        block = codes[:, field * dp : (field + 1) * dp]
        assert torch.equal(block, ((packed >> (field * bits)) & ((1 << bits) - 1)).to(unpack.TORCH_DTYPES[dtype]))
        assert set(block.flatten().tolist()) == set(map(float, range(1 << bits)))
    assert set(unpack.PROBED) == {(t, w) for t in ("float16", "bfloat16") for w in ptx.DTYPE_WIDTHS[t]}


@KERNELS
@pytest.mark.parametrize(("dtype", "bits"), unpack.PROBED)
def test_the_probe_kernels_plain_unpack_gives_the_hosts_codes(dtype, bits):
    if dtype == "bfloat16" and _runtime.INTERPRETED:
        pytest.skip("the interpreter casts integers to bfloat16 as raw bits (decode runs float32 dots there instead)")
    got = unpack.probe(bits, False, _runtime.kernel_device(), dtype).cpu()
    assert torch.equal(got.view(torch.int16), unpack.expected_codes(bits, dtype).view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(_runtime.INTERPRETED, reason="inline PTX runs on a GPU only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_on_a_gpu_the_self_test_passes_and_decode_is_the_same_both_ways(dtype):
    cfg = R.PNMixConfig()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 700, 128, generator=gen).to(dtype).cuda() for h in (8, 2, 2))
    cache = PNMixCache.from_prefill(q, k, v, cfg)
    outs = {}
    for on in (False, True):
        with ptx_unpack.request(on):
            outs[on] = attention.decode_attention(q[:, :, -1:], cache.region(), cache.cache_layout)
            assert ptx_unpack.state()["on"] is on, ptx_unpack.state()
    assert torch.equal(outs[True].view(torch.int16), outs[False].view(torch.int16))
