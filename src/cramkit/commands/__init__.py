"""Verb registration for the `cramkit` command, one module per area (see cramkit.cli)."""
