"""A job seen from outside its run: the detached monitor (watch, decide, process), the job's handle
and logs from any terminal, the node supervisors asked, metrics and the end hooks."""
