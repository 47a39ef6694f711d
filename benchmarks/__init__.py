"""Benchmark suites reproducing the paper's Fig. 6 and Fig. 7."""
