"""Tooling that only the command line uses: compare, bench, test checkpoints, config docs."""
