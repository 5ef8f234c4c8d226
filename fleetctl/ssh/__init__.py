"""Reaching nodes: one connection per host, fleets of them, ad-hoc commands."""
