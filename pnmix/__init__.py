"""PN-Mix public API. The configuration and the storage model are the spec's (`reference`)."""

from reference.config import PNMixConfig
from reference.storage import StorageReport, bit_widths, storage_model

__all__ = ["PNMixConfig", "StorageReport", "bit_widths", "storage_model"]
