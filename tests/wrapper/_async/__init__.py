"""Wrapper tests written for asyncio; tools/unasync.py generates the sync twins."""
