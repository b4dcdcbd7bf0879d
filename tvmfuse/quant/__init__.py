"""INT8 quantization: calibration tables and quantization parameters (low), calibration driver (high)."""
