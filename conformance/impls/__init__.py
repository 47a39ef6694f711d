"""Adapters that plug implementations into the conformance suite (`--impl conformance.impls.NAME:make`)."""
