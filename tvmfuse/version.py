"""tvmfuse's version, in a module of its own: manifests, calibration tables and the CLI read it without importing
the package root (which imports the runtime)."""

__version__ = "0.1.0"
