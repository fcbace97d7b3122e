"""Benchmarks of the transformer_course package; run ``python -m bench.run --quick|--full`` from the repository root."""
