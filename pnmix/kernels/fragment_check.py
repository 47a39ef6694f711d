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

from pnmix.kernels import attention, fragment, fragment_decode

#: What `decide` keeps per device: (path, why); path is "ptx", "plain" or "off".
_decisions: dict[str, tuple[str, str]] = {}
#: The self-test's heads: tiles (two key groups per split), splits, real query rows (GQA 4), exact tokens (a sink
#: tile and a residual of a tile and a part).
SELF_TEST = {"heads": 2, "tiles": 8, "splits": 2, "rows": 4, "seed": 0, "sinks": 32, "residual": 100}
#: A launcher returns the partials (m, l, acc) and, where it merges them itself, the merged output.
Launcher = Callable[[dict, float, int, bool], tuple[torch.Tensor, ...]]


def synthetic(
    tiles: int,
    seed: int,
    rows: int = 4,
    heads: int = 1,
    sinks: int = 0,
    residual: int = 0,
    dtype: torch.dtype = torch.float16,
) -> tuple[dict, list]:
    """`heads` KV heads' fragment-order tiles, scales, exact regions and queries, stacked: q [heads, rows, 128] (the
    query rows of one KV head), idx [heads, 64] (salient channels, ascending), words [heads, tiles, 4, 32, 8]
    (`fragment.pack`), ks/kz [heads, groups, 128], vs/vz [heads, tiles * 64], sk/sv [heads, sinks, 128] and rk/rv
    [heads, residual, 128] (keys and values of the exact regions; they and q in `dtype`, float16 or bfloat16, the
    scales float16 as a cache stores them); and per head its planes (low, high, values, salient channels) for
    `reference`."""
    g = torch.Generator().manual_seed(seed)
    groups = -(-tiles * fragment.TILE // fragment_decode.GROUP)
    n = tiles * fragment.TILE
    slices = tiles * fragment.WARPS
    parts, planes = [], []
    for _ in range(heads):
        low = torch.randint(0, 2, (slices, 128, 16), generator=g)
        high = torch.randint(0, 4, (slices, 64, 16), generator=g)
        values = torch.randint(0, 4, (slices, 16, 128), generator=g)
        channel = torch.randperm(128, generator=g)[:64].sort().values
        parts.append(
            {
                "q": torch.randn(rows, 128, generator=g).to(dtype),
                "idx": channel.to(torch.int32),
                "words": fragment.pack(low, high, values),
                "ks": (torch.rand(groups, 128, generator=g) * 0.5 + 0.05).to(torch.float16),
                "kz": (torch.randn(groups, 128, generator=g) * 0.3).to(torch.float16),
                "vs": (torch.rand(n, generator=g) * 0.5 + 0.05).to(torch.float16),
                "vz": (torch.randn(n, generator=g) * 0.3).to(torch.float16),
                **{
                    name: (torch.randn(count, 128, generator=g) * scale).to(dtype)
                    for name, count, scale in (
                        ("sk", sinks, 1.5),
                        ("sv", sinks, 1),
                        ("rk", residual, 1.5),
                        ("rv", residual, 1),
                    )
                },
            }
        )
        planes.append((low, high, values, channel))
    return {name: torch.stack([p[name] for p in parts]) for name in parts[0]}, planes


#: The exact regions' tensors of `synthetic`, in the order `fragment_decode.twin` takes them (its `exact`).
EXACT = ("sk", "sv", "rk", "rv")


def head(args: dict, h: int) -> dict:
    """Head h of stacked arguments (`synthetic`), as `fragment_decode.twin` takes them."""
    return {name: t[h] for name, t in args.items() if name not in EXACT} | {"exact": tuple(args[n][h] for n in EXACT)}


def reference(args: dict, planes, qk_scale: float, dtype: torch.dtype) -> torch.Tensor:
    """One head's attention over its dequantized tokens computed in `dtype`, [rows, 128] (args: `head`'s; token order
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
    khs = 2 * args["ks"][:, channel].to(dtype)
    k[:, channel] += khs[groups] * torch.cat([high[s].T for s in range(high.shape[0])]).to(dtype)
    v = args["vs"].to(dtype)[:, None] * torch.cat(list(values.to(dtype))) + args["vz"].to(dtype)[:, None]
    sk, sv, rk, rv = args["exact"]
    k = torch.cat([sk.to(dtype), k, rk.to(dtype)])
    v = torch.cat([sv.to(dtype), v, rv.to(dtype)])
    p = torch.softmax(args["q"].to(dtype) @ k.T * qk_scale * math.log(2), dim=-1)
    return p @ v


def planes_of(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stacked fragment-order words [heads, tiles, 4, 32, 8] as a cache holds them: the key low plane, the key high
    plane and the values, each int32 [heads, tiles * 4 * 32 * its words per lane]."""
    heads = words.shape[0]
    return tuple(words[..., a:b].contiguous().view(heads, -1) for a, b in ((0, 2), (2, 4), (4, 8)))


def launch(args: dict, qk_scale: float, n_splits: int, use_ptx: bool = True):
    """The loop launched on a CUDA device over stacked heads (`synthetic`'s layout), its planes and scales held as a
    cache holds them, in both forms the package launches: leaving its splits to the merge kernel, whose partials
    it returns (per head and split the log2-domain max m, the sum l and the unnormalized output acc, [heads, splits
    (`fragment_decode.split_plan`), rows(, 128)]), and merging them itself, whose output it returns ([heads, rows,
    128] in q's dtype). While launches are recorded (`pnmix._runtime.recording`, the gate) they are recorded, not
    run, and the outputs are left empty."""
    heads, tiles = args["words"].shape[:2]
    rows = args["q"].shape[1]
    dev = args["q"].device
    lo, hi, vp = planes_of(args["words"])
    sinks, residual = args["sk"].shape[1], args["rk"].shape[1]
    counts = torch.tensor([sinks, tiles * fragment.TILE, residual, 0], dtype=torch.int32, device=dev)
    # the package's plan on the device (the gate records it for its target GPU)
    quantized, exact_split, total = fragment_decode.plan(n_splits, heads)
    scales = tuple(args[name].contiguous() for name in ("ks", "kz", "vs", "vz"))
    exact = tuple(args[name].contiguous() for name in EXACT)
    merged = torch.empty(heads * rows, 128, dtype=args["q"].dtype, device=dev)
    semaphores = torch.zeros(heads, dtype=torch.int32, device=dev)
    q, idx = args["q"].contiguous(), args["idx"].contiguous()
    m, l, acc = out = attention.partials(heads * total * rows, 128, dev)  # noqa: E741 (the paper's l)
    fragment_decode.launch_split(
        q, idx, (lo, hi, vp), scales, exact, counts, out, heads, rows, quantized, exact_split, total, 0, qk_scale,
        use_ptx,
    )  # fmt: skip
    fragment_decode.launch_split(
        q, idx, (lo, hi, vp), scales, exact, counts, attention.partials(heads * total * rows, 128, dev), heads, rows,
        quantized, exact_split, total, 0, qk_scale, use_ptx, merged, semaphores,
    )  # fmt: skip
    partials = m.view(heads, total, rows), l.view(heads, total, rows), acc.view(heads, total, rows, 128)
    return (*partials, merged.view(heads, rows, 128))


def judge(
    launcher: Launcher, device: torch.device, use_ptx: bool, dtype: torch.dtype = torch.float16
) -> tuple[bool, str]:
    """The self-test of one path: (passed, what was found), the launcher's merged output of `SELF_TEST`'s heads (q
    and exact regions in `dtype`) on `device` against float64 attention, within twice float32 attention's error."""
    case = SELF_TEST
    args, planes = synthetic(
        case["tiles"], case["seed"], case["rows"], case["heads"], case["sinks"], case["residual"], dtype
    )
    qk_scale = 1 / math.sqrt(128) / math.log(2)
    try:
        m, total, acc, *merged = launcher({k: v.to(device) for k, v in args.items()}, qk_scale, case["splits"], use_ptx)
    except Exception as exc:  # a kernel that does not compile or launch here fails its self-test, named
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    worst = 0.0
    for h in range(case["heads"]):
        exact = reference(head(args, h), planes[h], qk_scale, torch.float64)
        single = reference(head(args, h), planes[h], qk_scale, torch.float32).double()
        bound = 2 * float((single - exact).abs().max())
        # the partials merged here, and the loop's own merge where it made one (in q's dtype: its rounding too)
        outs = {"its splits": fragment_decode.merge(m[h].cpu(), total[h].cpu(), acc[h].cpu())[: case["rows"]]}
        if merged:
            outs["its merge"] = merged[0][h].cpu()
            bound += float((exact.to(merged[0].dtype).double() - exact).abs().max())
        for what, out in outs.items():
            err = float((out.double() - exact).abs().max())
            if not err <= bound:  # NaN fails too
                return False, f"head {h}, {what}: error {err:.3g} against float64 attention, above {bound:.3g}"
            worst = max(worst, err / bound)
    return True, f"within the bound (worst error {worst:.2f} of it)"


def device_key(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


def decide(
    device: torch.device | str, dtype: torch.dtype = torch.float16, launcher: Launcher | None = None
) -> tuple[str, str]:
    """Which path of the loop `device` takes for queries of `dtype` (float16 or bfloat16), "ptx", "plain" or "off",
    and why: decided once per device and dtype by the self-test (module docstring); `launcher` (default: `launch`,
    CUDA only) lets a CPU test judge any fast path."""
    device = torch.device(device)
    key = f"{device_key(device)}, {str(dtype).removeprefix('torch.')}"
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
    ptx_ok, ptx_why = judge(launcher, device, True, dtype)
    if ptx_ok:
        decision = ("ptx", f"self-test passed with the inline-PTX unpack: {ptx_why}")
    else:
        plain_ok, plain_why = judge(launcher, device, False, dtype)
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
