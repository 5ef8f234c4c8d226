"""One job's life: the run, its run folder, retries, the detached monitor."""
