"""Benchmarks of the transformer_course package; run ``python bench/run.py --quick|--full``."""
