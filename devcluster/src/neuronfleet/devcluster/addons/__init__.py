"""What runs beside a local cluster for the tests and benchmarks: the operator as a process, S3, Prometheus, KEDA."""
