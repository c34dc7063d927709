"""Alnair Profiler: the node agent that reads GPUs (NVML or simulated) and the aggregator
that folds pod metrics into jobs and keeps their execution records."""
