"""Layout transform kernels between NCHW and NCHW[b]c (see ``tvmfuse.schedules.blocked``).

``LowerPartitions`` inserts them only at partition boundaries where a plain tensor is needed (a non-kernel
consumer such as pooling, the model output, or a depthwise/residual input that arrives NCHW). Each is a
kernel of family ``layout_transform``: scheduled by ``ScheduleKernels`` like a partition kernel, kept whole
by FuseOps.
"""

from __future__ import annotations

import tvm
from tvm import te

from .utils import OPAQUE

FAMILY = "layout_transform"


def layout_kernel(compute, struct_info) -> tvm.tirx.PrimFunc:
    """The PrimFunc of ``compute`` (a one-input TE function, e.g. ``blocked.to_plain``) on a tensor of
    ``struct_info``; its name (attribute ``tvmfuse.kernel``) is the compute's stage name."""
    data = te.placeholder([int(d) for d in struct_info.shape], struct_info.dtype, name="data")
    out = compute(data)
    func = te.create_prim_func([data, out]).without_attr("global_symbol")
    return func.with_attrs({"tvmfuse.family": FAMILY, "tvmfuse.kernel": out.op.name, "op_pattern": OPAQUE})
