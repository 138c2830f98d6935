"""The version of tcc, in a module of its own so that any layer can import it without importing the package."""

__version__ = "0.1.0"
