"""Differential fuzzing of tcc: random valid programs against the reference interpreter."""
