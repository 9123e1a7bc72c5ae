"""A delivery run: counted and checked before it runs (strategy), run (task), its outcome taken over (request)."""
