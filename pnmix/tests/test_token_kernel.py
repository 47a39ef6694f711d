"""The per-token precision decode kernel against the spec's attention over the same stores, across a
grid (FlashInfer style), judged against the error of the spec's computation in the same low precision."""

import pytest
import torch

from pnmix.token_cache import TritonTokenPrecisionCache
from reference import attention_ref
from reference.contract.tolerances import attention_bound
from reference.tokens.cache import TokenPrecisionCache
from reference.tokens.config import TokenPrecisionConfig, token_classes

pytestmark = pytest.mark.interpreter


def caches(config, batch, kv, n_rep, length, d, dtype, low_share, seed, appends=()):
    gen = torch.Generator().manual_seed(seed)
    total = length + sum(appends)
    q = torch.randn(batch, kv * n_rep, length, d, generator=gen).to(dtype)
    k, v = (torch.randn(batch, kv, total, d, generator=gen).to(dtype) for _ in range(2))
    bits = torch.where(torch.rand(total, generator=gen) < low_share, config.low_bits, config.high_bits)
    out = []
    for cls in (TritonTokenPrecisionCache, TokenPrecisionCache):
        cache = cls(config)
        cache.prefill(q, k[..., :length, :], v[..., :length, :], bits[:length])
        at = length
        for n in appends:
            cache.append(k[..., at : at + n, :], v[..., at : at + n, :], bits[at : at + n])
            at += n
        out.append(cache)
    return out, bits


@pytest.mark.parametrize("low_keys", ["channels", "pairs"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("d", "group"), [(16, 8), (32, 16), (32, 32)])
@pytest.mark.parametrize("low_share", [0.0, 0.7, 1.0])
def test_decode_equals_the_spec_over_the_same_stores(low_keys, dtype, d, group, low_share):
    config = TokenPrecisionConfig(group_size=group, low_keys=low_keys, pair_layout="adjacent" if d == 32 else "split")
    (kernel, spec), bits = caches(config, 2, 2, 3, 45, d, dtype, low_share, seed=d + group, appends=(1, 20))
    assert torch.equal(kernel.token_bits(), spec.token_bits())
    n_queries = 1 if dtype == torch.float16 else 3  # one decode step, or causal among several new tokens
    q = torch.randn(2, 6, n_queries, d, generator=torch.Generator().manual_seed(3)).to(dtype)
    out = kernel.attend(q, scale=0.3)
    assert out.shape == q.shape and out.dtype == dtype
    err, bound, ref_err = _judge(out, q, spec, 0.3)
    assert err <= bound, f"error {err:.3g} above {bound:.3g} (the spec's computation in {dtype}: {ref_err:.3g})"
    classes = token_classes(config, bits)
    if low_share == 0.7:  # every kind of store held something
        assert min(classes) > 0, classes


def _judge(out, q, spec, scale):
    """(error against float64 attention over the spec's stores, its bound, the spec computation's own
    error in q's dtype): property 7's rule."""
    k, v = spec.dequantize()
    oracle = attention_ref(q.double(), k.double(), v.double(), causal=True, upcast=False, scale=scale)
    low = attention_ref(q, k.to(q.dtype), v.to(q.dtype), causal=True, upcast=True, scale=scale)
    err = (out.double() - oracle).abs().max().item()
    return err, attention_bound(oracle, low, q.dtype), (low.double() - oracle).abs().max().item()


def test_decode_refuses_softcap_and_float32_by_name():
    config = TokenPrecisionConfig(group_size=8)
    (kernel, _), _ = caches(config, 1, 1, 2, 20, 16, torch.float16, 0.5, seed=1)
    q = torch.randn(1, 2, 1, 16).half()
    with pytest.raises(ValueError, match="softcap"):
        kernel.attend(q, softcap=30.0)
    with pytest.raises(TypeError, match="dtype"):
        kernel.attend(q.float())
