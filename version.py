"""The package's version, in a leaf module: anything may import it without importing the package's
public surface, and ``pyproject.toml`` reads it from here."""

__version__ = "0.2.0"
