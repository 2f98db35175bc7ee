"""The SDK version (a leaf module: anything can import it without importing the package face)."""

__version__ = "0.1.0"
