"""Alnair Device plugin: the kubelet device plugin for whole and fractional GPUs, and the vGPU registry."""
