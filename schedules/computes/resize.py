"""Bilinear resize of plain NCHW activations, computed in two passes (rows, then columns).

TVM's ``resize2d`` computes every output pixel from four input pixels whose column indices depend on the
output column: vectorized along the row, each of the four is a gather, which LLVM turns into 16 scalar loads
per vector. DeepLabV3's 8x upsampling of its 21 class maps (20 x 20 -> 160 x 160, the model's output) took
633 us on Zen 4, 8% of the model, and 1.07 ms on a Xeon (13%).

Here the horizontal interpolation runs once per input row (``ROWS``, a stage of its own: ``20`` rows instead
of ``160``), and the vertical one reads two of those rows with whole-vector loads. Each output is the same
expression as TVM's (``lerp(lerp(p00, p01, tx), lerp(p10, p11, tx), ty)``, ``lerp(a, b, t) = a * (1 - t) + b
* t``, the same coordinates from ``topi.image.resize.get_inx`` and the same edge clamps), so it agrees with TVM's
resize and ONNX's to a rounding (LLVM may fuse a product and a sum in one of them and not the other).
"""

from __future__ import annotations

from tvm import te, tirx
from tvm.topi.image.resize import get_inx

ROWS = "resize_rows"  # the horizontal pass's stage: kept (not inlined) by the generic schedule
KEEP = "tvmfuse.keep_stage"  # block annotation: the generic schedule does not inline this stage
MODES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")


def fits(call) -> bool:
    """Whether a ``relax.image.resize2d`` call is a float32 bilinear resize of NCHW with static shapes and a
    coordinate mode that needs no region of interest."""
    a = call.attrs
    shape = getattr(call.ty, "shape", None)
    src = getattr(call.args[0].ty, "shape", None)
    if shape is None or src is None or len(shape) != 4 or len(src) != 4:
        return False
    if not all(isinstance(d, tirx.IntImm) for d in list(shape) + list(src)):
        return False
    return (str(a.method) == "linear" and str(a.layout) == "NCHW" and str(a.coordinate_transformation_mode) in MODES
            and str(call.ty.dtype) == "float32" and str(call.args[0].ty.dtype) == "float32")


def _lerp(a, b, t):
    return a * (tirx.const(1.0, "float32") - t) + b * t


def _coordinate(v, size: int, target: int, mode: str):
    """The source coordinate of output index ``v``, its floor, and the fraction past it (as TVM's resize,
    which passes the sizes as int64 shape values)."""
    pos = get_inx(v, tirx.IntImm("int64", size), tirx.IntImm("int64", target), mode, 0.0, 0.0, False)
    base = te.floor(pos).astype("int32")
    return base, pos - base


def _clamp(i, size: int):
    return te.max(te.min(i, size - 1), 0)


def resize_bilinear(data: te.Tensor, out_h: int, out_w: int, mode: str) -> te.Tensor:
    """``data`` ``[N, C, H, W]`` resized to ``[N, C, out_h, out_w]``, bilinear, coordinates by ``mode``."""
    n, c, h, w = (int(d) for d in data.shape)

    def horizontal(b, ch, r, x):
        x0, tx = _coordinate(x, w, out_w, mode)
        return _lerp(data[b, ch, r, _clamp(x0, w)], data[b, ch, r, _clamp(x0 + 1, w)], tx)

    rows = te.compute((n, c, h, out_w), horizontal, name=ROWS, attrs={KEEP: 1})

    def vertical(b, ch, y, x):
        y0, ty = _coordinate(y, h, out_h, mode)
        return _lerp(rows[b, ch, _clamp(y0, h), x], rows[b, ch, _clamp(y0 + 1, h), x], ty)

    return te.compute((n, c, out_h, out_w), vertical, name="resize")


def legalize_resize2d(bb, call):
    """``relax.image.resize2d``: :func:`resize_bilinear` where it :func:`fits`, TVM's own rule otherwise."""
    import tvm

    if not fits(call):
        return tvm.ir.Op.get("relax.image.resize2d").get_attr("FLegalize")(bb, call)
    _, _, out_h, out_w = (int(d) for d in call.ty.shape)
    return bb.call_te(resize_bilinear, call.args[0], out_h, out_w, str(call.attrs.coordinate_transformation_mode),
                      primfunc_name_hint="resize2d")

