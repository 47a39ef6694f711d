"""Where a failure of property 7 (decode attention) lies: each part of the decode kernel checked against the spec on
its own, on the same cases, so that the part that fails alone names the cause.

(a) the unpack alone: the decode kernel's value unpack (`unpack.field_codes`, by the PTX where the device can run it
    and plainly) on the probe's bytes, every byte at every shift of every width, against the host's codes; and the
    cache's dequantization (its stored codes, scales and zeros read back) against the spec's, bit for bit;
(b) a dot alone: attention computed with the decode kernel's dots (`common.mma`, `dot_f32`) over the spec's
    dequantized keys and values given exactly as operands (no codes, no unpack), against the float64 oracle over
    the same operands within property 7's bound (`conformance.harness.judge`);
(c) the fused decode: the cache's own attention over the same case (unpack and dots in one kernel), against the
    float64 oracle over the spec's dequantized cache within the same bound.

(a) or (b) failing names its part; both passing and (c) failing puts the fault where they meet in the fused kernel.
`python -m benchmarks.gpu_check --short` runs this module on the GPU when its conformance step fails (its
`separate` step); the test command runs it under the interpreter. Every launch goes through `_runtime.launch`, so
that gpu_check's dry run counts its kernel specializations.
"""

import pytest
import torch
import triton
import triton.language as tl

import reference as R
from conformance.harness import judge
from pnmix import PNMixCache, _runtime
from pnmix.kernels import unpack
from pnmix.kernels.attention import dot_dtype
from pnmix.kernels.common import dot_f32, mma

pytestmark = pytest.mark.interpreter if _runtime.INTERPRETED else pytest.mark.gpu


def dev() -> torch.device:
    """The kernels' device, asked when a test runs (the CPU while gpu_check's dry run records launches)."""
    return _runtime.kernel_device()


#: One case per dtype, both on the decode kernel's fast path (key groups of whole 16-token tiles, where the first GPU
#: run failed) with quantized pages, sinks and a residual: (config, batch, kv heads, queries per kv head, tokens).
FAST = R.PNMixConfig(group_size=16, residual_length=16, n_sink=4)
CASES = {
    "float16": (FAST, 1, 2, 4, 54, torch.float16),
    "bfloat16": (FAST, 2, 1, 3, 97, torch.bfloat16),
}
HEAD_DIM = 16  # the compiled claims' and the interpreter's head_dim alike
BLOCK_M = 16  # query rows of a program, padded (tl.dot takes 16 or more)
BLOCK_N = 16


def data(shape, dtype, seed, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def case_tensors(name: str):
    """The case's prompt (q, k, v) and its decode query, on the CPU."""
    cfg, batch, n_kv, n_rep, length, dtype = CASES[name]
    q = data((batch, n_kv * n_rep, length, HEAD_DIM), dtype, 1, 1.0)
    k, v = data((batch, n_kv, length, HEAD_DIM), dtype, 2), data((batch, n_kv, length, HEAD_DIM), dtype, 3)
    return cfg, q, k, v, data((batch, n_kv * n_rep, 1, HEAD_DIM), dtype, 4, 1.0)


# -- (a) the unpack alone ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ptx", [False, True], ids=["plain", "ptx"])
@pytest.mark.parametrize(("dtype", "bits"), unpack.PROBED, ids=[f"{d}-{b}bit" for d, b in unpack.PROBED])
def test_unpack_alone_gives_every_code_of_every_byte(dtype, bits, ptx):
    if ptx and _runtime.INTERPRETED:
        pytest.skip("the interpreter runs no inline PTX")
    out = torch.empty(unpack.PROBE_ROWS, unpack.PROBE_COLUMNS, dtype=unpack.TORCH_DTYPES[dtype], device=dev())
    dot = dot_dtype(unpack.TORCH_DTYPES[dtype])  # the decode kernel's (float32 for bfloat16 under the interpreter)
    n, d = unpack.PROBE_ROWS, unpack.PROBE_COLUMNS
    packed = unpack.probe_bytes(bits, dev())
    # launched as the self-test launches it (4 warps, 3 stages), so that a GPU reuses the self-test's compiles
    _runtime.launch(
        unpack._probe_kernel, (1,), packed, out, num_warps=4, num_stages=3, BITS=bits, N=n, D=d, PTX=ptx, DOT=dot
    )
    want = unpack.expected_codes(bits, dtype)
    wrong = out.cpu() != want
    assert not bool(wrong.any()), (
        f"{int(wrong.sum())} of {wrong.numel()} codes differ from the host's (first at {wrong.nonzero()[0].tolist()})"
    )


@pytest.mark.parametrize("name", list(CASES))
def test_unpack_alone_reads_back_the_spec_cache(name):
    cfg, q, k, v, _ = case_tensors(name)
    cache = PNMixCache.from_prefill(q.to(dev()), k.to(dev()), v.to(dev()), cfg)
    spec = R.ReferenceCache.from_prefill(q, k, v, cfg)
    for what, got, want in zip(("keys", "values"), cache.dequantize(), spec.dequantize(), strict=True):
        diff = (got.cpu().double() - want.double()).abs().max().item()
        assert diff == 0, f"dequantized {what} differ from the spec's by up to {diff:.3g}"


# -- (b) a dot alone -----------------------------------------------------------------------------------------------


@triton.jit
def _dot_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    T,
    qk_scale,
    ROWS: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT: tl.constexpr,
    SWAP: tl.constexpr,
):
    """One program per (batch, KV head): its ROWS query rows (one decode query of each head sharing the KV head)
    attend all T tokens of dense keys and values given as DOT operands; online softmax in base 2, float32 sums,
    probabilities into the value dot as hi + lo (`dot_f32`), as the decode kernel computes them."""
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    row_ok = rows < ROWS
    q = tl.load(q_ptr + pid * ROWS * D + rows[:, None] * D + cols[None, :], mask=row_ok[:, None], other=0.0)
    q_dot = q.to(DOT)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, T, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)
        ok = t < T
        k = tl.load(k_ptr + pid * T * D + t[:, None] * D + cols[None, :], mask=ok[:, None], other=0.0).to(DOT)
        v = tl.load(v_ptr + pid * T * D + t[:, None] * D + cols[None, :], mask=ok[:, None], other=0.0).to(DOT)
        logits = mma(q_dot, tl.trans(k), SWAP) * qk_scale
        logits = tl.where(ok[None, :], logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(logits - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + dot_f32(p, v, DOT, SWAP)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + pid * ROWS * D + rows[:, None] * D + cols[None, :], out, mask=row_ok[:, None])


def dot_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, swap: bool) -> torch.Tensor:
    """Decode attention of q [B, H, 1, d] over dense k, v [B, H_kv, T, d] by `_dot_attention_kernel`, float32 out."""
    b, h, _, d = q.shape
    n_kv, t = k.shape[1], k.shape[2]
    rows = h // n_kv
    if rows > BLOCK_M:
        raise ValueError(f"{rows} query heads per KV head; the dot check takes up to {BLOCK_M}")
    out = torch.empty(b, h, 1, d, dtype=torch.float32, device=q.device)
    qk_scale = d**-0.5 * 1.4426950408889634  # log2(e): the softmax in base 2
    _runtime.launch(
        _dot_attention_kernel,
        (b * n_kv,),
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        out,
        t,
        qk_scale,
        ROWS=rows,
        D=d,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        DOT=dot_dtype(q.dtype),
        SWAP=swap,
    )
    return out


@pytest.mark.parametrize("swap", [False, True], ids=["direct", "swapped"])
@pytest.mark.parametrize("name", list(CASES))
def test_dot_alone_over_exact_dequantized_operands_is_within_the_bound(name, swap):
    cfg, q, k, v, new_q = case_tensors(name)
    k_hat, v_hat = R.ReferenceCache.from_prefill(q, k, v, cfg).dequantize()
    k_op, v_op = k_hat.to(q.dtype), v_hat.to(q.dtype)  # the operands, exact in the dot's dtype
    out = dot_attention(new_q.to(dev()), k_op.to(dev()), v_op.to(dev()), swap).cpu().to(q.dtype)
    err, bound, _ = judge(out, new_q, k_op.float(), v_op.float())
    assert err <= bound, f"attention error {err:.3g} above {bound:.3g} with exact operands (the dots alone)"


# -- (c) the fused decode ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_fused_decode_is_within_the_bound(name):
    cfg, q, k, v, new_q = case_tensors(name)
    cache = PNMixCache.from_prefill(q.to(dev()), k.to(dev()), v.to(dev()), cfg)
    out = cache.attend(new_q.to(dev())).cpu()
    err, bound, _ = judge(out, new_q, *R.ReferenceCache.from_prefill(q, k, v, cfg).dequantize())
    assert err <= bound, f"attention error {err:.3g} above {bound:.3g} (unpack and dots fused)"
