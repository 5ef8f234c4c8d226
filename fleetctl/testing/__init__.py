"""Test-only helpers (lab fixtures, conda-pack builders, testinfra checks)."""
