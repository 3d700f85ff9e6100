"""The operator's view of the cluster: the API client, the cache the watches fill, and the leader's Lease."""
