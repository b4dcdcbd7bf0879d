"""INT8 quantization, a leaf: calibration tables, quantization parameters, calibrators, tensor keys, data loading.

It imports no pass; the driver that compiles and runs the FP32 model to calibrate is :mod:`tvmfuse.calibration`."""
