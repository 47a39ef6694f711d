"""The fragment-order loop's launch and its first-use self-test per device (pnmix/kernels/NOTES.md, "Codes in
fragment order").

The Triton interpreter cannot run a Gluon kernel, so the loop (`fragment_decode.fragment_split_kernel`) is judged
on a device before anything takes it: `decide(device)` launches it on a fixed synthetic head (`synthetic`), merges
its splits and judges the output against float64 attention over the same dequantized tokens (`reference`) by the
rule the CPU tests apply to its twin: an error within twice that of the same attention computed in float32. With
the inline-PTX pair unpack first; if that disagrees, the plain unpack; if that disagrees too (or the device is not a
CUDA device of compute capability 8.0 or more), the loop is off there. A path given up is named in exactly one
warning with what differed; each device's decision is kept for the process. The judging logic runs on a CPU with
any launcher (`decide(device, launcher=...)`), which is how the tests check it with a deliberately wrong fast path.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

from pnmix import _runtime
from pnmix.kernels import fragment, fragment_decode

#: What `decide` keeps per device: (path, why); path is "ptx", "plain" or "off".
_decisions: dict[str, tuple[str, str]] = {}
#: The self-test's head: tiles (two key groups per split), splits, real query rows (GQA 4).
SELF_TEST = {"heads": 2, "tiles": 8, "splits": 2, "rows": 4, "seed": 0}
Launcher = Callable[[dict, float, int, bool], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def synthetic(tiles: int, seed: int, rows: int = 4, heads: int = 1) -> tuple[dict, list]:
    """`heads` KV heads' fragment-order tiles, scales and queries (rows real rows of 16), stacked as the kernel reads
    them (q [heads, 16, 128], words [heads, tiles, 4, 32, 8], ks/kz [heads, groups, 128], khs [heads, groups, 64],
    vs/vz [heads, tiles * 64]); and per head its planes (low, high, values, salient channels) for `reference`."""
    g = torch.Generator().manual_seed(seed)
    groups = -(-tiles * fragment.TILE // fragment_decode.GROUP)
    n = tiles * fragment.TILE
    slices = tiles * fragment.WARPS
    parts, planes = [], []
    for _ in range(heads):
        low = torch.randint(0, 2, (slices, 128, 16), generator=g)
        high = torch.randint(0, 4, (slices, 64, 16), generator=g)
        values = torch.randint(0, 4, (slices, 16, 128), generator=g)
        q = torch.zeros(16, 128, dtype=torch.float16)
        q[:rows] = torch.randn(rows, 128, generator=g).to(torch.float16)
        channel = torch.randperm(128, generator=g)[:64]
        ks = (torch.rand(groups, 128, generator=g) * 0.5 + 0.05).to(torch.float16)
        parts.append(
            {
                "q": q,
                "qh": q[:, channel].contiguous(),
                "words": fragment.pack(low, high, values),
                "ks": ks,
                "kz": (torch.randn(groups, 128, generator=g) * 0.3).to(torch.float16),
                "khs": (2 * ks[:, channel].float()).to(torch.float16),
                "vs": (torch.rand(n, generator=g) * 0.5 + 0.05).to(torch.float16),
                "vz": (torch.randn(n, generator=g) * 0.3).to(torch.float16),
            }
        )
        planes.append((low, high, values, channel))
    return {name: torch.stack([p[name] for p in parts]) for name in parts[0]}, planes


def head(args: dict, h: int) -> dict:
    """Head h of stacked arguments (`synthetic`), as `fragment_decode.twin` takes them."""
    return {name: t[h] for name, t in args.items()}


def reference(args: dict, planes, qk_scale: float, dtype: torch.dtype) -> torch.Tensor:
    """One head's attention over its dequantized tokens computed in `dtype`, [16, 128] (args: `head`'s; token order
    as stored, warp slices of 16 per tile): keys s lo + 2 s hi (salient channels) + z, values s v + z per the
    groups; q . k times qk_scale is the log2-domain logit, as in the kernel."""
    low, high, values, channel = planes
    keys = [
        (args["ks"][s * 16 // fragment_decode.GROUP].to(dtype)[:, None] * low[s].to(dtype)
         + args["kz"][s * 16 // fragment_decode.GROUP].to(dtype)[:, None]).T
        for s in range(low.shape[0])
    ]  # fmt: skip
    k = torch.cat(keys)
    groups = torch.arange(k.shape[0]) // fragment_decode.GROUP
    k[:, channel] += args["khs"][groups].to(dtype) * torch.cat([high[s].T for s in range(high.shape[0])]).to(dtype)
    p = torch.softmax(args["q"].to(dtype) @ k.T * qk_scale * math.log(2), dim=-1)
    v = args["vs"].to(dtype)[:, None] * torch.cat(list(values.to(dtype))) + args["vz"].to(dtype)[:, None]
    return p @ v


def launch(args: dict, qk_scale: float, n_splits: int, use_ptx: bool = True):
    """The loop launched on a CUDA device over stacked heads (`synthetic`'s layout): per head and split the
    log2-domain max m, the sum l and the unnormalized output acc, [heads, splits, 16(, 128)]. While launches are
    recorded (`pnmix._runtime.recording`, the gate) it is recorded, not run, and its outputs are left empty."""
    heads, tiles = args["words"].shape[:2]
    groups = args["ks"].shape[1]
    dev = args["q"].device
    m = torch.empty(heads * n_splits, 16, device=dev)
    l = torch.empty(heads * n_splits, 16, device=dev)  # noqa: E741 (the paper's l)
    acc = torch.empty(heads * n_splits, 16, 128, device=dev)
    _runtime.launch(
        fragment_decode.fragment_split_kernel,
        (heads, n_splits),
        *(args[name].contiguous() for name in ("q", "qh", "words", "ks", "kz", "khs", "vs", "vz")),
        m, l, acc, tiles, groups, n_splits, qk_scale,
        num_warps=fragment.WARPS, W=fragment.WARPS, STAGES=fragment_decode.STAGES, PTX=use_ptx,
    )  # fmt: skip
    return m.view(heads, n_splits, 16), l.view(heads, n_splits, 16), acc.view(heads, n_splits, 16, 128)


def judge(launcher: Launcher, device: torch.device, use_ptx: bool) -> tuple[bool, str]:
    """The self-test of one path: (passed, what was found), the launcher's merged output of `SELF_TEST`'s heads on
    `device` against float64 attention, within twice float32 attention's error."""
    case = SELF_TEST
    args, planes = synthetic(case["tiles"], case["seed"], case["rows"], case["heads"])
    qk_scale = 1 / math.sqrt(128) / math.log(2)
    try:
        m, total, acc = launcher({k: v.to(device) for k, v in args.items()}, qk_scale, case["splits"], use_ptx)
    except Exception as exc:  # a kernel that does not compile or launch here fails its self-test, named
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    worst = 0.0
    for h in range(case["heads"]):
        out = fragment_decode.merge(m[h].cpu(), total[h].cpu(), acc[h].cpu())[: case["rows"]].double()
        exact = reference(head(args, h), planes[h], qk_scale, torch.float64)[: case["rows"]]
        single = reference(head(args, h), planes[h], qk_scale, torch.float32)[: case["rows"]].double()
        err, bound = float((out - exact).abs().max()), 2 * float((single - exact).abs().max())
        if not err <= bound:  # NaN fails too
            return False, f"head {h}: error {err:.3g} against float64 attention, above {bound:.3g}"
        worst = max(worst, err / bound)
    return True, f"within the bound (worst error {worst:.2f} of it)"


def device_key(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


def decide(device: torch.device | str, launcher: Launcher | None = None) -> tuple[str, str]:
    """Which path of the loop `device` takes, "ptx", "plain" or "off", and why: decided once per device by the
    self-test (module docstring); `launcher` (default: `launch`, CUDA only) lets a CPU test judge any fast path."""
    device = torch.device(device)
    key = device_key(device)
    if key in _decisions:
        return _decisions[key]
    if launcher is None:
        if device.type != "cuda":
            _decisions[key] = ("off", "the fragment-order loop needs a CUDA device")
            return _decisions[key]
        major, _ = torch.cuda.get_device_capability(device)
        if major < 8:
            _decisions[key] = ("off", f"the fragment-order loop needs compute capability 8.0 or more ({key})")
            return _decisions[key]
        launcher = launch
    ptx_ok, ptx_why = judge(launcher, device, True)
    if ptx_ok:
        decision = ("ptx", f"self-test passed with the inline-PTX unpack: {ptx_why}")
    else:
        plain_ok, plain_why = judge(launcher, device, False)
        if plain_ok:
            decision = ("plain", f"the inline-PTX unpack failed its self-test ({ptx_why}); the plain one passed")
        else:
            decision = ("off", f"self-test failed with the inline-PTX unpack ({ptx_why}) and without ({plain_why})")
        warnings.warn(f"fragment-order loop on {key}: {decision[1]}", RuntimeWarning, stacklevel=2)
    _decisions[key] = decision
    return decision


def forget() -> None:
    """Drop every device's decision (tests; a process that changed its devices)."""
    _decisions.clear()
