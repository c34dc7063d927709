"""The trace simulator: replays the Alibaba GPU trace through the same framework and plugins
the live binder runs, to compare placement policies against the FGD paper's published numbers.

`trace` loads the data and applies the paper's protocol, `engine` runs one replay, `report`
batches and compares runs, `cli` is `alnair simulate`, `demo` is `make demo`.
"""
