"""The phases of a job as verbs: check, push, launch, watch, teardown, collect."""
