"""Deliberately broken PN-Mix implementations, one bug each (selectable with --impl).

Each is the reference with a single defect injected, so a property that misses it is blind
to that defect. conformance/meta/test_mutants.py runs the suite against each one.
"""

from __future__ import annotations

from unittest import mock

import torch

from reference import ReferenceCache, packing, quant, saliency, validation

from ..impls.reference import ReferenceImplementation


def _mutant(name: str, cache_class: type = ReferenceCache, **overrides):
    """An implementation called `name` whose caches are `cache_class`, with overridden methods."""
    attrs = {"name": name, "cache_class": cache_class, **overrides}
    return type(f"Mutant_{name}", (ReferenceImplementation,), attrs)()


class _OneBitAtGroupEnds(ReferenceCache):
    """1-bit groups use Eq. 2 (levels at min and max) instead of the Eq. 7 midpoints."""

    def _flush(self, k, v):
        def ends(xmin, xmax, bits, scale_dtype):
            scale, zero = quant.asymmetric_params(xmin, xmax, bits)
            return scale.to(scale_dtype), zero.to(scale_dtype)

        with mock.patch.object(quant, "group_params", ends):
            super()._flush(k, v)


class _QuantizedSinks(ReferenceCache):
    """Sink tokens pass through 4-bit per-token quantization before they are stored."""

    def _store(self, k, v):
        take = min(self.config.n_sink - self._sink_k.shape[-2], k.shape[-2])
        if take > 0:
            k, v = k.clone(), v.clone()
            for t in (k, v):
                head = t[..., :take, :]
                q = quant.quantize(head, 4, head.shape[-1], -1, torch.float32)
                t[..., :take, :] = quant.dequantize(q, head.shape[-1], -1).to(t.dtype)
        super()._store(k, v)


class _MaskRecomputed(ReferenceCache):
    """Eq. 6 is evaluated again at every append, over the prefill queries and all cached keys."""

    def prefill(self, q, k, v):
        super().prefill(q, k, v)
        self._prefill_q = q

    def append(self, k, v):
        super().append(k, v)
        keys = self.dequantize()[0]
        sigma = saliency.pair_saliency(self._prefill_q.float(), keys, self.config.pair_layout)
        mask = saliency.select_salient_pairs(sigma, self.config.n_salient_pairs(keys.shape[-1]))
        self._mask = packing.pack_mask(mask)
        self.saliency_computations += 1


class _WrongGQA(ReferenceCache):
    """Query head h reads KV head h % H_kv (interleaved) instead of h // n_rep (repeat_kv order)."""

    @staticmethod
    def _swap(q, n_kv, forward=True):
        """Reorder query heads so that repeat_kv order reads them interleaved (or back)."""
        if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[1] % n_kv:
            return q  # leave bad input to the checks
        b, h, t, d = q.shape
        a, c = (h // n_kv, n_kv) if forward else (n_kv, h // n_kv)
        return q.reshape(b, a, c, t, d).transpose(1, 2).reshape(b, h, t, d)

    def prefill(self, q, k, v):
        super().prefill(self._swap(q, k.shape[1] if isinstance(k, torch.Tensor) else 1), k, v)

    def attend(self, q):
        n_kv = self._shape[1]
        return self._swap(super().attend(self._swap(q, n_kv)), n_kv, forward=False)


class _StorageOmitsMask(ReferenceCache):
    """The storage report leaves out the pair mask."""

    def storage(self):
        import dataclasses

        return dataclasses.replace(super().storage(), mask=0)


class _AcceptsNaN(ReferenceCache):
    """Appended keys and values are not checked for NaN or Inf."""

    def append(self, k, v):
        with mock.patch.object(validation, "check_finite", lambda name, t: None):
            super().append(k, v)


class _UnscaledAttention(ReferenceCache):
    """Decode attention forgets the 1/sqrt(d) scaling."""

    def attend(self, q):
        from reference import cache as cache_module

        original = cache_module.attention_ref
        with mock.patch.object(cache_module, "attention_ref", lambda *a, **kw: original(*a, **kw, scale=1.0)):
            return super().attend(q)


def _msb_first(packed: torch.Tensor) -> torch.Tensor:
    """Reverse the bit order of every byte (a self-consistent but foreign packing)."""
    bits = ((packed.unsqueeze(-1).to(torch.int32) >> torch.arange(8, device=packed.device)) & 1).flip(-1)
    return (bits << torch.arange(8, device=packed.device)).sum(-1).to(torch.uint8)


def one_bit_group_ends():
    return _mutant("one_bit_group_ends", _OneBitAtGroupEnds)


def quantized_sinks():
    return _mutant("quantized_sinks", _QuantizedSinks)


def mask_recomputed():
    return _mutant("mask_recomputed", _MaskRecomputed)


def wrong_gqa():
    return _mutant("wrong_gqa", _WrongGQA)


def storage_omits_mask():
    return _mutant("storage_omits_mask", _StorageOmitsMask)


def accepts_nan():
    return _mutant("accepts_nan", _AcceptsNaN)


def unscaled_attention():
    return _mutant("unscaled_attention", _UnscaledAttention)


def msb_first_keys():
    base = ReferenceImplementation()

    def pack_keys(self, codes, channel_mask, config):
        low, high = base.pack_keys(codes, channel_mask, config)
        return _msb_first(low), _msb_first(high)

    def unpack_keys(self, low, high, channel_mask, config):
        return base.unpack_keys(_msb_first(low), _msb_first(high), channel_mask, config)

    return _mutant("msb_first_keys", pack_keys=pack_keys, unpack_keys=unpack_keys)
