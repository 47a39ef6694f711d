"""Adapters frozen as users copied them, byte for byte: last week's template (`template_20261201`, before the
spec's modules moved), this week's (`template_20261207`) and the third party built on it (`thirdparty_20261207`).
`conformance/meta/test_frozen_adapters.py` imports and runs them against today's spec; never edit them (ruff
leaves this folder alone)."""
