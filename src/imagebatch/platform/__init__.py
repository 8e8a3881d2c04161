"""Prefect's platform: the temporary server, deployments, workers and the bounded calls to its API."""
