"""Alnair device plugin: the kubelet device plugin for whole and fractional GPUs, and the
node's vGPU registry that the intercept shim registers with."""
