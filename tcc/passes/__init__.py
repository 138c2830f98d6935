"""Passes: each one module, a pure function from an IR value (plus options) to an IR value."""
