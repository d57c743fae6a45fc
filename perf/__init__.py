"""Measurement package: what the benchmark and report tools in ``tools/`` (and their tests) share.

One model builder, one timing module, one FLOP counter, one memory probe, one report writer, and the
synthetic workloads of the benchmarks. Tools are argument parsing plus calls into here; nothing in
``backbones/`` or ``tasks/`` imports this package.
"""
