"""Deliberately broken PN-Mix implementations, one bug each (selectable with --impl).

Each is the reference with a single defect injected, so a property that misses it is blind
to that defect. conformance/meta/test_mutants.py runs the suite against each one and checks
that the property written for the defect fails with its own assertion, not with a crash.

A mutant changes as little as it can, and through public names where it can: it patches a
spec function (keeping its signature, for the duration of one public call) or post-processes
what a public method returns. Only `mask_recomputed` writes a stored component, because its
defect is a change of stored state.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from unittest import mock

import torch

from reference import ReferenceCache
from reference.channels import cache as cache_module
from reference.channels import validation
from reference.contract.implementation import ReferenceImplementation
from reference.equations import quant
from reference.tokens.cache import TokenPrecisionCache
from reference.tokens.config import TokenPrecisionConfig


def _mutant(name: str, cache_class: type = ReferenceCache, **overrides):
    """An implementation called `name` whose caches are `cache_class`, with overridden methods."""
    attrs = {"name": name, "cache_class": cache_class, **overrides}
    return type(f"Mutant_{name}", (ReferenceImplementation,), attrs)()


def _with_argument(function, name: str, value):
    """`function` with argument `name` forced to `value`, whatever else its callers pass."""
    signature = inspect.signature(function)
    if name not in signature.parameters:
        raise TypeError(f"{function.__qualname__} has no argument {name!r}: this mutant no longer fits it")

    @functools.wraps(function)
    def forced(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments[name] = value
        return function(*bound.args, **bound.kwargs)

    return forced


class _QuantizesDifferently(ReferenceCache):
    """A cache whose prefill and append quantize with `_patch()` in effect."""

    def _patch(self):
        raise NotImplementedError

    def prefill(self, q, k, v):
        with self._patch():
            super().prefill(q, k, v)

    def append(self, k, v):
        with self._patch():
            super().append(k, v)


class _OneBitAtGroupEnds(_QuantizesDifferently):
    """1-bit groups use Eq. 2 (levels at min and max) instead of the Eq. 7 midpoints.

    `quant.group_params` runs with midpoint=False while prefill and append quantize.
    """

    def _patch(self):
        return mock.patch.object(quant, "group_params", _with_argument(quant.group_params, "midpoint", False))


def _four_bit_per_token(t: torch.Tensor) -> torch.Tensor:
    """t [..., T, d] through 4-bit quantization per token (one group of d channels), in t's dtype."""
    q = quant.quantize(t, 4, t.shape[-1], -1, torch.float32)
    return quant.dequantize(q, t.shape[-1], -1).to(t.dtype)


class _QuantizedSinks(ReferenceCache):
    """Sink tokens come back through 4-bit per-token quantization: `sinks()`, `dequantize()`
    and so `attend()` see them lossy (the bytes held are unchanged)."""

    def sinks(self):
        k, v = super().sinks()
        return _four_bit_per_token(k), _four_bit_per_token(v)

    def dequantize(self):
        k, v = super().dequantize()
        sink_k, sink_v = self.sinks()
        n = sink_k.shape[-2]
        return torch.cat([sink_k.float(), k[..., n:, :]], -2), torch.cat([sink_v.float(), v[..., n:, :]], -2)


class _MaskRecomputed(ReferenceCache):
    """Eq. 6 is evaluated again after every append, over the prefill queries and all cached
    keys, and the new selection replaces the stored pair mask (which then reads every page)."""

    def prefill(self, q, k, v):
        super().prefill(q, k, v)
        self._prefill_q = q  # the recomputation needs them: such a cache holds the prompt's queries

    def append(self, k, v):
        super().append(k, v)
        selection = self.cache_layout.selection
        if selection.per_group or not selection.prefill_evaluations:
            return  # no prefill selection to recompute
        keys = self.dequantize()[0]
        self._t["mask"] = selection.at_prefill(self._prefill_q, keys, self.config)
        self.saliency_computations += selection.prefill_evaluations


def _interleave_heads(q: object, n_kv: int, forward: bool = True) -> object:
    """q [B, H, T, d] reordered so that the `repeat_kv` reading (query head h -> KV head
    h // (H / H_kv)) pairs each original head h with KV head h % H_kv; forward=False undoes it.
    Anything that is not such a tensor is returned as is, for the checks to reject."""
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or n_kv < 1 or q.shape[1] % n_kv:
        return q
    b, h, t, d = q.shape
    a, c = (h // n_kv, n_kv) if forward else (n_kv, h // n_kv)
    return q.reshape(b, a, c, t, d).transpose(1, 2).reshape(b, h, t, d)


class _WrongGQA(ReferenceCache):
    """Query head h reads KV head h % H_kv (interleaved) instead of h // n_rep (repeat_kv order),
    both in the Eq. 6 selection at prefill and in decode attention."""

    def prefill(self, q, k, v):
        n_kv = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else 1
        super().prefill(_interleave_heads(q, n_kv), k, v)

    def attend(self, q):
        n_kv = self.sinks()[0].shape[1]  # sinks() also refuses an empty cache, as attend does
        return _interleave_heads(super().attend(_interleave_heads(q, n_kv)), n_kv, forward=False)


class _StorageOmitsMask(ReferenceCache):
    """The storage report leaves out the pair mask."""

    def storage(self):
        return dataclasses.replace(super().storage(), mask=0)


class _AcceptsNaN(ReferenceCache):
    """Appended keys and values are not checked for NaN or Inf."""

    def append(self, k, v):
        with mock.patch.object(validation, "check_finite", lambda *args, **kwargs: None):
            super().append(k, v)


class _UnscaledAttention(ReferenceCache):
    """Decode attention forgets the 1/sqrt(d) scaling (scale 1)."""

    def attend(self, q):
        unscaled = _with_argument(cache_module.attention_ref, "scale", 1.0)
        with mock.patch.object(cache_module, "attention_ref", unscaled):
            return super().attend(q)


def _encode_half_even(x, scale, zero, bits):
    """`quant.encode` rounding half to even (torch.round) instead of half up (numerics rule 4)."""
    s, z = scale.float(), zero.float()
    levels = (2 ** torch.as_tensor(bits, device=x.device)) - 1
    q = torch.round((x.float() - z) / torch.where(s == 0, torch.ones_like(s), s))
    q = torch.where(s == 0, torch.zeros_like(q), q)
    return torch.minimum(q.clamp(min=0), levels.to(q.dtype)).to(torch.uint8)


class _RoundHalfEven(_QuantizesDifferently):
    """Codes round half to even: only exact ties (x - z) / s = k + 0.5 change, by one code."""

    def _patch(self):
        if list(inspect.signature(quant.encode).parameters) != list(inspect.signature(_encode_half_even).parameters):
            raise TypeError("quant.encode changed its signature: this mutant no longer fits it")
        return mock.patch.object(quant, "encode", _encode_half_even)


def _truncating_encode(encode):
    """`encode` that truncates (floor, no + 0.5) the codes of 3-bit groups with float32 scales."""

    @functools.wraps(encode)
    def rare(x, scale, zero, bits):
        if isinstance(bits, int) and bits == 3 and scale.dtype == torch.float32:
            return encode(x - scale.float() / 2, scale, zero, bits)  # floor((x - z) / s) where encode rounds
        return encode(x, scale, zero, bits)

    return rare


class _TruncatesRareCombination(_QuantizesDifferently):
    """3-bit values with float32 scales truncate instead of rounding (off by up to a whole step):
    a defect of one combination of bit width and scale dtype, whatever the input dtype, that a
    drawn case reaches about once in 21."""

    def _patch(self):
        return mock.patch.object(quant, "encode", _truncating_encode(quant.encode))


class _NoUpcast(ReferenceCache):
    """Decode attention computed in the queries' dtype (scores, softmax and sums), without the
    float32 upcast the spec documents."""

    def attend(self, q):
        low = _with_argument(cache_module.attention_ref, "upcast", False)
        with mock.patch.object(cache_module, "attention_ref", low):
            return super().attend(q)


class _ValuesFlushedWithKeys(ReferenceCache):
    """Claims the published KIVI's sliding value window but flushes values with the keys."""

    def __init__(self, config=None) -> None:
        super().__init__(None if config is None else dataclasses.replace(config, value_residual="shared"))


def _msb_first(packed: torch.Tensor) -> torch.Tensor:
    """Reverse the bit order of every byte (a self-consistent but foreign packing)."""
    bits = ((packed.unsqueeze(-1).to(torch.int32) >> torch.arange(8, device=packed.device)) & 1).flip(-1)
    return (bits << torch.arange(8, device=packed.device)).sum(-1).to(torch.uint8)


class _SharesItsResidual(ReferenceCache):
    """`residual()` hands out the cache's own tensors instead of copies: a caller editing what
    it was given edits the cache."""

    def residual(self):
        self._require_prefill()
        return self._t["residual_key"], self._t["residual_value"]


class _EveryTokenLow(TokenPrecisionCache):
    """Quantizes every token's per-token groups at the low precision (packed at the width of its
    class, so its bytes and its class map look right)."""

    def _store(self, k, v, bits):
        with mock.patch.object(quant, "quantize", _with_argument(quant.quantize, "bits", self.config.low_bits)):
            super()._store(k, v, bits)


class _StorageHidesClassMap(TokenPrecisionCache):
    """Leaves the per-token class map out of its storage report."""

    def storage(self):
        return {name: n for name, n in super().storage().items() if name != "token_bits"}


_CHECK_TOKEN_BITS = TokenPrecisionConfig.check_token_bits


def _shape_only(config, token_bits, n, name="token_bits"):
    bits = torch.as_tensor(token_bits)
    if bits.shape != (n,) or bits.is_floating_point():
        return _CHECK_TOKEN_BITS(config, token_bits, n, name)
    return bits.long()


class _TokenBitsUnchecked(TokenPrecisionCache):
    """Takes token bits of the right shape whatever they hold: a precision it does not have is stored
    as no token at all."""

    def append(self, k, v, token_bits):
        with mock.patch.object(TokenPrecisionConfig, "check_token_bits", _shape_only):
            super().append(k, v, token_bits)


class _NoRollback(TokenPrecisionCache):
    """Keeps whatever a failed append had changed (no checkpoint, no roll back)."""

    def checkpoint(self):
        return None

    def roll_back(self, saved):
        pass


def _token_mutant(name: str, cache_class: type, **claims):
    caps = dataclasses.replace(ReferenceImplementation.capabilities, **claims)
    return _mutant(name, token_cache_class=cache_class, capabilities=caps)


def every_token_low():
    return _token_mutant("every_token_low", _EveryTokenLow, reference_numerics=False, reference_layout=False)


def storage_hides_class_map():
    return _token_mutant("storage_hides_class_map", _StorageHidesClassMap)


def token_bits_unchecked():
    return _token_mutant("token_bits_unchecked", _TokenBitsUnchecked)


def no_rollback():
    return _token_mutant("no_rollback", _NoRollback)


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


def round_half_even():
    return _mutant("round_half_even", _RoundHalfEven)


def attention_without_upcast():
    return _mutant("attention_without_upcast", _NoUpcast)


def shares_its_residual():
    return _mutant("shares_its_residual", _SharesItsResidual)


def values_flushed_with_keys():
    claims = dataclasses.replace(ReferenceImplementation.capabilities, residual="sliding_values")
    return _mutant("values_flushed_with_keys", _ValuesFlushedWithKeys, capabilities=claims)


def msb_first_keys():
    """Key codes packed most significant bit first (and unpacked the same way): self-consistent,
    but not the reference's bytes."""
    base = ReferenceImplementation()

    def pack_keys(self, codes, channel_mask, config):
        low, high = base.pack_keys(codes, channel_mask, config)
        return _msb_first(low), _msb_first(high)

    def unpack_keys(self, low, high, channel_mask, config):
        return base.unpack_keys(_msb_first(low), _msb_first(high), channel_mask, config)

    return _mutant("msb_first_keys", pack_keys=pack_keys, unpack_keys=unpack_keys)


def truncates_rare_combination():
    return _mutant("truncates_rare_combination", _TruncatesRareCombination)
