"""The backbones alone (tools/benchmark.py): ours against the baselines on one input (``speed``), the released
variants against the papers (``variants``), and the cost against the input size (``scaling``)."""
