"""The per-token precision cache (TriAxialKV, role-aware PN-Mix) with Triton decode attention."""

from __future__ import annotations

import torch

from pnmix.kernels.token_attention import token_decode_attention
from reference.channels import validation
from reference.tokens.cache import TokenPrecisionCache


class TritonTokenPrecisionCache(TokenPrecisionCache):
    """The spec's stores (`reference.tokens.cache.TokenPrecisionCache`: its quantization and bytes, on the
    tensors' device), read by the Triton decode of `pnmix.kernels.token_attention`: splits of one store
    and one bit width each, merged by log-sum-exp. float16 and bfloat16."""

    def attend(self, q: torch.Tensor, *, scale: float | None = None, softcap: float | None = None) -> torch.Tensor:
        if self._shape is None:
            raise RuntimeError("attend before prefill")
        if softcap is not None:
            raise ValueError(f"softcap={softcap}: the Triton decode kernel does not apply attention logit softcapping")
        b, h, _, d = self._shape
        validation.check_query(q, b, h, d, self._dtype, self._device, self.length)
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"q must be float16 or bfloat16 for the Triton decode, got {q.dtype}")
        stores = self._positions()
        positions = torch.cat([stores["low_key"], stores["leftover_key"], stores["high_key"]]).to(torch.int32)
        counts = tuple(int(stores[n].numel()) for n in ("low_key", "leftover_key", "high_key"))
        return token_decode_attention(q, self._t, positions.to(q.device), counts, self.config, scale=scale)


__all__ = ["TritonTokenPrecisionCache"]
