"""Bad input: a clear error naming the argument, and a rejected call changes nothing."""

import copy

import pytest
import torch

from reference import PNMixConfig, ReferenceCache


def t(*shape, dtype=torch.float16, fill=None, device="cpu"):
    x = torch.randn(*shape).to(dtype) if fill is None else torch.full(shape, fill, dtype=dtype)
    return x.to(device)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"ratio": 1.5}, ValueError, "ratio must be in"),
        ({"ratio": -0.1}, ValueError, "ratio must be in"),
        ({"ratio": float("nan")}, ValueError, "ratio must be in"),
        ({"ratio": "0.5"}, TypeError, "ratio must be a float"),
        ({"b_high": 9}, ValueError, "b_high must be one of"),
        ({"b_low": 0}, ValueError, "b_low must be one of"),
        ({"b_high": 2, "b_low": 3}, ValueError, "b_high must be >= b_low"),
        ({"b_high": True}, TypeError, "b_high must be an int"),
        ({"value_bits": 9}, ValueError, "value_bits must be one of"),
        ({"group_size": 12}, ValueError, "group_size must be a positive multiple of 8"),
        ({"group_size": 0}, ValueError, "group_size must be a positive multiple of 8"),
        ({"residual_length": 100}, ValueError, "residual_length must be a positive multiple of group_size"),
        ({"n_sink": -1}, ValueError, "n_sink must be >= 0"),
        ({"value_group_size": 0}, ValueError, "value_group_size must be positive"),
        ({"value_group_size": 3}, ValueError, r"value_group_size \(3\) must be a multiple of 4 for 2-bit values"),
        ({"value_bits": 3, "value_group_size": 4}, ValueError, r"multiple of 8 for 3-bit values"),
        ({"pair_layout": "interleaved"}, ValueError, "pair_layout must be one of"),
        ({"scale_dtype": torch.float64}, TypeError, "scale_dtype must be one of"),
    ],
)
def test_config_rejects(kwargs, error, match):
    with pytest.raises(error, match=match):
        PNMixConfig(**kwargs)


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        PNMixConfig().ratio = 0.1


GOOD = {"q": (1, 4, 40, 16), "k": (1, 2, 40, 16), "v": (1, 2, 40, 16)}


@pytest.mark.parametrize(
    ("q", "k", "v", "error", "match"),
    [
        (t(1, 4, 40, 15), t(1, 2, 40, 15), t(1, 2, 40, 15), ValueError, "head_dim must be even"),
        (t(1, 4, 40, 16), t(1, 2, 40, 16), t(1, 2, 41, 16), ValueError, "k and v must have the same shape"),
        (t(2, 4, 40, 16), t(1, 2, 40, 16), t(1, 2, 40, 16), ValueError, "q batch"),
        (t(1, 3, 40, 16), t(1, 2, 40, 16), t(1, 2, 40, 16), ValueError, "multiple of the KV heads"),
        (t(1, 4, 39, 16), t(1, 2, 40, 16), t(1, 2, 40, 16), ValueError, "same prefill tokens"),
        (t(1, 4, 40, 8), t(1, 2, 40, 16), t(1, 2, 40, 16), ValueError, "q head_dim"),
        (t(4, 40, 16), t(1, 2, 40, 16), t(1, 2, 40, 16), ValueError, "q must have 4 dims"),
        (t(1, 4, 40, 16, dtype=torch.float64), t(1, 2, 40, 16), t(1, 2, 40, 16), TypeError, "q must be float16"),
        (t(1, 4, 40, 16), t(1, 2, 40, 16, dtype=torch.int32), t(1, 2, 40, 16), TypeError, "k must be float16"),
        (t(1, 4, 40, 16), t(1, 2, 40, 16, dtype=torch.float32), t(1, 2, 40, 16), ValueError, "share one dtype"),
        (t(1, 4, 40, 16), t(1, 2, 40, 16), t(1, 2, 40, 16, device="meta"), ValueError, "share one device"),
        (t(1, 4, 40, 16, fill=float("nan")), t(1, 2, 40, 16), t(1, 2, 40, 16), ValueError, "q contains NaN or Inf"),
        (t(1, 4, 40, 16), t(1, 2, 40, 16, fill=float("inf")), t(1, 2, 40, 16), ValueError, "k contains NaN or Inf"),
        (t(1, 4, 40, 16), t(1, 2, 40, 16), t(1, 2, 40, 16, fill=float("-inf")), ValueError, "v contains NaN or Inf"),
        (t(1, 4, 0, 16), t(1, 2, 0, 16), t(1, 2, 0, 16), ValueError, "at least one token"),
        ([[1.0]], t(1, 2, 40, 16), t(1, 2, 40, 16), TypeError, "q must be a torch.Tensor"),
    ],
)
def test_prefill_rejects(q, k, v, error, match):
    with pytest.raises(error, match=match):
        ReferenceCache.from_prefill(q, k, v)


def test_values_beyond_the_scale_dtype_are_rejected():
    big = t(1, 2, 40, 16, dtype=torch.bfloat16, fill=1e6)
    with pytest.raises(ValueError, match="k has magnitude"):
        ReferenceCache.from_prefill(t(1, 4, 40, 16, dtype=torch.bfloat16), big, t(1, 2, 40, 16, dtype=torch.bfloat16))
    cache = ReferenceCache.from_prefill(
        t(1, 4, 40, 16, dtype=torch.bfloat16), big, big, PNMixConfig(scale_dtype=torch.float32)
    )
    assert cache.length == 40
    # Whatever the scale dtype, the range max - min is computed in float32: |x| up to 1.7e38.
    huge = t(1, 2, 40, 16, dtype=torch.bfloat16, fill=3e38)
    with pytest.raises(ValueError, match=r"k has magnitude 3.004e\+38, above 1.701e\+38, the most a 1-bit group"):
        ReferenceCache.from_prefill(big, huge, big, PNMixConfig(scale_dtype=torch.float32))


@pytest.mark.filterwarnings("error")
def test_tensors_that_require_grad_are_checked_without_a_warning():
    # the magnitude check reads a maximum back: from the tensor's data, not through autograd
    def grad(n):
        return torch.randn(1, 2, n, 16, requires_grad=True)

    config = PNMixConfig(group_size=8, residual_length=8, n_sink=2)
    cache = ReferenceCache.from_prefill(grad(40), grad(40), grad(40), config)
    cache.append(grad(1), grad(1))
    assert torch.isfinite(cache.attend(grad(1))).all()


def test_value_group_must_divide_head_dim():
    with pytest.raises(ValueError, match="value_group_size"):
        ReferenceCache.from_prefill(t(1, 4, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16), PNMixConfig(value_group_size=12))


def snapshot(cache):
    return copy.deepcopy({k: v for k, v in vars(cache).items()})


def same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            same(x, y)
        elif isinstance(x, torch.Tensor):
            assert torch.equal(x, y), key
        else:
            assert x == y, key


@pytest.mark.parametrize(
    ("k", "v", "error", "match"),
    [
        (t(1, 2, 3, 16), t(1, 2, 3, 16, fill=float("nan")), ValueError, "v contains NaN or Inf"),
        (t(1, 2, 3, 16, fill=float("inf")), t(1, 2, 3, 16), ValueError, "k contains NaN or Inf"),
        (t(1, 3, 3, 16), t(1, 3, 3, 16), ValueError, "kv_heads=2"),
        (t(2, 2, 3, 16), t(2, 2, 3, 16), ValueError, "batch=1"),
        (t(1, 2, 3, 8), t(1, 2, 3, 8), ValueError, "head_dim=16"),
        (t(1, 2, 3, 16, dtype=torch.bfloat16), t(1, 2, 3, 16, dtype=torch.bfloat16), TypeError, "cache's dtype"),
        (t(1, 2, 3, 16, device="meta"), t(1, 2, 3, 16, device="meta"), ValueError, "cache's device"),
        (t(1, 2, 3, 16), t(1, 2, 4, 16), ValueError, "same shape"),
        (t(1, 2, 0, 16), t(1, 2, 0, 16), ValueError, "at least one token"),
        (t(1, 2, 3, 16, fill=70000.0, dtype=torch.float32), None, TypeError, "cache's dtype"),
    ],
)
def test_rejected_append_leaves_the_cache_unchanged(k, v, error, match):
    cache = ReferenceCache.from_prefill(t(1, 4, 190, 16), t(1, 2, 190, 16), t(1, 2, 190, 16))
    before = snapshot(cache)
    with pytest.raises(error, match=match):
        cache.append(k, k if v is None else v)
    same(before, snapshot(cache))


def test_attend_rejects_and_changes_nothing():
    cache = ReferenceCache.from_prefill(t(1, 4, 10, 16), t(1, 2, 10, 16), t(1, 2, 10, 16))
    before = snapshot(cache)
    with pytest.raises(ValueError, match="cache holds only 10"):
        cache.attend(t(1, 4, 11, 16))
    with pytest.raises(TypeError, match="cache's dtype"):
        cache.attend(t(1, 4, 1, 16, dtype=torch.float32))
    with pytest.raises(ValueError, match="q contains NaN"):
        cache.attend(t(1, 4, 1, 16, fill=float("nan")))
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        cache.attend(t(1, 3, 1, 16))
    with pytest.raises(ValueError, match="softcap must be a positive finite number or None, got 0"):
        cache.attend(t(1, 4, 1, 16), softcap=0)
    with pytest.raises(ValueError, match="scale must be a positive finite number or None, got nan"):
        cache.attend(t(1, 4, 1, 16), scale=float("nan"))
    same(before, snapshot(cache))


def test_lifecycle_errors():
    with pytest.raises(RuntimeError, match="call prefill"):
        ReferenceCache().append(t(1, 2, 1, 16), t(1, 2, 1, 16))
    cache = ReferenceCache.from_prefill(t(1, 4, 10, 16), t(1, 2, 10, 16), t(1, 2, 10, 16))
    with pytest.raises(RuntimeError, match="already called"):
        cache.prefill(t(1, 4, 10, 16), t(1, 2, 10, 16), t(1, 2, 10, 16))
    with pytest.raises(TypeError, match="config must be a PNMixConfig"):
        ReferenceCache({"ratio": 0.5})


def test_prompt_shorter_than_the_sinks_is_valid():
    cache = ReferenceCache.from_prefill(t(1, 4, 5, 16), t(1, 2, 5, 16), t(1, 2, 5, 16))
    assert tuple(cache.layout) == (5, 0, 0, 0, 0)
    cache.append(t(1, 2, 40, 16), t(1, 2, 40, 16))
    assert tuple(cache.layout) == (32, 0, 13, 0, 13)
