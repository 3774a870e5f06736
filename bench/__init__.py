"""pyalk's benchmark suite (issue 7): ``python -m bench`` (see bench/README.md)."""
