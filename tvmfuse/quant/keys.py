"""Tensor keys: how calibration tables name the tensors that enter or leave a partition.

A low module (it needs only TVM's IR): calibration (:mod:`tvmfuse.calibration`) writes tables under these
keys and ``QuantizeGraph`` (:mod:`tvmfuse.passes.int8.quantize`) looks ranges up by them, both from the same
partitioned module.
"""

from __future__ import annotations


def _main_vars(func) -> list:
    """Parameters, then the variables bound at the top level of ``func``'s body, in program order."""
    variables = list(func.params)
    for block in func.body.blocks:
        variables.extend(binding.var for binding in block.bindings)
    return variables


def _var_keys(func) -> dict:
    """Var -> unique key: its name, or ``name#k`` for the k-th later var (k >= 1) with the same name."""
    seen: dict[str, int] = {}
    keys = {}
    for var in _main_vars(func):
        count = seen.get(var.name, 0)
        seen[var.name] = count + 1
        keys[var] = var.name if count == 0 else f"{var.name}#{count}"
    return keys


def _is_float_tensor(expr) -> bool:
    from tvm import relax

    return isinstance(expr.ty, relax.TensorType) and str(expr.ty.dtype).startswith(("float", "bfloat"))


def _is_partition(func) -> bool:
    """A partition function: FuseOpsByPattern's ``Composite`` mark, the test of
    :func:`tvmfuse.passes.partition.is_partition` (restated so this module stays below the pass layer)."""
    from tvm import relax

    return isinstance(func, relax.Function) and bool(func.attrs) and "Composite" in func.attrs


def observed_tensors(partitioned_mod) -> list[tuple[str, object]]:
    """The tensors calibration observes in a partitioned module, as ``(key, relax.Var)`` in program order.

    Walking the top-level bindings of ``main`` in order, for each call to a partition function (see
    :func:`tvmfuse.passes.partition.is_partition`): every argument that is a variable (constants such as
    weights are left out), then the variable the call's result is bound to. Only floating-point tensors
    count, and each variable once.

    A key is the variable's ``name``; variables of ``main`` (parameters first, then bindings in program
    order) that repeat an earlier name get ``name#1``, ``name#2``, ... by their rank among the variables of
    that name. The keys depend only on the module, so a pass given the same partitioned module finds the
    same keys.

    Parameters
    ----------
    partitioned_mod : tvm.IRModule
        The module right after partitioning (``PassRecord.partitioned``).

    Returns
    -------
    list of (str, relax.Var)
    """
    import tvm
    from tvm import relax

    func = partitioned_mod["main"]
    keys = _var_keys(func)
    observed, seen = [], set()

    def add(var):
        if isinstance(var, relax.Var) and var not in seen and _is_float_tensor(var):
            seen.add(var)
            observed.append((keys[var], var))

    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.GlobalVar)
                    and _is_partition(partitioned_mod[call.op])):
                continue
            for arg in call.args:
                add(arg)
            add(binding.var)
    return observed
