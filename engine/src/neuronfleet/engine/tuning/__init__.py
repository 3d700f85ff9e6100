"""Choosing buckets: the padding-waste recommender, seeded workloads, lengths read from a running engine."""
