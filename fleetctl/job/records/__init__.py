"""A job's run folder and what it holds: one typed record per file (job.json in jobrecord.py;
controller.json, connect.json, ranks.json, slurm.json, check.json, collective.json, roles.json
in files.py), the runs, the state machine they record, a run's result and its events."""
