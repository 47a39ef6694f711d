"""Storage accounting: the paper's worked example, hand-computed bytes, layout rule."""

import dataclasses

import pytest
import torch

from reference import PNMixConfig, allocation, bit_widths, measure, storage_model, token_layout


def test_paper_worked_example_2263_bits():
    bw = bit_widths(PNMixConfig(), head_dim=128)
    assert bw.key_effective == pytest.approx((32768 * 2.25 + 32 * 16) / 32800, rel=1e-12)
    assert round(bw.key_effective, 3) == 2.263
    # The pair mask: 64 pairs -> 8 bytes per KV head, metadata on top of the effective cost.
    assert bw.key_metadata == pytest.approx(64 / (32800 * 128), rel=1e-12)
    assert bw.key_total == pytest.approx(bw.key_effective + bw.key_metadata)


def test_value_bits_of_the_main_config_and_unquantized_values():
    assert bit_widths(PNMixConfig(), 128).value_effective == pytest.approx((32768 * 2.25 + 32 * 16) / 32800)
    assert bit_widths(PNMixConfig(value_bits=16), 128).value_effective == pytest.approx(16.0)


def test_a_b_bit_field_costs_b_bits():
    # H4(50%)L1: a 1-bit low plane and 3 high bits (a 2-bit and a 1-bit plane) for half the channels:
    # 1 + 0.5 * 3 = 2.5 payload bits, plus FP16 scale and zero per 128 tokens, below H4(50%)L2.
    bw = bit_widths(PNMixConfig(b_high=4, b_low=1, n_sink=0), 128)
    assert bw.key_effective == pytest.approx(2.5 + 0.25)
    assert bit_widths(PNMixConfig(b_high=4, b_low=2, n_sink=0), 128).key_effective == pytest.approx(3.0 + 0.25)
    assert bit_widths(PNMixConfig(value_bits=3, n_sink=0), 128).value_effective == pytest.approx(3.0 + 0.25)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, (0, 0, 0)), (1, (1, 0, 0)), (32, (32, 0, 0)), (33, (32, 0, 1)), (160, (32, 128, 0)), (300, (32, 256, 12))],
)
def test_token_layout_default(length, expected):
    assert tuple(token_layout(PNMixConfig(), length)) == (*expected, *expected[1:])  # values share the residual


def test_token_layout_residual_of_several_groups():
    cfg = PNMixConfig(group_size=16, residual_length=64, n_sink=4)
    assert tuple(token_layout(cfg, 4 + 63)) == (4, 0, 63, 0, 63)
    assert tuple(token_layout(cfg, 4 + 64)) == (4, 64, 0, 64, 0)
    assert tuple(token_layout(cfg, 4 + 200)) == (4, 192, 8, 192, 8)


def test_sliding_values_keep_the_newest_n_exact():
    cfg = PNMixConfig(group_size=16, residual_length=64, n_sink=4, value_residual="sliding")
    assert tuple(token_layout(cfg, 4 + 63)) == (4, 0, 63, 0, 63)
    assert tuple(token_layout(cfg, 4 + 64)) == (4, 64, 0, 0, 64)
    assert tuple(token_layout(cfg, 4 + 65)) == (4, 64, 1, 1, 64)
    assert tuple(token_layout(cfg, 4 + 200)) == (4, 192, 8, 136, 64)
    # Values are counted over the quantized ones: the window of 64 exact values is excluded.
    report = storage_model(cfg, 1, 1, 16, 4 + 200)
    assert report.residual_value == 64 * 16 * 2 and report.value_scale == 136 * 2
    assert tuple(allocation(cfg, 10, 4 + 200)) == (4, 192, 64, 136, 64)


def test_storage_model_hand_computed():
    # B=2, H_kv=3, d=16, 300 tokens, G=N=128, fp16: 32 sinks, 256 quantized, 12 residual.
    r = storage_model(PNMixConfig(), 2, 3, 16, 300)
    n = 2 * 3
    assert r.key_low == n * 256 * 16 // 8
    assert r.key_high == n * (256 * 2 // 8) * 8  # 4 salient pairs -> 8 channels, 2-bit fields
    assert r.key_scale == r.key_zero == n * 2 * 16 * 2
    assert r.sink_key == r.sink_value == n * 32 * 16 * 2
    assert r.residual_key == r.residual_value == n * 12 * 16 * 2
    assert r.mask == n * 1
    assert r.value_payload == n * 256 * 16 * 2 // 8
    assert r.value_scale == r.value_zero == n * 256 * 1 * 2
    assert r.total == sum(r.as_dict().values())


def test_storage_model_follows_dtypes():
    base = storage_model(PNMixConfig(), 1, 1, 16, 300)
    f32 = storage_model(PNMixConfig(scale_dtype=torch.float32), 1, 1, 16, 300, dtype=torch.float32)
    assert f32.key_scale == 2 * base.key_scale and f32.sink_key == 2 * base.sink_key
    unq = storage_model(PNMixConfig(value_bits=16), 1, 1, 16, 300)
    assert unq.value_payload == 256 * 16 * 2 and unq.value_scale == 0


def test_measure_sums_bytes_by_component():
    r = measure({"mask": torch.zeros(3, dtype=torch.uint8), "sink_key": [torch.zeros(2, dtype=torch.float16)] * 2})
    assert r.mask == 3 and r.sink_key == 8 and r.total == 11
    with pytest.raises(ValueError, match="unknown storage components"):
        measure({"keys": torch.zeros(1)})


def test_bit_widths_needs_an_empty_residual():
    with pytest.raises(ValueError, match="n_quantized"):
        bit_widths(PNMixConfig(), 128, n_quantized=1000)


@pytest.mark.parametrize("head_dim", [4, 20, 24, 64])
def test_measured_equals_model_for_awkward_head_dims(head_dim):
    from reference import ReferenceCache

    cfg = PNMixConfig(group_size=8, residual_length=16, n_sink=3, ratio=0.3)
    gen = torch.Generator().manual_seed(head_dim)
    q = torch.randn(1, 2, 30, head_dim, generator=gen).half()
    k, v = torch.randn(2, 1, 2, 30, head_dim, generator=gen).half()
    cache = ReferenceCache.from_prefill(q, k, v, cfg)
    model = storage_model(cfg, 1, 2, head_dim, 30)
    assert cache.storage() == model
    assert model.mask == 2 * -(-head_dim // 16)  # one bit per pair, rounded up to whole bytes


def test_static_allocation_counts_capacity():
    cfg = PNMixConfig()
    # 8192 + 141 capacity: 32 sinks, 8192 quantized tokens (64 pages), one 128-token residual page.
    assert tuple(allocation(cfg, 10, 8333)) == (32, 8192, 128, 8192, 128)
    assert tuple(allocation(cfg, 10, 20)) == (20, 0, 0, 0, 0)
    assert tuple(allocation(cfg, 10, 100)) == (32, 0, 68, 0, 68)
    static = storage_model(cfg, 1, 1, 128, 10, capacity=8333)
    full = storage_model(cfg, 1, 1, 128, 32 + 8192)  # the same sinks and quantized region, no residual
    page = 128 * 128 * 2  # one residual page of fp16 keys (or values)
    assert static == dataclasses.replace(full, residual_key=page, residual_value=page)
    with pytest.raises(ValueError, match="capacity must be an int >= length"):
        storage_model(cfg, 1, 1, 128, 500, capacity=400)


def test_method_bit_widths_hand_computed():
    from reference.methods import fp16, kitty, kivi

    # KIVI-2, G = 128, no sinks: 2 payload bits + 32 / 128 scale/zero bits; no selection metadata.
    # Its values are counted over the quantized ones (the sliding window of 128 is excluded).
    assert bit_widths(kivi(2), 128) == (2.25, 0.0, 2.25)
    # Kitty: 2-bit low plane + (d/4 channels) x 2-bit high plane + 0.25 scale/zero, 32 fp16 sinks;
    # its per-page index is d bytes per 128-token page: 8 * 128 / (128 * 128) bits over the T_q tokens.
    bw = bit_widths(kitty(), 128)
    assert bw.key_effective == pytest.approx((32768 * (2 + 0.5 + 0.25) + 32 * 16) / 32800)
    assert bw.key_metadata == pytest.approx(256 * 128 * 8 / (32800 * 128))
    assert bit_widths(fp16(), 128) == (16.0, 0.0, 16.0)
