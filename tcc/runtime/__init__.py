"""Argument binding and checks, array interop, the compile cache, and the op objects."""
