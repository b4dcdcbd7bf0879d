"""INT8 graph passes: quantizing a float graph (QuantizeGraph), importing a quantized one (FuseQDQ), and the
INT8 kernels both lower matched chains to."""
