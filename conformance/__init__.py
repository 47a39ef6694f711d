"""Conformance suite: property tests any PN-Mix implementation can be run against."""
