"""PN-Mix public API: `PNMixCache` on Triton kernels. Configuration and storage model are the spec's.

Importing `pnmix` (or `pnmix.hf`) does not import triton: `PNMixCache` is loaded, and triton with it, when it is
first asked for (a Triton backend); `pnmix._interpret` decides TRITON_INTERPRET before then.
"""

from pnmix import _interpret  # noqa: F401  (first: TRITON_INTERPRET is decided before anything imports triton)
from reference.channels.config import PNMixConfig
from reference.channels.storage import StorageReport, bit_widths, storage_model

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "PNMixCache":  # the Triton cache, and triton with it, only when asked for
        from pnmix.cache import PNMixCache  # deferred: it imports triton

        return PNMixCache
    raise AttributeError(f"module 'pnmix' has no attribute {name!r}")


__all__ = ["PNMixCache", "PNMixConfig", "StorageReport", "__version__", "bit_widths", "storage_model"]
