"""Pattern builders: anchors (conv2d, matmul with constant weights) and their epilogues.

Each builder returns ``(pattern, annotations)``; annotations name the sub-patterns the checks and the
lowering read (``data``, ``weight``, ``bias``, ``residual``, ``root``).
"""

from __future__ import annotations

from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from tvmfuse.schedules.families import ACTIVATIONS, FAMILIES

AFFINE = "affine"  # the name suffix of an entry whose activation is followed by a constant scale and shift


def make_anchor_pattern(family: str) -> tuple[DFPattern, dict]:
    """conv2d (also depthwise: the checks tell them apart) or dense, with a constant weight; a batched matmul
    with any second operand, read through a ``permute_dims`` the partition then holds (attention's ``K^T``)."""
    data, weight = wildcard(), is_const()
    if not FAMILIES[family].constant_weight:
        operand = wildcard()
        weight = is_op("relax.permute_dims")(operand) | operand
    root = is_op(FAMILIES[family].anchor_op)(data, weight)
    return root, {"data": data, "weight": weight, "root": root}


def with_bias(out: DFPattern, annotations: dict) -> DFPattern:
    """``out + constant`` or ``out`` alone: the bias is optional (folded batch-norm adds one)."""
    bias = is_const()
    annotations["bias"] = bias
    return is_op("relax.add")(out, bias) | out


def with_residual(out: DFPattern, annotations: dict, residual_first: bool = False) -> DFPattern:
    """``out + residual`` (or ``residual + out``).

    The two operand orders are separate patterns, not one ``|``: an alternative commits to the first
    order that matches, and when that order's check refuses (say both operands are conv outputs and the
    first has other users), the legal other order would never be tried.
    """
    residual = wildcard()
    annotations["residual"] = residual
    annotations["producer"] = out
    add = is_op("relax.add")(residual, out) if residual_first else is_op("relax.add")(out, residual)
    annotations["residual_add"] = add
    return add


def with_activation(out: DFPattern, kind: str) -> DFPattern:
    """One activation applied to ``out``; ``clip`` covers relu6. Hardswish is ``x * clip(x + 3, 0, 6) / 6``,
    spelt ``x * (clip(..) / 6)`` (ONNX HardSwish, torch), ``(x * clip(..)) / 6`` (Paddle) or ``x *
    HardSigmoid(x)`` (PP-OCRv6 tiny rec); HardSigmoid is ``clip(alpha * x + beta, 0, 1)``; SiLU is
    ``x * sigmoid(x)``."""
    if kind == "relu":
        return is_op("relax.nn.relu")(out)
    if kind == "clip":
        return is_op("relax.clip")(out, wildcard(), wildcard())
    if kind == "leakyrelu":
        return is_op("relax.nn.leakyrelu")(out)
    if kind == "sigmoid":
        return is_op("relax.sigmoid")(out)
    if kind == "hardswish":
        clipped = is_op("relax.clip")(is_op("relax.add")(out, is_const()), wildcard(), wildcard())
        scaled = is_op("relax.divide")(clipped, is_const())
        product = is_op("relax.multiply")(out, clipped) | is_op("relax.multiply")(clipped, out)
        gate = _hardsigmoid(out)
        return (is_op("relax.multiply")(out, scaled) | is_op("relax.multiply")(scaled, out)
                | is_op("relax.divide")(product, is_const())
                | is_op("relax.multiply")(out, gate) | is_op("relax.multiply")(gate, out))
    if kind == "hardsigmoid":
        return _hardsigmoid(out)
    if kind == "gelu":  # the ops (ONNX Gelu, both forms; the tanh form's spellings become one in
        # passes.gelu), or x * 0.5 * (1 + erf(x / sqrt(2))) spelt out, in the orders exporters write it
        op = is_op("relax.nn.gelu")(out) | is_op("relax.nn.gelu_tanh")(out)
        scaled = is_op("relax.divide")(out, is_const()) | is_op("relax.multiply")(out, is_const())
        erf = is_op("relax.erf")(scaled)
        one_plus = is_op("relax.add")(erf, is_const()) | is_op("relax.add")(is_const(), erf)
        product = is_op("relax.multiply")(out, one_plus) | is_op("relax.multiply")(one_plus, out)
        half = is_op("relax.multiply")(out, is_const())
        return (op | is_op("relax.multiply")(product, is_const()) | is_op("relax.multiply")(is_const(), product)
                | is_op("relax.divide")(product, is_const()) | is_op("relax.multiply")(half, one_plus)
                | is_op("relax.multiply")(one_plus, half))
    if kind == "silu":
        gate = is_op("relax.sigmoid")(out)
        return is_op("relax.multiply")(out, gate) | is_op("relax.multiply")(gate, out)
    raise ValueError(f"unknown activation {kind!r}; known: {ACTIVATIONS}")


def _hardsigmoid(out: DFPattern) -> DFPattern:
    """ONNX HardSigmoid as TVM imports it: ``clip(alpha * x + beta, 0, 1)``."""
    scaled = is_op("relax.multiply")(is_const(), out) | is_op("relax.multiply")(out, is_const())
    shifted = is_op("relax.add")(scaled, is_const()) | is_op("relax.add")(is_const(), scaled)
    return is_op("relax.clip")(shifted, wildcard(), wildcard())


def with_affine(out: DFPattern, annotations: dict) -> DFPattern:
    """``out * scale + shift`` with constant scale and shift, either operand order (Paddle's learnable affine
    block after an activation, PP-LCNetV3)."""
    scale, shift = is_const(), is_const()
    annotations["scale"], annotations["shift"] = scale, shift
    scaled = is_op("relax.multiply")(out, scale) | is_op("relax.multiply")(scale, out)
    return is_op("relax.add")(scaled, shift) | is_op("relax.add")(shift, scaled)


def make_fused_pattern(family: str, residual: bool, activation: str | None,
                       residual_first: bool = False, affine: bool = False) -> tuple[DFPattern, dict]:
    """anchor (+bias) (+residual add, in the given operand order) (+activation (+constant scale and shift))."""
    out, annotations = make_anchor_pattern(family)
    out = with_bias(out, annotations)
    if residual:
        out = with_residual(out, annotations, residual_first)
    if activation is not None:
        out = with_activation(out, activation)
        if affine:
            out = with_affine(out, annotations)
    return out, annotations
