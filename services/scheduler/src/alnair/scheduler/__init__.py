"""Alnair Scheduler: the plugin framework shared by the live binder and the trace simulator, plus queue and dispatcher."""
