"""fleetctl: run distributed training jobs on your own GPU boxes over SSH."""

__version__ = "0.1.0"
