"""PN-Mix public API: `PNMixCache` on Triton kernels. Configuration and storage model are the spec's."""

from reference.channels.config import PNMixConfig
from reference.channels.storage import StorageReport, bit_widths, storage_model

__version__ = "0.1.0"

from pnmix.cache import PNMixCache

__all__ = ["PNMixCache", "PNMixConfig", "StorageReport", "__version__", "bit_widths", "storage_model"]
