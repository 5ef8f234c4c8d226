"""A job's run folder and what it holds: one typed record per file (job.json, connect.json,
the runs), the state machine they record, a run's result and its events."""
