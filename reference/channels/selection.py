"""Which key channels get b_high bits: one small class per rule, behind one interface.

- `PrefillPairs` (PN-Mix): Eq. 6 once at prefill, the top floor(r * d / 2) RoPE pairs of each
  sequence and KV head; stored once as a bit-packed pair mask.
- `Uniform` (KIVI, FP16): no channel gets more bits; nothing is stored.
- `PageChannels` (Kitty): per page of G keys, the floor(r * d) channels of largest mean |k|
  over that page's own keys; stored as a rank table of d bytes per page, read at decode time.

A selection says how many high-plane columns it needs, what metadata it stores (`metadata`
names the format the decode kernels read: "pair-mask", "page-ranks" or "none") and, given
that metadata, which channels have b_high bits in each quantized group. A rule that varies
per token (precision by token role) fits the same interface: `group_masks` already answers
per group of G tokens.
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar

import torch

from reference.equations import packing, saliency


class Selection(abc.ABC):
    """Interface of a channel-selection rule; subclasses are stateless singletons."""

    name: ClassVar[str]
    metadata: ClassVar[str]  # the stored format: "pair-mask", "page-ranks" or "none"
    per_group: ClassVar[bool] = False  # True if the selection differs between key groups
    prefill_evaluations: ClassVar[int] = 0  # saliency evaluations at prefill (PN-Mix: exactly one)

    def validate(self, config) -> None:
        """Reject a configuration this rule cannot serve (called by PNMixConfig); by default any."""
        return None

    def check_head_dim(self, head_dim: int) -> None:
        """Reject a head_dim whose metadata this rule cannot store; by default none."""
        return None

    @abc.abstractmethod
    def n_high_channels(self, config, head_dim: int) -> int:
        """Channels of a KV head (of one group, if per_group) that get b_high bits."""

    @abc.abstractmethod
    def metadata_columns(self, head_dim: int) -> int:
        """Last-dimension size of the stored metadata tensor."""

    def at_prefill(self, q: torch.Tensor, k: torch.Tensor, config) -> torch.Tensor:
        """Metadata stored once from the prompt's post-RoPE q [B, H, T, d] and k [B, H_kv, T, d]."""
        return k.new_empty((*k.shape[:2], 0), dtype=torch.uint8)

    def for_groups(self, k: torch.Tensor, config) -> torch.Tensor | None:
        """Metadata rows stored for newly quantized keys k [B, H_kv, n * G, d], or None."""
        return None

    def group_masks(self, stored: torch.Tensor, config, head_dim: int, n_groups: int) -> torch.Tensor:
        """Channels with b_high bits in each quantized group: bool [B, H_kv, n_groups, d]."""
        channel = saliency.channel_mask_from_pairs(self.pair_mask(stored, head_dim), config.pair_layout)
        return channel.unsqueeze(2).expand(-1, -1, n_groups, -1)

    @abc.abstractmethod
    def pair_mask(self, stored: torch.Tensor, head_dim: int) -> torch.Tensor:
        """The prefill pair mask [B, H_kv, d/2] held as `stored`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class PrefillPairs(Selection):
    """PN-Mix: pairs chosen once from the prompt by `config.criterion` (Eq. 6 by default)."""

    name = "prefill-pairs"
    metadata = "pair-mask"
    prefill_evaluations = 1

    def n_high_channels(self, config, head_dim: int) -> int:
        return 2 * config.n_salient_pairs(head_dim)

    def metadata_columns(self, head_dim: int) -> int:
        return math.ceil(head_dim // 2 / 8)

    def at_prefill(self, q, k, config):
        return packing.pack_mask(saliency.prefill_pair_mask(q, k, config))

    def pair_mask(self, stored, head_dim):
        return packing.unpack_mask(stored, head_dim // 2)


class Uniform(Selection):
    """Every channel at the same bits (KIVI, FP16): no selection and no metadata."""

    name = "none"
    metadata = "none"

    def validate(self, config) -> None:
        if config.b_high != config.b_low:
            raise ValueError(
                f"selection 'none' (uniform keys) needs b_high == b_low, got {config.b_high}, {config.b_low}"
            )

    def n_high_channels(self, config, head_dim: int) -> int:
        return 0

    def metadata_columns(self, head_dim: int) -> int:
        return 0

    def pair_mask(self, stored, head_dim):
        b, h = stored.shape[:2]
        return torch.zeros(b, h, head_dim // 2, dtype=torch.bool, device=stored.device)


class PageChannels(Selection):
    """Kitty: per group of G keys, the floor(r * d) channels of largest mean |k| over its own keys."""

    name = "page-channels"
    metadata = "page-ranks"
    per_group = True

    def check_head_dim(self, head_dim: int) -> None:
        if head_dim > 256:
            raise ValueError(f"head_dim must be <= 256 for per-page channel ranks stored in uint8, got {head_dim}")

    def n_high_channels(self, config, head_dim: int) -> int:
        return math.floor(config.ratio * head_dim + 1e-9)

    def metadata_columns(self, head_dim: int) -> int:
        return head_dim

    def at_prefill(self, q, k, config):
        b, h, _, d = k.shape
        return k.new_empty((b, h, 0, d), dtype=torch.uint8)

    def for_groups(self, k, config):
        return saliency.page_channel_ranks(k, config.group_size, self.n_high_channels(config, k.shape[-1]))

    def group_masks(self, stored, config, head_dim, n_groups):
        return stored[:, :, :n_groups] < self.n_high_channels(config, head_dim)

    def pair_mask(self, stored, head_dim):
        raise AttributeError("a per-page selection (page-channels) has no single pair mask; see page_channel_masks")


PREFILL_PAIRS, UNIFORM, PAGE_CHANNELS = PrefillPairs(), Uniform(), PageChannels()
#: The selection rules by their configuration name.
SELECTIONS: dict[str, Selection] = {s.name: s for s in (PREFILL_PAIRS, UNIFORM, PAGE_CHANNELS)}
