"""One run's machinery under Prefect: checks before it starts, dispatch, its records, its verdict, shards."""
