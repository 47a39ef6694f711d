"""The decode-path append: new key and value rows into the residual, in one launch.

The row offset is the residual token count held on the device (`counts[2]`), and the kernel
moves that count itself, so the host passes no length: a captured CUDA graph replays each
append at the next free row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pnmix import _runtime  # sets TRITON_INTERPRET before the kernel below is decorated


@triton.jit
def _append_rows_kernel(
    k_ptr,
    v_ptr,
    old_k_ptr,
    old_v_ptr,
    rk_ptr,
    rv_ptr,
    counts_ptr,
    t,
    n_old,
    rows,
    n_kv,
    d,
    n_programs,
    s_kb,
    s_kh,
    s_kt,
    s_kd,
    s_vb,
    s_vh,
    s_vt,
    s_vd,
    s_old,
    s_res,
    COPY_OLD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // n_kv
    h = bh % n_kv
    offset = tl.load(counts_ptr + 2)
    r = tl.arange(0, BLOCK_T)[:, None]
    c = tl.arange(0, BLOCK_D)[None, :]
    c_ok = c < d
    if COPY_OLD:  # a grown (reallocated) buffer: the rows held so far move first
        for r0 in range(0, n_old, BLOCK_T):
            ok = (r0 + r < n_old) & c_ok
            at = bh * s_res + (r0 + r) * d + c
            old = bh * s_old + (r0 + r) * d + c
            tl.store(rk_ptr + at, tl.load(old_k_ptr + old, mask=ok), mask=ok)
            tl.store(rv_ptr + at, tl.load(old_v_ptr + old, mask=ok), mask=ok)
    for r0 in range(0, t, BLOCK_T):
        # Rows past the buffer are dropped: only a graph replayed past a flush gets there.
        ok = (r0 + r < t) & (offset + r0 + r < rows) & c_ok
        at = bh * s_res + (offset + r0 + r) * d + c
        k = tl.load(k_ptr + b * s_kb + h * s_kh + (r0 + r) * s_kt + c * s_kd, mask=ok)
        v = tl.load(v_ptr + b * s_vb + h * s_vh + (r0 + r) * s_vt + c * s_vd, mask=ok)
        tl.store(rk_ptr + at, k, mask=ok)
        tl.store(rv_ptr + at, v, mask=ok)
    # Programs run in any order, so the count may move only once every program has read it:
    # each one arrives when all its threads are done (barrier, then an acq_rel atomic), and
    # the last to arrive moves the count and resets the arrivals for the next launch.
    tl.debug_barrier()
    arrived = tl.atomic_add(counts_ptr + 4, 1)
    last = arrived == n_programs - 1
    tl.store(counts_ptr + 2, offset + t, mask=last)
    tl.store(counts_ptr + 4, 0, mask=last)


def append_rows(
    k: torch.Tensor,
    v: torch.Tensor,
    res_k: torch.Tensor,
    res_v: torch.Tensor,
    counts: torch.Tensor,
    old: tuple[torch.Tensor, torch.Tensor, int] | None = None,
) -> None:
    """Write k, v [B, H_kv, t, d] into the residual buffers res_k, res_v [B, H_kv, rows, d]
    (contiguous) at row counts[2], then add t to counts[2].

    counts: int32 [5] on the kernels' device, (n_sink, n_quantized, n_residual, n_value_quantized,
    arrivals); arrivals is 0 between launches. old: (old_k, old_v, n) when res_k, res_v are new, larger
    buffers: the n rows held in old_k, old_v (contiguous, n == counts[2]) are copied first.
    """
    b, h, t, d = k.shape
    if not (res_k.is_contiguous() and res_v.is_contiguous()):
        raise ValueError("residual buffers must be contiguous")
    old_k, old_v, n_old = old if old is not None else (res_k, res_v, 0)
    n, block_t, block_d = b * h, min(triton.next_power_of_2(t), 16), triton.next_power_of_2(d)
    _runtime.launch(
        _append_rows_kernel,
        (n,),
        k,
        v,
        old_k,
        old_v,
        res_k,
        res_v,
        counts,
        t,
        n_old,
        res_k.shape[2],
        h,
        d,
        n,
        *k.stride(),
        *v.stride(),
        old_k.stride(1),
        res_k.stride(1),
        COPY_OLD=n_old > 0,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        num_warps=1 if block_t * block_d <= 256 else 4,
    )
