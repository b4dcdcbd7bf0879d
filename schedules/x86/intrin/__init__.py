"""Tensor intrinsics tvmfuse registers (explicitly, never at import)."""
