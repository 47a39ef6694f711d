"""What every efficiency benchmark shares: clocks, memory probes, the model with random weights,
caches under the paper's static protocol, and greedy decode steps (the environment record each
result carries is `reference.records.environment`).

The same code runs the paper's shapes on CUDA and a tiny architecture on the CPU (Triton
interpreter), so the CPU run checks the harness that produces the GPU numbers. Caches:
- FP16: transformers' `StaticCache` read by SDPA, the baseline a transformers user gets;
- every quantized method: `pnmix.hf.PNMixHFCache` on the Triton kernels, preallocated to
  max_cache_len = prompt + generation (`reference.storage.allocation`).
Cache contents beyond the prompt are synthetic (random post-RoPE keys and values written
straight into the cache), since decode cost does not depend on what the keys say; the
prompt itself goes through the model, so PN-Mix selects its pairs from real queries.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict

import torch

from reference import PNMixConfig
from reference.methods import METHODS
from reference.records import GIB

from .models import Architecture

FP16 = "FP16"
FP16_ATTENTION = "sdpa over transformers StaticCache (16-bit K/V, preallocated)"
PACKED_ATTENTION = "pnmix: Triton split-K decode over PNMixHFCache (packed, preallocated)"


# -- clocks and memory ------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float, float | None]:
    """(fn's result, wall ms, GPU ms) of one call. GPU time comes from CUDA events around the
    call; wall time from the host clock with the device synchronized at both ends, so it also
    counts the launch overhead the events do not see. GPU ms is None on the CPU."""
    synchronize(device)
    t0 = time.perf_counter()
    if device.type != "cuda":
        result = fn()
        return result, (time.perf_counter() - t0) * 1e3, None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = fn()
    end.record()
    end.synchronize()
    return result, (time.perf_counter() - t0) * 1e3, start.elapsed_time(end)


def time_ms(fn: Callable[[], object], device: torch.device, reps: int, warmup: int = 1) -> dict:
    """Median wall and GPU milliseconds of fn over reps calls, after warmup calls (see `timed`);
    "ms" is the GPU time on CUDA and the wall time on the CPU."""
    for _ in range(warmup):
        fn()
    runs = [timed(fn, device)[1:] for _ in range(reps)]
    wall = statistics.median(w for w, _ in runs)
    gpu = statistics.median(g for _, g in runs) if device.type == "cuda" else None
    return {"ms": wall if gpu is None else gpu, "wall_ms": wall, "gpu_ms": gpu}


def do_bench_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Median milliseconds of a kernel call: triton.testing.do_bench on CUDA (flushes L2), else wall clock."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])[0])
    return time_ms(fn, device, reps=1, warmup=0)["wall_ms"]  # the CPU harness check: one call


def copy_bandwidth_gbps(device: torch.device, nbytes: int) -> float:
    """GB/s of a device-to-device copy of nbytes (read + write counted), this run, this device."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / (do_bench_ms(lambda: dst.copy_(src), device) * 1e-3) / 1e9


def cap_memory(device: torch.device, budget_gib: float) -> float | None:
    """Limit this process to budget_gib on a CUDA device (a larger GPU then reproduces a 40 GiB
    card's boundaries); returns the cap in GiB, None on the CPU or when the device is smaller."""
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    if budget_gib * GIB >= total:
        return None
    torch.cuda.set_per_process_memory_fraction(budget_gib * GIB / total, device)
    return budget_gib


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> tuple[float | None, float | None]:
    """(max allocated, max reserved) GiB since reset_peak; (None, None) on the CPU (no allocator stats)."""
    if device.type != "cuda":
        return None, None
    return torch.cuda.max_memory_allocated(device) / GIB, torch.cuda.max_memory_reserved(device) / GIB


def out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError)  # torch.OutOfMemoryError from 2.5 on, same class


def unless_oom(measure: Callable[[], dict], device: torch.device, **oom_figures) -> dict:
    """measure() with {"oom": False} added, or {"oom": True, **oom_figures} when the device runs
    out of memory: out of memory is a data point of a memory sweep, not a crash. Memory held by
    the measurement is released either way, before the next point."""
    release(device)
    try:
        return {"oom": False, **measure()}
    except Exception as error:
        if not out_of_memory(error):
            raise
        return {"oom": True, **oom_figures}
    finally:
        release(device)


# -- model and caches -------------------------------------------------------------------------


def build_model(arch: Architecture, device: torch.device, dtype: torch.dtype, path: str | None = None, seed: int = 0):
    """The architecture with random weights (seeded), or a local checkpoint when `path` is given."""
    from transformers import AutoModelForCausalLM

    import pnmix.hf  # noqa: F401  (registers the "pnmix" attention)

    if path is not None:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device.type)
    else:
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(arch.hf_config(), dtype=dtype)
    return model.eval()


def method_config(method: str) -> PNMixConfig:
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    return METHODS[method]()


def config_record(method: str) -> dict:
    return {k: str(v) if isinstance(v, torch.dtype) else v for k, v in asdict(method_config(method)).items()}


def attention_of(method: str) -> str:
    return FP16_ATTENTION if method == FP16 else PACKED_ATTENTION


def measured_cache_bytes(cache) -> int:
    """Bytes of the tensors the cache really holds, all layers (what `memory.cache_bytes` predicts)."""
    from pnmix.hf import PNMixHFCache

    if isinstance(cache, PNMixHFCache):
        return sum(layer.cache.storage().total for layer in cache.layers)
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


class Generation:
    """One batch of greedy generation under the static protocol: a cache preallocated to
    `capacity`, the prompt through the model, then synthetic fill and timed decode steps."""

    def __init__(self, model, method: str, batch: int, prompt: int, capacity: int, seed: int = 0) -> None:
        from transformers import StaticCache

        from pnmix.hf import PNMixHFCache

        if prompt >= capacity:
            raise ValueError(f"capacity ({capacity}) must exceed the prompt ({prompt})")
        self.model, self.method, self.batch, self.capacity = model, method, batch, capacity
        self.device, self.dtype = model.device, model.dtype
        cfg = model.config
        self.kv_heads, self.head_dim = cfg.num_key_value_heads, getattr(cfg, "head_dim", None)
        model.set_attn_implementation("sdpa" if method == FP16 else pnmix_attention())
        if method == FP16:
            self.cache = StaticCache(config=cfg, max_cache_len=capacity)
        else:
            self.cache = PNMixHFCache(cfg, method_config(method), backend="triton", max_cache_len=capacity)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.length = 0
        prompt_ids = torch.randint(0, cfg.vocab_size, (batch, prompt), generator=self.gen, device=self.device)
        self.token = self._forward(prompt_ids)

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        from pnmix.hf import cache_argument

        positions = torch.arange(self.length, self.length + ids.shape[1], device=self.device).unsqueeze(0)
        out = self.model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1,
                         **{cache_argument(self.model): self.cache})  # fmt: skip
        self.length += ids.shape[1]
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def step(self) -> None:
        """One greedy decode step (the token fed is the previous step's argmax)."""
        if self.length >= self.capacity:
            raise ValueError(f"the cache is full: {self.length} tokens of max_cache_len {self.capacity}")
        self.token = self._forward(self.token)

    @torch.inference_mode()
    def fill_to(self, length: int, chunk: int = 4096) -> None:
        """Write random post-RoPE keys and values into every layer until the cache holds `length` tokens."""
        if not self.length <= length <= self.capacity:
            raise ValueError(f"length must be within [{self.length}, {self.capacity}], got {length}")
        while self.length < length:
            n = min(chunk, length - self.length)
            shape = (self.batch, self.kv_heads, n, self.head_dim)
            for layer in self.cache.layers:
                k = torch.randn(shape, generator=self.gen, device=self.device, dtype=self.dtype)
                v = torch.randn(shape, generator=self.gen, device=self.device, dtype=self.dtype)
                if self.method == FP16:
                    positions = torch.arange(self.length, self.length + n, device=self.device)
                    layer.update(k, v, {"cache_position": positions})
                else:
                    layer.cache.append(k, v)
            self.length += n


def pnmix_attention() -> str:
    from pnmix.hf import ATTENTION

    return ATTENTION


def build_decode_cache(
    method: str, batch: int, context: int, layer: tuple[int, int, int], device, prompt: int, chunk: int = 4096
):
    """One attention layer's PNMixCache holding `context` random tokens, and a decode query:
    the kernel microbenchmark's input (layer = (KV heads, query heads per KV head, head_dim))."""
    from pnmix import PNMixCache

    kv_heads, n_rep, head_dim = layer
    gen = torch.Generator(device=device).manual_seed(batch * 7919 + context)

    def rand(heads: int, n: int) -> torch.Tensor:
        return torch.randn(batch, heads, n, head_dim, generator=gen, device=device, dtype=torch.float16)

    prompt = min(prompt, context)
    cache = PNMixCache.from_prefill(rand(kv_heads * n_rep, prompt), rand(kv_heads, prompt), rand(kv_heads, prompt),
                                    method_config(method))  # fmt: skip
    while cache.length < context:
        n = min(chunk, context - cache.length)
        cache.append(rand(kv_heads, n), rand(kv_heads, n))
    return cache, rand(kv_heads * n_rep, 1)
