"""The aggregator process: pod metrics and summaries in, job profiles, execution records and
completion events out.

- `aggregator`: the `Aggregator` (folding, live annotations, the profiles it serves);
- `owners`: whose job a pod is, and whether that job is done;
- `store`: the Redis key layout and the scripts that fold samples atomically;
- `finalize`: annotate, record, announce, mark done; retried until it holds;
- `records`: the execution records, written exactly once per job.
"""
