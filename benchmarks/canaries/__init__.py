"""Canaries: each method, each transformers attention layout and each tool's own pipeline run on a fixed,
seeded, tiny workload, in seconds on a CPU. What a canary gives (`outcome`) stands for the code path it ran:
a result records the canaries of what it used (`behaviour`), and stays current while they reproduce.

- `outcome`: what a canary gives (discrete parts compared exactly, floats within a tolerance) and the comparison;
- `workloads`: the seeded inputs and the tiny random models;
- `methods`: each method of `reference.methods` through its spec cache;
- `pipelines`: each method through `pnmix.hf.PNMixHFCache` on each tiny model, and the tools' own pipelines;
- `behaviour`: the names, running them once per process, and what a result records.
"""
