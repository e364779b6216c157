"""The pages' tables: README.md's and BENCHMARKS.md's tables, computed from the raw files ``bench_results/sets.json``
names (:mod:`.sets`), formatted (:mod:`.cells`, :mod:`.tables`, :mod:`.projection`) and written between the pages'
markers (:mod:`.write`; ``python -m benchmarks report``)."""
