"""The fragment-order decode loop (design stage; pnmix/kernels/NOTES.md, "Codes in fragment order"): the quantized
region's loop of the default configuration in Gluon, and its CPU twin.

What it is for now: the kernel the gate compiles and predicts (`python -m pnmix.aot`, section "Fragment-order
loop"), to judge the design by its prediction before the cache stores its pages in this order. It is not launched by
the package: the cache still writes the spec's order, which the Triton kernel (`pnmix.kernels.attention`) reads.
What it does not yet do, and the package's kernel does: the exact regions (sinks, residual), the headroom exponents
that keep q s inside float16's range for any scale (its operands are otherwise the package's, at float32 grade:
exact low-plane products, hi + lo pairs for q s and p s), bfloat16, other head sizes and methods.

The structure (the anchors': BitDecoding, Marlin). A program is one (sequence, KV head) and split; its four warps each
own 16 tokens of a 64-token tile and keep their own softmax state, merged once per split, so no tile reduces across
warps. Each lane reads its 8 words of the tile (`pnmix.kernels.fragment`) from a ring of `STAGES` tiles that
cp.async fills `STAGES - 1` tiles ahead, and unpacks them with shifts and masks straight into its MMA operand
registers: every layout conversion on the way is checked trivial at compile time (`assert_trivial`), so no code
passes through shared memory after its copy (the 2-bit codes two at a time by inline PTX, `ptx.fragment_pair`, or
plainly with PTX off). The logits' accumulator layout is the probabilities' operand layout
(also checked), the queries are loaded once into their operand layout, and a key group's operands (its scales,
q . z, q s) once for its two tiles: one trip of the loop is a key group.

`twin` computes what the kernel computes, in torch on a CPU, from the same words and scales: the unpack by
`fragment.unpack` (the kernel's own joins and permutations), the operands rounded where the kernel rounds them, the
per-warp online softmax and the warps' merge.
"""

from __future__ import annotations

import math

import torch

from pnmix import _runtime, sass
from pnmix.kernels import fragment, ptx

#: Ring depth of the copy pipeline (tiles in flight: STAGES - 1 ahead of the one computed).
STAGES = 3
QUERY_ROWS = 16  # the MMA's m: query rows of one KV head (GQA x new tokens), zero-padded
BLOCK_N = fragment.TILE
GROUP = 128  # key group (tokens per scale row); two tiles
#: Tokens of one trip of the kernel's loop (a key group: its operands are prepared once for its two tiles).
TOKENS_PER_ITERATION = GROUP


# Gluon kernels are only decorated here (as under the Triton interpreter); they are compiled ahead of time by
# `compile_for`, never launched by the package yet.
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2  # noqa: E402

_sync_threads = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier  # triton 3.7 / 3.6
_PAIR_2 = gl.constexpr(ptx.fragment_pair(2))
_PAIR_CONSTRAINTS = gl.constexpr(ptx.PAIR_CONSTRAINTS)


@gluon.jit
def _halves(x, shift: gl.constexpr, mask: gl.constexpr):
    return gl.join((x >> shift) & mask, (x >> (shift + 16)) & mask)


@gluon.jit
def _eight(x, step: gl.constexpr, mask: gl.constexpr, first: gl.constexpr):
    return gl.join(
        gl.join(
            gl.join(_halves(x, first, mask), _halves(x, first + step, mask)),
            gl.join(_halves(x, first + 2 * step, mask), _halves(x, first + 3 * step, mask)),
        ),
        gl.join(
            gl.join(_halves(x, first + 4 * step, mask), _halves(x, first + 5 * step, mask)),
            gl.join(_halves(x, first + 6 * step, mask), _halves(x, first + 7 * step, mask)),
        ),
    )


@gluon.jit
def _pair(x, shift: gl.constexpr):
    """The 2-bit codes at `shift` and `shift + 16` of each word as float16, joined on a new minor axis: one inline-PTX
    call per pair (`ptx.fragment_pair`, 1.5 instructions per code; `_halves` and `_f16` compute the same codes)."""
    a = gl.join(x, x)
    return gl.inline_asm_elementwise(
        _PAIR_2, _PAIR_CONSTRAINTS, [a, gl.zeros_like(a) + shift], dtype=gl.float16, is_pure=True, pack=2
    )


@gluon.jit
def _eight_f16(x):
    """`_eight(x, 2, 3, 0)` as float16 numbers, by `_pair`."""
    return gl.join(
        gl.join(gl.join(_pair(x, 0), _pair(x, 2)), gl.join(_pair(x, 4), _pair(x, 6))),
        gl.join(gl.join(_pair(x, 8), _pair(x, 10)), gl.join(_pair(x, 12), _pair(x, 14))),
    )


@gluon.jit
def _low(x, W: gl.constexpr):
    """[W, 32, 2] words -> [W, 128 channels, 16 tokens] 1-bit codes (`fragment.unpack`'s low plane)."""
    t = gl.join(_eight(x, 1, 1, 0), _eight(x, 1, 1, 8))
    t = gl.permute(gl.reshape(t, [W, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]), [0, 11, 10, 9, 8, 4, 5, 7, 6, 1, 2, 3])
    return gl.reshape(t, [W, 128, 16])


@gluon.jit
def _two_bit(x, PTX: gl.constexpr):
    """The 16 two-bit codes of each word as float16, [..., h, i0, i1, i2] (by inline PTX, or plainly)."""
    if PTX:
        return _eight_f16(x)
    else:
        return _f16(_eight(x, 2, 3, 0))


@gluon.jit
def _high(x, W: gl.constexpr, PTX: gl.constexpr):
    """[W, 32, 2] words -> [W, 64 salient channels, 16 tokens] float16 codes (`fragment.unpack`'s high plane)."""
    t = gl.permute(gl.reshape(_two_bit(x, PTX), [W, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]), [0, 10, 9, 8, 4, 5, 7, 6, 1, 2, 3])
    return gl.reshape(t, [W, 64, 16])


@gluon.jit
def _values(x, W: gl.constexpr, PTX: gl.constexpr):
    """[W, 32, 4] words -> [W, 16 tokens, 128 channels] float16 codes (`fragment.unpack`'s values)."""
    t = gl.reshape(_two_bit(x, PTX), [W, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
    t = gl.permute(t, [0, 9, 4, 5, 8, 6, 7, 11, 10, 1, 2, 3])
    return gl.reshape(t, [W, 16, 128])


@gluon.jit
def _f16(c):
    # under the exponent of 1024: 1024 + code, exactly, then 1024 subtracted
    return (c | 0x6400).to(gl.int16).to(gl.float16, bitcast=True) - 1024.0


@gluon.jit
def _r3(n: gl.constexpr, dim: gl.constexpr, layout: gl.constexpr):
    if dim == 0:
        return gl.arange(0, n, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))[:, None, None]
    elif dim == 1:
        return gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))[None, :, None]
    else:
        return gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))[None, None, :]


@gluon.jit
def _issue(stage, tile, src, bufs, offs, W: gl.constexpr, BLOCK: gl.constexpr):
    """Copy tile `tile` of one head (its words and scales; src: the head's tensors) into ring stage `stage`."""
    group = tile * BLOCK // 128
    async_copy.async_copy_global_to_shared(bufs[0].index(stage), src[0] + tile * (W * 32 * 8) + offs[0])
    async_copy.async_copy_global_to_shared(bufs[1].index(stage), src[1] + group * 128 + offs[1])
    async_copy.async_copy_global_to_shared(bufs[2].index(stage), src[2] + group * 128 + offs[1])
    async_copy.async_copy_global_to_shared(bufs[3].index(stage), src[3] + group * 64 + offs[2])
    async_copy.async_copy_global_to_shared(bufs[4].index(stage), src[4] + tile * BLOCK + offs[3])
    async_copy.async_copy_global_to_shared(bufs[5].index(stage), src[5] + tile * BLOCK + offs[3])
    async_copy.commit_group()


@gluon.jit
def fragment_split_kernel(
    q_ptr,
    qh_ptr,
    words,
    ks,
    kz,
    khs,
    vs,
    vz,
    m_ptr,
    l_ptr,
    acc_ptr,
    tiles,
    groups,
    n_splits,
    qk_scale,
    W: gl.constexpr,
    STAGES: gl.constexpr,
    PTX: gl.constexpr,
):
    """Partial attention of one (sequence, KV head) over one split of its quantized tiles (module docstring).
    q: [16, 128] rows; qh: the salient channels' queries [16, 64]; words: [tiles, W, 32, 8] per head; ks, kz:
    each group's key scales and zeros [groups, 128]; khs: the high plane's scales (2 s of the salient channels)
    [groups, 64]; vs, vz: the values' per-token scales and zeros."""
    BLOCK: gl.constexpr = W * 16
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8])
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    B: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    WL: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32, 1], [W, 1, 1], [2, 1, 0])
    S3: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 1, [2, 1, 0])
    S2: gl.constexpr = gl.SwizzledSharedLayout(2, 1, 1, [1, 0])
    L2: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [1, W], [1, 0])
    LV: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [1, W], [1, 0])
    bh = gl.program_id(0)
    split = gl.program_id(1)
    rows = _r3(16, 1, A)
    q = gl.load(q_ptr + bh * 16 * 128 + rows * 128 + _r3(128, 2, A) + _r3(W, 0, A) * 0)
    qh = gl.load(qh_ptr + bh * 16 * 64 + rows * 64 + _r3(64, 2, A) + _r3(W, 0, A) * 0)
    wbuf = gl.allocate_shared_memory(gl.int32, [STAGES, W, 32, 8], S3)
    sbuf = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 128], S2)
    zbuf = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 128], S2)
    hbuf = gl.allocate_shared_memory(gl.float16, [STAGES, 1, 64], S2)
    svbuf = gl.allocate_shared_memory(gl.float16, [STAGES, W, 16], S2)
    zvbuf = gl.allocate_shared_memory(gl.float16, [STAGES, W, 16], S2)
    w_off = (
        gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, WL)))[:, None, None] * 256
        + gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, WL)))[None, :, None] * 8
        + gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, WL)))[None, None, :]
    )
    s_off = (
        gl.arange(0, 1, layout=gl.SliceLayout(1, L2))[:, None]
        + gl.arange(0, 128, layout=gl.SliceLayout(0, L2))[None, :]
    )
    h_off = (
        gl.arange(0, 1, layout=gl.SliceLayout(1, L2))[:, None] + gl.arange(0, 64, layout=gl.SliceLayout(0, L2))[None, :]
    )
    v_off = (
        gl.arange(0, W, layout=gl.SliceLayout(1, LV))[:, None] * 16
        + gl.arange(0, 16, layout=gl.SliceLayout(0, LV))[None, :]
    )
    m_i = gl.full([W, 16], float("-inf"), gl.float32, layout=gl.SliceLayout(2, mma))
    l_i = gl.zeros([W, 16], gl.float32, layout=gl.SliceLayout(2, mma))
    z_i = gl.zeros([W, 16], gl.float32, layout=gl.SliceLayout(2, A))
    acc = gl.zeros([W, 16, 128], gl.float32, layout=mma)
    # the split's whole key groups (two tiles each; the package's split rule, in groups)
    size = gl.cdiv(groups, n_splits)
    glo = split * size
    ghi = gl.minimum(glo + size, groups)
    lo, hi = 2 * glo, 2 * ghi
    src = (
        words + bh * tiles * (W * 32 * 8),
        ks + bh * groups * 128,
        kz + bh * groups * 128,
        khs + bh * groups * 64,
        vs + bh * tiles * BLOCK,
        vz + bh * tiles * BLOCK,
    )
    bufs = (wbuf, sbuf, zbuf, hbuf, svbuf, zvbuf)
    offs = (w_off, s_off, h_off, v_off)
    for i in gl.static_range(STAGES - 1):
        # past the split's end: its last tile again, in bounds (never used)
        _issue(i, gl.maximum(gl.minimum(lo + i, hi - 1), 0), src, bufs, offs, W, BLOCK)
    it = 0
    for g in range(glo, ghi):
        for j in gl.static_range(2):  # the group's two tiles
            stage = it % STAGES
            async_copy.wait_group(STAGES - 2)
            _sync_threads()  # every lane's copies of this stage landed; every lane done with the stage refilled next
            _issue((it + STAGES - 1) % STAGES, gl.minimum(2 * g + j + STAGES - 1, hi - 1), src, bufs, offs, W, BLOCK)
            if j == 0:
                # the group's operands, once for its two tiles: the low plane's scales as the MMA's B operand (exact
                # products with q as given), the zeros' term q . z in float32, the high plane's q s as hi + lo
                s = sbuf.index(stage).load(gl.SliceLayout(2, B))[:, :, None]
                z = zbuf.index(stage).load(gl.SliceLayout(1, A))[:, None, :].to(gl.float32)
                qz = gl.convert_layout(gl.sum(q.to(gl.float32) * z, axis=2), gl.SliceLayout(2, mma))[:, :, None]
                qs = qh.to(gl.float32) * hbuf.index(stage).load(gl.SliceLayout(1, A))[:, None, :].to(gl.float32)
                qs_hi = qs.to(gl.float16)
                qs_lo = (qs - qs_hi.to(gl.float32)).to(gl.float16)
            x = wbuf.index(stage).load(WL)  # this lane's 8 words
            kw, vw = gl.split(gl.permute(gl.reshape(x, [W, 32, 2, 4]), [0, 1, 3, 2]))
            lw, hw = gl.split(gl.permute(gl.reshape(kw, [W, 32, 2, 2]), [0, 1, 3, 2]))
            bits = gl.convert_layout(_low(lw, W), B, assert_trivial=True)
            logits = mma_v2(q, gl.where(bits != 0, s, 0.0), gl.zeros([W, 16, 16], gl.float32, layout=mma)) + qz
            high = gl.convert_layout(_high(hw, W, PTX), B, assert_trivial=True)
            logits = mma_v2(qs_lo, high, mma_v2(qs_hi, high, logits)) * qk_scale
            m_new = gl.maximum(m_i, gl.max(logits, axis=2))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(logits - m_new[:, :, None])
            l_i = l_i * alpha + gl.sum(p, axis=2)
            m_i = m_new
            pa = gl.convert_layout(p, A, assert_trivial=True)
            sv = svbuf.index(stage).load(gl.SliceLayout(1, A))[:, None, :].to(gl.float32)
            zv = zvbuf.index(stage).load(gl.SliceLayout(1, A))[:, None, :].to(gl.float32)
            vals = gl.convert_layout(_values(vw, W, PTX), B, assert_trivial=True)
            ps = pa * sv  # p s in float32 as hi + lo (p <= 1: within float16's range for a float16 scale)
            ps_hi = ps.to(gl.float16)
            acc = mma_v2(ps_hi, vals, acc * alpha[:, :, None])
            acc = mma_v2((ps - ps_hi.to(gl.float32)).to(gl.float16), vals, acc)
            # the zeros' share is the same in every channel: one number per row, added to the output once
            z_i = z_i * gl.convert_layout(alpha, z_i.type.layout) + gl.sum(pa * zv, axis=2)
            it += 1
    async_copy.wait_group(0)
    acc += gl.convert_layout(z_i, gl.SliceLayout(2, mma))[:, :, None]
    m = gl.max(m_i, axis=0)
    a = gl.where(m_i > float("-inf"), gl.exp2(m_i - m[None, :]), 0.0)  # a warp without tokens weighs nothing
    total = gl.sum(l_i * a, axis=0)
    o = gl.sum(acc * a[:, :, None], axis=0)
    out = bh * n_splits + split
    r = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, mma)))
    gl.store(m_ptr + out * 16 + gl.convert_layout(r, m.type.layout), m)
    gl.store(l_ptr + out * 16 + gl.convert_layout(r, total.type.layout), total)
    orow = gl.arange(0, 16, layout=gl.SliceLayout(1, o.type.layout))[:, None]
    ocol = gl.arange(0, 128, layout=gl.SliceLayout(0, o.type.layout))[None, :]
    gl.store(acc_ptr + (out * 16 + orow) * 128 + ocol, o)


def compile_for(arch: int, use_ptx: bool = True):
    """The kernel compiled ahead of time for sm_`arch` (no GPU needed: triton's ptxas) exactly as
    `fragment_check.launch` launches it (its launch recorded, then compiled as the JIT would on such a device), as
    `triton.compile` returns it."""
    from pnmix import aot  # deferred: aot imports this module (its gate compiles the loop)
    from pnmix.kernels import fragment_check  # deferred: fragment_check imports this module (it launches the loop)

    if _runtime.INTERPRETED:
        raise RuntimeError(
            "compile_for needs compiled kernels (triton's own jit functions are interpreted here): run with "
            "TRITON_INTERPRET=0, as `python -m pnmix.aot` does"
        )
    # specialized as a long context is: tiles and groups multiples of 16, splits neither 1 nor a multiple of 16
    args, _ = fragment_check.synthetic(tiles=32, seed=0)
    gpu = next(g for g in aot.GPUS if g.arch == arch)
    with _runtime.recording(_runtime.Target(arch, gpu.sms)) as launches:
        fragment_check.launch(args, 1.0, 3, use_ptx)
    (launch,) = launches
    return aot._compile(launch, arch)


def resources(compiled) -> dict:
    """Registers, local (spilled) bytes and shared memory of a compiled kernel, and its SASS with control codes."""
    registers, local_bytes = sass.registers_and_local_bytes(compiled.asm["cubin"])
    return {
        "registers": registers,
        "local_bytes": local_bytes,
        "shared_bytes": int(compiled.metadata.shared),
        "encoded": sass.disassemble(compiled.asm["cubin"], encoding=True),
    }


# --- the CPU twin ------------------------------------------------------------------------------------------------


def twin(
    q: torch.Tensor,
    qh: torch.Tensor,
    words: torch.Tensor,
    ks: torch.Tensor,
    kz: torch.Tensor,
    khs: torch.Tensor,
    vs: torch.Tensor,
    vz: torch.Tensor,
    qk_scale: float,
    n_splits: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the kernel computes for one (sequence, KV head), on a CPU: per split, the log2-domain running max m
    [16], the sum l [16] and the unnormalized output acc [16, 128] (o = acc / l). Shapes as the kernel's arguments for
    one head (q [16, 128], qh [16, 64], words [tiles, 4, 32, 8], ks/kz [groups, 128], khs [groups, 64], vs/vz [tiles
    * 64]); float16 operands rounded where the kernel rounds them, float32 accumulation."""
    f32, f16 = torch.float32, torch.float16
    low, high, values = fragment.unpack(words)
    tiles, w = words.shape[0], fragment.WARPS
    groups = ks.shape[0]
    size = -(-groups // n_splits)  # whole key groups per split, as the kernel
    ms, ls, accs = [], [], []
    for split in range(n_splits):
        lo, hi = 2 * split * size, min(2 * (split * size + size), tiles)
        m_i = torch.full((w, 16), -math.inf)
        l_i = torch.zeros(w, 16)
        z_i = torch.zeros(w, 16)
        acc = torch.zeros(w, 16, 128)
        for tile in range(lo, hi):
            g = tile * BLOCK_N // GROUP
            sl = slice(tile * w, tile * w + w)
            s, z = ks[g].to(f32), kz[g].to(f32)
            kop = torch.where(low[sl] != 0, s[:, None], torch.zeros(()))  # [w, 128, 16]: exact products with q
            logits = q.to(f32) @ kop + (q.to(f32) * z).sum(-1)[:, None]
            qs = qh.to(f32) * khs[g].to(f32)
            qs_hi = qs.to(f16).to(f32)
            codes = high[sl].to(f32)
            logits = (logits + qs_hi @ codes + (qs - qs_hi).to(f16).to(f32) @ codes) * qk_scale
            m_new = torch.maximum(m_i, logits.amax(-1))
            alpha = torch.exp2(m_i - m_new)
            p = torch.exp2(logits - m_new[..., None])
            l_i = l_i * alpha + p.sum(-1)
            m_i = m_new
            tok = torch.arange(tile * BLOCK_N, tile * BLOCK_N + BLOCK_N).view(w, 1, 16)
            sv, zv = vs[tok].to(f32), vz[tok].to(f32)
            ps = p * sv
            ps_hi = ps.to(f16).to(f32)
            codes = values[sl].to(f32)
            acc = acc * alpha[..., None] + ps_hi @ codes + (ps - ps_hi).to(f16).to(f32) @ codes
            z_i = z_i * alpha + (p * zv).sum(-1)
        acc = acc + z_i[..., None]
        m = m_i.amax(0)
        a = torch.where(torch.isfinite(m_i), torch.exp2(m_i - m), torch.zeros_like(m_i))
        ms.append(m)
        ls.append((l_i * a).sum(0))
        accs.append((acc * a[..., None]).sum(0))
    return torch.stack(ms), torch.stack(ls), torch.stack(accs)


def merge(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:  # noqa: E741 (the paper's l)
    """The splits' partial results (`twin`'s, log2 domain: m [splits, rows], l [splits, rows], acc [splits, rows,
    d]) merged into the attention output [rows, d]; splits without tokens (m = -inf) weigh nothing."""
    top = m.amax(0)
    weight = torch.where(torch.isfinite(m), torch.exp2(m - top), torch.zeros_like(m))
    return (acc * weight[..., None]).sum(0) / (l * weight).sum(0)[..., None]
