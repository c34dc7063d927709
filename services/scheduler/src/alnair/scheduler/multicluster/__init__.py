"""Several clusters, one queue: the pure part of wide-area dispatch (issue 15).

`scoring` predicts a job's completion on each worker cluster (queue wait + transfer of its
image, model and data + runtime on the cluster's GPU types) and builds the hub's
`QueueSnapshot`, whose capacity keys are `<cluster>/<type>`, so the queueing policies order,
share and place jobs over all clusters at once. The live hub
(`alnair.scheduler.dispatcher.hub`) and the multi-cluster simulator
(`alnair.scheduler.jobsim.multicluster`) both use it.
"""
