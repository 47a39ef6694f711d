"""Hugging Face transformers integration: a `Cache` of PN-Mix layers and the "pnmix" attention.

    import pnmix.hf  # registers attn_implementation="pnmix"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="pnmix")
    cache = pnmix.hf.PNMixHFCache(model.config, PNMixConfig())   # or any method of reference.methods
    model.generate(**inputs, past_key_values=cache, do_sample=False)

Prefill runs exact attention and hands the model's own post-RoPE query states to the cache,
which selects its channels once (Eq. 6); every decode step appends the new key/value and reads
the packed cache through the implementation's decode attention (the reference on the CPU,
the Triton kernels on CUDA), without a dense dequantized cache in the model's hands. Sequences
in a batch must have equal lengths: a padding mask is rejected, since padding would enter the
saliency and the sinks. Beam search and cropping are not supported and raise.
"""

from __future__ import annotations

import inspect

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface

from reference import PNMixConfig, ReferenceCache

ATTENTION = "pnmix"

#: Model families whose RoPE uses `rotate_half`, pairing channels (i, i + d/2).
SPLIT_HALF_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma", "phi3"})


def cache_argument(model) -> str:
    """The keyword that passes a cache to `model(...)` and `model.generate(...)`: `cache` where
    transformers has renamed `past_key_values` (5.2x), else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class UnsupportedOperation(RuntimeError):
    """An operation a PN-Mix cache cannot perform (beam reordering, cropping)."""


def detect_pair_layout(model_config) -> str | None:
    """ "split" for rotate_half model families, None when unknown (then it must be given)."""
    return "split" if getattr(model_config, "model_type", None) in SPLIT_HALF_MODELS else None


class PNMixLayer(CacheLayerMixin):
    """One attention layer's PN-Mix cache inside a transformers `Cache`."""

    is_compileable = False
    is_sliding = False

    def __init__(
        self, config: PNMixConfig, backend: str, max_cache_len: int | None = None, check_finite: bool = True
    ) -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.max_cache_len = max_cache_len
        self.check_finite = check_finite
        self.cache = None  # created at prefill, when the attention sees the queries
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.cache is None:
            if self._pending is not None:
                raise RuntimeError(f"the model did not run attn_implementation={ATTENTION!r} after a prefill update")
            self._pending = (key_states, value_states)
        else:
            self.cache.append(key_states, value_states)
        key_states._pnmix_layer = self  # how the attention function finds this layer
        return key_states, value_states

    def start(self, query_states: torch.Tensor) -> None:
        """Build the cache from the prompt once the queries are known (Eq. 6 needs them)."""
        k, v = self._pending
        if self.backend == "triton":
            from .cache import PNMixCache

            self.cache = PNMixCache(self.config, max_cache_len=self.max_cache_len, check_finite=self.check_finite)
        else:
            self.cache = ReferenceCache(self.config)
        self.cache.prefill(query_states, k, v)
        self._pending = None

    def get_seq_length(self) -> int:
        if self.cache is not None:
            return self.cache.length
        return 0 if self._pending is None else self._pending[0].shape[2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_cache_shape(self) -> int:
        return -1 if self.max_cache_len is None else self.max_cache_len

    def get_max_length(self) -> int:
        return self.get_max_cache_shape()

    def reset(self) -> None:
        self.cache, self._pending, self.is_initialized = None, None, False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise UnsupportedOperation("PN-Mix caches do not support beam search (reorder_cache); use greedy or sampling")

    def crop(self, max_length: int) -> None:
        raise UnsupportedOperation("PN-Mix caches cannot be cropped: quantized pages are not rewound")


class PNMixHFCache(Cache):
    """A transformers Cache with one PN-Mix layer per decoder layer of `model_config`.

    config: any configuration of the cache family (PN-Mix, or a baseline from
    reference.methods); its pair_layout must match the model's RoPE: it is checked against the
    model family, and must be given explicitly (`pair_layout=`) for an unknown family.
    backend: "reference" (CPU), "triton", or "auto" (Triton when CUDA is available).
    max_cache_len: preallocate every layer for this many tokens (the paper's static protocol;
    Triton backend); generating past it raises ValueError.
    check_finite: check inputs for NaN and Inf (one device->host sync per tensor and step;
    Triton backend, where False skips it, as benchmarks do; see `pnmix.PNMixCache`).
    """

    def __init__(
        self,
        model_config,
        config: PNMixConfig | None = None,
        *,
        backend: str = "auto",
        pair_layout: str | None = None,
        max_cache_len: int | None = None,
        check_finite: bool = True,
    ) -> None:
        config = PNMixConfig() if config is None else config
        if not isinstance(config, PNMixConfig):
            raise TypeError(f"config must be a PNMixConfig, got {type(config).__name__}")
        detected = detect_pair_layout(model_config)
        expected = pair_layout or detected
        if expected is None:
            raise ValueError(
                f"cannot tell the RoPE pair layout of model_type={getattr(model_config, 'model_type', None)!r}: "
                "pass pair_layout='split' (rotate_half) or 'adjacent' (interleaved pairs)"
            )
        if pair_layout is not None and detected is not None and pair_layout != detected:
            raise ValueError(f"pair_layout={pair_layout!r} contradicts the model family's {detected!r} RoPE layout")
        if config.pair_layout != expected:
            raise ValueError(
                f"config.pair_layout is {config.pair_layout!r} but this model's RoPE pairs are {expected!r}: "
                f"use dataclasses.replace(config, pair_layout={expected!r})"
            )
        if backend not in ("auto", "reference", "triton"):
            raise ValueError(f"backend must be 'auto', 'reference' or 'triton', got {backend!r}")
        if backend == "auto":
            backend = "triton" if torch.cuda.is_available() else "reference"
        if max_cache_len is not None and backend != "triton":
            raise ValueError(f"max_cache_len (static preallocation) needs backend='triton', got backend={backend!r}")
        if not isinstance(check_finite, bool):
            raise TypeError(f"check_finite must be a bool, got {check_finite!r}")
        if not check_finite and backend != "triton":
            raise ValueError(f"check_finite=False needs backend='triton', got backend={backend!r}")
        self.config = config
        self.check_finite = check_finite
        layers = [
            PNMixLayer(config, backend, max_cache_len, check_finite) for _ in range(model_config.num_hidden_layers)
        ]
        super().__init__(layers=layers)

    def crop(self, max_length: int) -> None:
        raise UnsupportedOperation("PN-Mix caches cannot be cropped: quantized pages are not rewound")


def pnmix_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """attn_implementation="pnmix": exact prefill, packed-cache decode. Returns ([B, T, H, d], None)."""
    layer = getattr(key, "_pnmix_layer", None)
    if layer is None:
        raise RuntimeError(f"attn_implementation={ATTENTION!r} needs past_key_values=PNMixHFCache(...)")
    d = query.shape[-1]
    if scaling is not None and abs(scaling - d**-0.5) > 1e-12 * d**-0.5:
        raise ValueError(f"PN-Mix attention scales by 1/sqrt(head_dim); the model asks for {scaling}")
    if layer.cache is None:  # the prompt: exact attention, then the cache is built
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
        layer.start(query)
    else:
        out = layer.cache.attend(query)
    return out.transpose(1, 2).contiguous(), None


def pnmix_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
               **kwargs):  # fmt: skip
    """No mask is needed (attention is causal by construction) and padding is refused.

    Padding is looked for in the prompt and any multi-token call; one-token decode steps skip
    the check, which would wait on the GPU every step (generation extends the mask with ones)."""
    decode_step = q_length == 1 and q_offset != 0
    if attention_mask is not None and not decode_step and not bool(attention_mask.all()):
        raise ValueError(
            "PN-Mix caches need equal-length sequences: this batch is padded (attention_mask has zeros), and "
            "padding would enter the saliency and the sink tokens; run the sequences separately"
        )
    return None


AttentionInterface.register(ATTENTION, pnmix_attention)
AttentionMaskInterface.register(ATTENTION, pnmix_mask)
