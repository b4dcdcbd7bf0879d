"""x86 schedules (LLVM targets)."""
