"""What to run where, pure: inventory, rank plan, task roles, launcher argv."""
