"""Where Triton kernels run: compiled on CUDA, under the Triton interpreter on the CPU, or not at
all while `pnmix.aot` records launches to compile them ahead of time for a GPU target.

TRITON_INTERPRET must be set before `triton.jit` decorates a kernel, and triton decorates its own
library functions (`tl.min`, ...) when it is first imported, so this module is imported before
triton itself: before any kernel module, and by the test suite's conftest before any plug-in (a
plug-in that imports transformers can import triton through torch.compile). Without CUDA it sets
TRITON_INTERPRET=1 unless the user set it; with CUDA it leaves the setting to the user (default:
compiled).
"""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from pnmix._interpret import INTERPRETED  # decided when pnmix was imported, before triton


def _late_interpreter() -> str | None:
    """Why the interpreter cannot run this process's kernels: triton was imported (its library decorated
    compiled-only) before TRITON_INTERPRET was set, e.g. by `import transformers` ahead of `import pnmix`."""
    if not INTERPRETED or "triton.language" not in sys.modules:
        return None
    from triton.runtime.interpreter import InterpretedFunction  # deferred: only where triton is imported already

    if isinstance(sys.modules["triton.language"].standard.min, InterpretedFunction):
        return None
    return (
        "triton was imported before TRITON_INTERPRET=1 was set, so its library runs compiled-only and the "
        "Triton interpreter cannot run PN-Mix's kernels in this process: import pnmix before anything that "
        "imports triton (transformers, torch.compile), or set TRITON_INTERPRET=1 in the environment"
    )


#: Said when a kernel is first given a tensor, not at import: most uses of pnmix never run a Triton kernel.
LATE_INTERPRETER = _late_interpreter()

#: The oldest triton the kernels are checked with (pyproject.toml: triton>=3.6; 3.6.0 is the GPU machines' image).
MIN_TRITON = (3, 6)


class TritonVersionError(ImportError):
    """The installed triton is older than the kernels support (`MIN_TRITON`)."""


def triton_version(text: str) -> tuple[int, int]:
    """(major, minor) of a triton version string ("3.6.0", "3.7.1+git1a2b3c"); ValueError if it has none."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"cannot read a major.minor version from triton's version {text!r}")
    return int(match[1]), int(match[2])


def require_triton() -> tuple[int, int]:
    """Check the installed triton against `MIN_TRITON` (TritonVersionError naming both versions), mend what its
    interpreter needs (`_interpreter_index`), and return its (major, minor). Run when this module is imported, before
    any kernel is defined (`pnmix.kernels` imports it first)."""
    try:
        import triton  # after TRITON_INTERPRET is decided above
    except ModuleNotFoundError:
        need = ".".join(map(str, MIN_TRITON))
        raise TritonVersionError(
            f"pnmix's Triton kernels need triton>={need}, which is not installed: pip install 'pnmix[triton]' (a "
            "CUDA build of torch brings its own triton); backend='reference' runs without it"
        ) from None

    installed = getattr(triton, "__version__", "unknown")
    try:
        version = triton_version(installed)
    except ValueError:
        version = None
    if version is None or version < MIN_TRITON:
        need = ".".join(map(str, MIN_TRITON))
        raise TritonVersionError(f"pnmix's Triton kernels need triton>={need}; installed: triton {installed}")
    if INTERPRETED and version < (3, 7):
        _interpreter_index()
    return version


def _interpreter_index() -> None:
    """Triton 3.6's interpreter turns a loop bound read from memory (a one-element array) into an int with
    int(array), which numpy 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"), so the
    decode kernel cannot run there; triton 3.7 reads it as int(array.squeeze()) (triton-lang/triton#9171), and so
    does this, in the same place: the tensor attributes the interpreter sets for each launch and restores after."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "pnmix_index", False):
        return

    def patched(tensor, scope) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched.pnmix_index = True
    interpreter._patch_lang_tensor = patched


#: The installed triton's (major, minor), checked where pnmix first imports triton (TritonVersionError if too old).
TRITON_VERSION = require_triton()


@dataclass(frozen=True)
class Target:
    """What launch choices depend on: the compute capability (80 = sm_80) and the SM count."""

    arch: int
    sms: int


@dataclass
class Launch:
    """One kernel launch as the package makes it: kernel, grid, arguments and compile options."""

    kernel: object
    grid: tuple[int, ...]
    args: tuple
    constexprs: dict
    num_warps: int
    num_stages: int
    maxnreg: int | None = None

    @property
    def name(self) -> str:
        return kernel_name(self.kernel)


def kernel_name(kernel) -> str:
    """A Triton kernel's function name."""
    return getattr(kernel, "__name__", None) or kernel.fn.__name__


@dataclass
class _Recorder:
    target: Target
    launches: list[Launch] = field(default_factory=list)


_recorder: _Recorder | None = None


@contextmanager
def recording(target: Target):
    """Record launches instead of running them (tensors stay on the CPU): what `pnmix.aot` compiles."""
    global _recorder
    if INTERPRETED:
        raise RuntimeError("recording launches needs compiled kernels: run with TRITON_INTERPRET=0")
    previous, _recorder = _recorder, _Recorder(target)
    try:
        yield _recorder.launches
    finally:
        _recorder = previous


_observers: list[list] = []


@contextmanager
def observing():
    """Collect (kernel name, what its launch returned) for every launch run within the block: on a device the
    compiled kernel (`pnmix.sass` reads its machine code), None under the interpreter. What a timing records of
    the kernels it timed."""
    seen: list[tuple[str, object]] = []
    _observers.append(seen)
    try:
        yield seen
    finally:
        _observers.remove(seen)


def recording_launches() -> bool:
    """Whether launches are being recorded (`recording`), not run."""
    return _recorder is not None


def target() -> Target | None:
    """The GPU the launches are for: the recording target, the current CUDA device, or None
    under the interpreter."""
    if _recorder is not None:
        return _recorder.target
    if INTERPRETED:
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return Target(props.major * 10 + props.minor, props.multi_processor_count)


def launch(
    kernel,
    grid: tuple[int, ...],
    *args,
    num_warps: int = 4,
    num_stages: int = 1,
    maxnreg: int | None = None,
    **constexprs,
):
    """Launch kernel[grid] (or record it while `recording`, returning None). maxnreg: the registers per thread
    ptxas may use (None: its own choice, which on sm_90 may cap them for occupancy and spill). Returns what the
    launch returns: compiled, the compiled kernel (its `asm` stages, `pnmix.kernels.ptx_unpack` reads the TTGIR)."""
    if _recorder is not None:
        _recorder.launches.append(Launch(kernel, tuple(grid), args, constexprs, num_warps, num_stages, maxnreg))
        return None
    options = {} if maxnreg is None or INTERPRETED else {"maxnreg": maxnreg}
    compiled = kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **options, **constexprs)
    for seen in _observers:
        seen.append((kernel_name(kernel), compiled))
    return compiled


def kernel_device() -> torch.device:
    """The device whose tensors the kernels take: CPU under the interpreter (or while recording), else CUDA."""
    return torch.device("cpu") if INTERPRETED or _recorder is not None else torch.device("cuda")


def check_device(name: str, t: torch.Tensor) -> None:
    """Kernels read tensors on `kernel_device()` only; say so instead of failing inside Triton."""
    if LATE_INTERPRETER is not None and _recorder is None:
        raise RuntimeError(LATE_INTERPRETER)
    expected = kernel_device()
    if t.device.type != expected.type:
        mode = "the Triton interpreter (TRITON_INTERPRET=1)" if INTERPRETED else "compiled Triton (CUDA)"
        raise ValueError(f"{name} must be on {expected.type} for {mode}, got {t.device}")
