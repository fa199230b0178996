"""CLI commands (placeholder until implemented)."""
