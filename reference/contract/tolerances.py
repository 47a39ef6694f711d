"""Every tolerance of the conformance suite and the kernel tests, with its reason. Exact things
(codes, bytes, sinks, masks, scales) are compared exactly; only floating-point results get a
tolerance, and that tolerance is measured on the same inputs wherever it can be (flash-attention's policy).
"""

from __future__ import annotations

import torch

#: An implementation's attention error against the float64 oracle may be at most this multiple
#: of the error the reference makes doing the same math in the implementation's dtype
#: (flash-attention uses 2: a kernel may reorder sums, but must not be sloppier than the dtype).
ATTENTION_ERROR_FACTOR = 2.0

#: Key/value codes may differ by one only where the reference's (x - z) / s + 0.5 lies within
#: this relative distance of an integer (a rounding tie): 16 float32 ulps covers a division that
#: is not correctly rounded (GPU fast division is within 2 ulps) and a fused multiply-add.
TIE_RELATIVE = 16 * 2.0**-24

#: Saliency scores that differ by less than this relative amount may order differently in
#: another implementation (float32 means in another summation order differ by a few ulps).
SALIENCY_RELATIVE = 1e-5


def rounding_floor(oracle: torch.Tensor, dtype: torch.dtype) -> float:
    """What even an exact kernel loses by returning `dtype`: the rounding of the oracle to it,
    plus one unit in the last place of `dtype` at the output's magnitude."""
    rounding = (oracle.to(dtype).double() - oracle).abs().max().item()
    return rounding + torch.finfo(dtype).eps * oracle.abs().max().item()


def attention_bound(oracle: torch.Tensor, low_precision: torch.Tensor, dtype: torch.dtype) -> float:
    """Largest admissible max-abs error of an implementation's attention output."""
    reference_error = (low_precision.double() - oracle).abs().max().item()
    return ATTENTION_ERROR_FACTOR * reference_error + rounding_floor(oracle, dtype)


def spacing(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Distance between neighbouring `dtype` numbers at |x| (subnormals included): rounding a
    value to `dtype` moves it by at most half of this."""
    info = torch.finfo(dtype)
    return (x.abs().double() * info.eps).clamp(min=info.smallest_normal * info.eps)


def float32_slack(*magnitudes: torch.Tensor) -> torch.Tensor:
    """A few float32 roundings at the given magnitudes (encode and s * q + z run in float32)."""
    m = torch.stack([t.abs().double() for t in torch.broadcast_tensors(*magnitudes)]).amax(0)
    return 4 * 2.0**-24 * m


def quantization_bound(
    xmin: torch.Tensor, xmax: torch.Tensor, levels: torch.Tensor, scale_dtype: torch.dtype, midpoint: bool
) -> torch.Tensor:
    """Per-group bound on |x - x_hat| from the group's range and the stated numerics alone,
    whatever parameters an implementation stores (all float64, broadcast together).

    Eq. 2 (Eq. 7 for 1-bit groups when `midpoint`) puts levels half a step s/2 from any value of
    the range. Storing z and s in scale_dtype moves level k by at most spacing(z)/2 + k
    spacing(s): one spacing of s covers a scale rounded once from the exact one or computed in
    scale_dtype itself (the range rounded, then divided). A scale that underflows to 0 maps the
    group to z, within `levels` spacings of the smallest subnormal. Plus float32 slack.
    """
    span = xmax - xmin
    eq7 = (levels == 1) & midpoint
    scale = torch.where(eq7, span / 2, span / levels)
    zero = torch.where(eq7, xmin + span / 4, xmin)
    storage = spacing(zero, scale_dtype) / 2 + levels * spacing(scale, scale_dtype)
    return scale / 2 + storage + float32_slack(xmin, xmax)


def exact_ties(v: torch.Tensor) -> torch.Tensor:
    """Where (x - z) / s, computed exactly (float64 from float32-representable operands), lies
    exactly halfway between two codes: numerics rule 4 rounds these up, with no slack."""
    return (v - torch.floor(v)) == 0.5
