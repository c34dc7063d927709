"""Alnair Elastic: the ElasticJob controller that grows and shrinks Horovod-style jobs with free GPUs."""
