"""What a benchmark runs and how: configs, workloads, the named sweeps, the load gate, the one driver
(:mod:`~benchmarks.sweep.runner`, for the DeepSpeed and the FSDP2 front ends), and the parsing of a
run's files into a result row."""
