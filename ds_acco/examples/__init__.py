"""Real data and small models for the examples, benchmarks and tests, built offline."""
