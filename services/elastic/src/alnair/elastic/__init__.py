"""Alnair Elastic: the ElasticJob controller that grows and shrinks Horovod-style jobs.

Not built yet: no issue covers it. The CRD ships in deploy/kustomize/crds/elasticjob.yaml.
"""
