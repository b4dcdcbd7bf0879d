"""tvmfuse.schedules: TE computes and TIR schedules per target (installed from the repo's schedules/ folder).

The folder is mapped to ``tvmfuse.schedules`` by pyproject.toml's ``package-dir``. Importing it as a
top-level ``schedules`` (e.g. from the repo root) would load a second copy with its own registries, so
that is refused.
"""

if __name__ != "tvmfuse.schedules":
    raise ImportError(
        f"schedules/ must be imported as tvmfuse.schedules, not {__name__!r}; "
        "install the project with `pip install -e .` and import tvmfuse.schedules"
    )
