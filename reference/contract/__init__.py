"""The implementation contract: the one protocol an implementation of PN-Mix satisfies.

An implementation is an object with a name, a version, its `Capabilities`, a `create(config)`
that returns an empty `Cache` (a `TokenCache` for a `reference.tokens.config.TokenPrecisionConfig`,
where it claims per-token precision), and the pack/unpack functions of the storage format. The
conformance suite never reaches past these names; everything it compares against comes from
`reference`. It lives in the spec layer so that implementations (`pnmix`, third parties)
depend on it without depending on the test suite. Implementations register under the
entry-point group `ENTRY_POINT_GROUP`, the built-in ones too (see pyproject.toml).

Shapes: q [B, H, T, d]; k, v [B, H_kv, T, d]; H a multiple of H_kv (query head h reads KV
head h // (H / H_kv)). Packed layouts are those of `reference.equations.packing`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from reference.channels.config import KEY_BITS, VALUE_BITS, PNMixConfig
from reference.channels.derived import Derived  # noqa: F401 (the contract: state that is not stored)
from reference.channels.storage import StorageReport
from reference.equations.quant import Quantized

#: The entry-point group under which implementations register (name -> factory).
ENTRY_POINT_GROUP = "pnmix.implementations"

#: Which newest tokens an implementation keeps exact (beyond the sinks), by name.
RESIDUAL_POLICIES = {
    "shared": "keys and values: the tokens since the last full residual, flushed N at a time (this spec)",
    "sliding_values": "keys as shared; values: the residual_length newest (the published KIVI: once the "
    "window is full, each new token quantizes the oldest value of the window)",
    "requantize": "the prompt quantized whole; appended tokens exact until they would reach residual_length, "
    "then everything quantized again from its dequantized values (transformers' QuantizedCache)",
}

#: The value residual of the configuration an implementation is handed, by the residual policy it claims
#: (the spec's cache then models the claim where it can; "requantize" flushes values with keys).
VALUE_RESIDUAL = {"shared": "shared", "sliding_values": "sliding", "requantize": "shared"}

#: Whose arithmetic an implementation's `attend` computes, by claim (`Capabilities.attention`).
ATTENTION = {
    "own": "its own attention, as it runs in production",
    "spec": "judged on the spec's attention (reference.attention_ref, float32) over its dequantized cache, "
    "not on its own attention arithmetic",
}

#: The opt-in claims of an implementation that reproduces this spec's bytes and numerics bit for bit.
BIT_EXACT = {"reference_layout": True, "reference_numerics": True}


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an implementation claims; properties outside the claims skip with the reason.

    key_bits: supported (b_high, b_low) pairs; value_bits: supported value bits (16 = none).
    midpoint_one_bit: 1-bit groups use Eq. 7 midpoints. sinks: keeps the first n_sink tokens
    exact (else only n_sink = 0 is drawn). storage_introspectable: every persistent tensor is
    reachable from the cache object's attributes, so its bytes can be counted independently.
    max_tokens / max_head_dim bound the drawn shapes (slow backends such as the Triton
    interpreter declare small ones). bookkeeping_bytes: bytes a cache holds beyond its stored
    components whatever its size (e.g. token counts kept on the device), declared so that the
    storage audit stays exact.

    Real designs differ from the reference in ways that are not errors; they are claimed here:
    residual: which newest tokens stay exact (`RESIDUAL_POLICIES`). key_groups: "tokens" (each
    channel in groups of G tokens, as PN-Mix and KIVI) or "channels" (each token in groups of the
    value group size of channels, as values; transformers' QuantizedCache). group_sizes / head_dims: the
    key group sizes G and head dims it supports (None: any). token_multiple: prompt and append
    sizes it accepts are multiples of this (e.g. codes packed into 32-bit words along tokens).
    pack_word_bits: packed codes fill words of this many bits (the packing tests draw token
    counts that fill whole words). scale_dtypes may be ("input",): scale and zero are stored in
    the dtype of the keys and values. prefill_selection: PN-Mix's pair mask, chosen once at
    prefill (the mask properties, `pair_mask` and `pack_mask` are needed only then).

    Two cache families: channel_precision (a `PNMixConfig` cache, every property but 11; False
    for an implementation of per-token precision alone) and token_precision, the `low_keys` kinds
    of `reference.tokens.config.TokenPrecisionConfig` it stores ("channels": TriAxialKV,
    "pairs": role-aware PN-Mix; property 11): `create` then also takes that config and returns a
    `TokenCache`.

    attention: whose arithmetic `attend` computes. "own" (the default): the implementation's own,
    as it runs in production (a library adapter calls the library's attention, in its dtypes).
    "spec": `reference.attention_ref` (float32 scores and softmax) over the dequantized cache, so
    property 7 judges what the cache holds, not how the implementation attends; the report says so
    beside the verdict.

    Opt-in, bit for bit: reference_layout (packed bytes are `reference.equations.packing`'s) and
    reference_numerics (codes, scales and zeros follow `reference.equations.quant`'s numerics rules).
    Without them an implementation is judged on its own format and its own dequantized values.
    """

    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
    devices: tuple[str, ...] = ("cpu", "cuda")
    key_bits: frozenset[tuple[int, int]] = frozenset((h, lo) for h in KEY_BITS for lo in KEY_BITS if h >= lo)
    value_bits: frozenset[int] = frozenset(VALUE_BITS)
    scale_dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
    pair_layouts: tuple[str, ...] = ("adjacent", "split")
    midpoint_one_bit: bool = True
    sinks: bool = True
    storage_introspectable: bool = True
    bookkeeping_bytes: int = 0
    max_tokens: int = 320
    max_head_dim: int = 32
    prefill_selection: bool = True
    channel_precision: bool = True
    token_precision: frozenset[str] = frozenset()
    preset: Callable[[PNMixConfig], PNMixConfig] | None = None
    residual: str = "shared"
    key_groups: str = "tokens"
    group_sizes: tuple[int, ...] | None = None
    head_dims: tuple[int, ...] | None = None
    token_multiple: int = 1
    pack_word_bits: int = 8
    attention: str = "own"
    reference_layout: bool = False
    reference_numerics: bool = False

    def __post_init__(self) -> None:
        if self.key_groups not in ("tokens", "channels"):
            raise ValueError(f"key_groups must be 'tokens' or 'channels', got {self.key_groups!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {sorted(ATTENTION)}, got {self.attention!r}")
        if self.residual not in RESIDUAL_POLICIES:
            raise ValueError(f"residual must be one of {sorted(RESIDUAL_POLICIES)}, got {self.residual!r}")
        for name in ("token_multiple", "pack_word_bits", "max_tokens", "max_head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        unknown = set(self.token_precision) - {"channels", "pairs"}
        if unknown or not isinstance(self.token_precision, frozenset):
            raise ValueError(
                f"token_precision must be a frozenset of 'channels' and 'pairs', got {self.token_precision!r}"
            )
        if self.pack_word_bits % 8:
            raise ValueError(f"pack_word_bits must be a multiple of 8, got {self.pack_word_bits}")
        for name in ("dtypes", "devices", "key_bits", "value_bits", "scale_dtypes", "pair_layouts"):
            if not getattr(self, name):
                raise ValueError(f"{name} must name at least one supported choice, got {getattr(self, name)!r}")
        bad = [s for s in self.scale_dtypes if not isinstance(s, torch.dtype) and s != "input"]
        if bad or ("input" in self.scale_dtypes and len(self.scale_dtypes) > 1):
            raise ValueError(f"scale_dtypes holds torch dtypes, or is ('input',), got {self.scale_dtypes!r}")

    @property
    def scales_in_input_dtype(self) -> bool:
        return self.scale_dtypes == ("input",)

    def configured(self, config: PNMixConfig) -> PNMixConfig:
        """`config` as an implementation with these claims runs it: its preset's design, with the value
        residual of the residual policy it claims. The one mapping from claims to a configuration: the
        conformance suite fits its cases with it, the benchmarks and the lm-eval model run a plug-in by it."""
        if self.preset is not None:
            config = self.preset(config)
        return dataclasses.replace(config, value_residual=VALUE_RESIDUAL[self.residual])


@runtime_checkable
class Cache(Protocol):
    """One layer's cache for a batch of equal-length sequences."""

    length: int  # tokens held per sequence
    # Optional: `capacity` (int) for a cache preallocated to that many tokens; its storage is
    # then compared with reference.storage_model(..., capacity=capacity).
    saliency_computations: int  # times Eq. 6 was evaluated (PN-Mix: exactly once, at prefill)

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...
    def append(self, k: torch.Tensor, v: torch.Tensor) -> None: ...
    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """Causal attention of the last q.shape[2] positions over the cache: [B, H, T_new, d]."""

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All cached keys and values, float32 [B, H_kv, T, d], sinks and residual exact."""

    def storage(self) -> StorageReport: ...

    @property
    def pair_mask(self) -> torch.Tensor:
        """Salient pairs chosen at prefill, bool [B, H_kv, d/2]."""

    def key_codes(self) -> Quantized:
        """Codes [B, H_kv, T_q, d] and scale/zero [B, H_kv, T_q/G, d] of the quantized region."""

    def value_codes(self) -> Quantized | None:
        """Codes [B, H_kv, T_q, d] and scale/zero [B, H_kv, T_q, d/value_group]; None if unquantized."""

    def sinks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact sink keys and values [B, H_kv, min(T, n_sink), d]."""

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact residual keys and values [B, H_kv, n, d] (values: the value residual's n)."""

    # Every tensor these methods return is the caller's: editing it leaves the cache unchanged
    # (property 9); a cache hands out views of its own storage only under other names.
    #
    # Optional (the evaluation path, `pnmix.hf.PNMixHFCache(impl=)`, uses them where a cache has them):
    # - attend_stepwise(q, exact_keys, exact_values, *, scale=None, softcap=None): each of the newest
    #   T_new tokens, appended at once, attended as had they been appended one at a time
    #   (`reference.channels.stepwise`);
    # - checkpoint() -> state, roll_back(state), release(state): back to a state any number of times
    #   until it is released (the continuations of one context share one pass over it);
    # - select_rows(index): keep the batch rows `index` (integers in [0, B), rows may repeat), in that
    #   order, each holding what it held, all or nothing (beam search's reorder, a batch's expansion).


@runtime_checkable
class TokenCache(Protocol):
    """One layer's per-token precision cache (`reference.tokens.cache.TokenPrecisionCache` is the spec):
    token_bits gives each new token's precision, config.low_bits or config.high_bits, shared by the
    batch's sequences."""

    length: int

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, token_bits) -> None: ...
    def append(self, k: torch.Tensor, v: torch.Tensor, token_bits) -> None: ...
    def attend(self, q: torch.Tensor) -> torch.Tensor: ...
    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All cached keys and values, float32 [B, H_kv, T, d], in token order."""

    def token_bits(self) -> torch.Tensor:
        """The precision of every token held, in order: int [T]."""

    def storage(self) -> dict[str, int]:
        """Persistent bytes by stored tensor (any names: only the total is compared, unless the
        implementation claims reference_layout, when they are `reference.tokens.config.PARTS`)."""


#: What an implementation provides (`conformance/impls/template.py` shows each with its signature).
REQUIRED = (
    "name",
    "version",
    "capabilities",
    "create",
    "pack_keys",
    "unpack_keys",
    "pack_values",
    "unpack_values",
    "pack_mask",
    "unpack_mask",
)


def variant(impl, name: str, capabilities: Capabilities):
    """`impl` under another name and claims: a baseline method run on the same code."""
    impl.name, impl.capabilities = name, capabilities
    return impl


def missing_names(impl: object) -> list[str]:
    """Protocol names `impl` lacks (the suite reports them instead of crashing at import)."""
    return [name for name in REQUIRED if not hasattr(impl, name)]
