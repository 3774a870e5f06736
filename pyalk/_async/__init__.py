"""The async wrapper: the source the sync wrapper (pyalk/_sync) is generated from."""
