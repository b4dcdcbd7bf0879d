"""Layout transform kernels between NCHW and NCHW[b]c (see ``tvmfuse.schedules.computes.blocked``), and the pooling
kernels that keep a blocked activation blocked.

``LowerPartitions`` inserts transforms only at partition boundaries where a plain tensor is needed (a
non-kernel consumer, the model output, or a depthwise/residual input that arrives NCHW). Each is a kernel of
family ``layout_transform``; a max/average pooling of a blocked activation becomes one of family
``pool2d_nchwc``. Both are scheduled by ``ScheduleKernels`` like a partition kernel, kept whole by FuseOps,
and not tuned (their fixed schedule is all there is to them).
"""

from __future__ import annotations

import tvm
from tvm import relax, te

from tvmfuse.schedules.families import LAYOUT_TRANSFORM, POOL_NCHWC

from .utils import OPAQUE, add_kernel

FAMILY = LAYOUT_TRANSFORM.name
POOL_FAMILY = POOL_NCHWC.name


def layout_kernel(compute, struct_info, family: str = FAMILY, name: str | None = None) -> tvm.tirx.PrimFunc:
    """The PrimFunc of ``compute`` (a one-input TE function, e.g. ``blocked.to_plain``) on a tensor of
    ``struct_info``; its name (attribute ``tvmfuse.kernel``) is ``name`` or the compute's stage name."""
    data = te.placeholder([int(d) for d in struct_info.shape], struct_info.dtype, name="data")
    out = compute(data)
    func = te.create_prim_func([data, out]).without_attr("global_symbol")
    return func.with_attrs({"tvmfuse.family": family, "tvmfuse.kernel": name or out.op.name, "op_pattern": OPAQUE})


# (what the compute is, input shape, dtype, kernel keywords) -> its PrimFunc: every blocked kernel's output gets a
# to_plain transform (dead code unless something reads it plain), 70 in MobileNetV3, mostly of a few shapes; the
# TE kernel costs about 0.5 ms to make. PrimFuncs are immutable, so kernels are shared across modules.
_KERNELS: dict = {}


def transform_call(builder, compute, arg, out_shape, key=None, **kernel) -> relax.Call:
    """The ``call_tir`` of :func:`layout_kernel` (``compute`` on ``arg``, ``kernel`` its keywords), the kernel
    added to ``builder``'s module under its ``tvmfuse.kernel`` name. ``key`` (hashable): what ``compute`` is
    (with its parameters), for a kernel made before to be reused; None makes it again."""
    cache_key = None if key is None else (key, tuple(int(d) for d in arg.ty.shape), str(arg.ty.dtype),
                                          tuple(sorted(kernel.items())))
    func = _KERNELS.get(cache_key) if cache_key is not None else None
    if func is None:
        func = layout_kernel(compute, arg.ty, **kernel)
        if cache_key is not None:
            if len(_KERNELS) > 4096:
                _KERNELS.clear()
            _KERNELS[cache_key] = func
    gv = add_kernel(builder, func, str(func.attrs["tvmfuse.kernel"]))
    return relax.call_tir(gv, [arg], relax.TensorType(out_shape, arg.ty.dtype))
