"""Argument binding and checks, array interop, per-target build-and-run glue, the compile cache."""
