"""The experiments' own workloads and summaries: tau2-bench, sessions, tenants, predictor
evaluation, clusters, weights and throughput studies.
"""
