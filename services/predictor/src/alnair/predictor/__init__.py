"""Alnair Predictor: learns runtime, peak GPU memory and co-location slowdown from benchmarks and execution records."""
