"""Developer tools for the repository."""
