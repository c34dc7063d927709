"""Alnair predictor: runtime, peak GPU memory and co-location slowdown of training jobs.

Learns from measured benchmarks (Gavel) and the execution records the profiler keeps in Redis,
answers over HTTP and NATS, retrains when jobs complete, and reports its own held-out accuracy.
"""
