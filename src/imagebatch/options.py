"""One typed model of a run's options: the flow, the command line, deployments and shards read it."""
