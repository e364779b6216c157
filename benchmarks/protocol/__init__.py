"""The long-run protocol (a decayed learning rate over long budgets, every alternative on every bed, each bed
unshaped too, 2 to 8 workers): its sweep parts (:mod:`.plans`, which :mod:`benchmarks.sweep.plans` adds to its
own) and the driver that runs every bed x seed (:mod:`.driver`, ``python -m benchmarks.protocol``). Its figures:
:mod:`benchmarks.report.long_runs`."""
