"""The backbones alone (tools/benchmark.py): ours against the baselines on one input (``speed``), the released
variants against the papers (``variants``), the cost against the input size (``scaling``);
ours against the official model code (``against_official``, tools/compare_official.py)."""
