"""The CUDA backend: today TVM's default CUDA pipeline, whose dlight rules schedule every kernel.

tvmfuse's own CUDA rules (depthwise, implicit-GEMM conv2d, dense, INT8) are to be added here, one module
per kernel, registered under ``"cuda"`` in ``families.Kernel.rules``. Until then a partition kernel is
lowered with the same TE compute as on x86 and handed to dlight; INT8 kernels and tuning logs are x86's
only.
"""

from __future__ import annotations

import warnings

from ..backend import Backend as _Base


class Backend(_Base):
    """CUDA for one ``sm_XX`` target."""

    name = "cuda"
    device = "cuda"
    tensor_intrin = ("cuda",)

    def relax_pipeline(self, target, scheduling: list):
        """TVM's default CUDA pipeline (legalize, fuse, dlight schedules, lower); ``scheduling`` is not used:
        no tvmfuse rule or tuning log schedules a CUDA kernel yet."""
        from tvm import relax

        del scheduling
        return relax.get_default_pipeline(target)

    def build_info(self) -> dict:
        """``cuda_code``: how the library will hold its kernels, ``"binary"`` (cubin) or ``"source"``, with a
        warning (no TVM CUDA runtime loaded, so a GPU machine may not load the library)."""
        from tvmfuse import cuda_driver

        if cuda_driver.cuda_codegen_ready():
            return {"cuda_code": "binary"}
        warnings.warn("TVM's CUDA runtime is not loaded (no NVIDIA driver, and the build stub was off or could not "
                      f"be built: {cuda_driver.state['driver']}), so the CUDA kernels are kept as source, which a "
                      "GPU machine may not load; import tvmfuse before tvm, and keep a C compiler on PATH",
                      stacklevel=4)
        return {"cuda_code": "source"}
