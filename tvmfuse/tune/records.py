"""Tuning records as the log lines hold them: a kernel's workload hash, a record to and from plain JSON,
the intrinsics a record tensorizes with, and records decoded into a MetaSchedule database. (The lines
themselves, their folders and locking: :mod:`.database`.)"""

from __future__ import annotations

from ..targets import TargetSpec


def kernel_hash(func) -> str:
    """The structural hash a kernel's workload is filed under (the kernel as a module's ``main``, as tuning
    commits it), as the decimal string workload lines hold."""
    import tvm
    import tvm_ffi

    return str(tvm_ffi.structural_hash(tvm.IRModule({"main": func.with_attr("global_symbol", "main")})))


def tensorized_with(record) -> set[str]:
    """The tensor intrinsics a tuning record's trace tensorizes with. MetaSchedule's record JSON starts with the
    trace ``[instructions, decisions]``, an instruction ``[kind, inputs, attributes, outputs]``; a ``Tensorize``
    instruction's first attribute is the intrinsic's name. Anything else (a damaged record) names none."""
    try:
        instructions = record[0][0]
        return {inst[2][0] for inst in instructions
                if isinstance(inst, list) and len(inst) > 2 and inst[0] == "Tensorize" and isinstance(inst[2], list)
                and inst[2] and isinstance(inst[2][0], str)}
    except (IndexError, KeyError, TypeError):
        return set()


TVM_OBJECT = "tvm_json"  # a record's value JSON cannot spell (an IndexMap of transform_layout), in TVM's JSON


def record_json(record) -> list:
    """A tuning record as plain JSON. MetaSchedule's own export fails on the IndexMap a ``transform_layout``
    step carries (the CUDA GEMM rule re-indexes its operands with them); such objects are kept in TVM's JSON
    as ``{"tvm_json": ...}``, which :func:`decoded_record` hands back as that string: the form the instruction
    reads its attribute from."""
    import tvm
    from tvm_ffi import Array, Map
    from tvm.s_tir.meta_schedule import _ffi_api

    def plain(obj):
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
            return obj.value
        if isinstance(obj, (Array, list, tuple)):
            return [plain(i) for i in obj]
        if isinstance(obj, (Map, dict)):
            return {str(k): plain(v) for k, v in obj.items()}
        return {TVM_OBJECT: tvm.ir.save_json(obj)}

    return plain(_ffi_api.TuningRecordAsJSON(record))


def register_intrinsics(spec: TargetSpec, records) -> list[str]:
    """Register the tensor intrinsics that the record JSONs ``records`` tensorize with (decoding a record looks
    each up by name); the names the backend registered."""
    return spec.backend().register_record_intrinsics(set().union(*(tensorized_with(r) for r in records)))


def commit_records(db, workloads: dict, records: list, spec: TargetSpec) -> list[str]:
    """Decode ``records`` (``(workload index, record JSON)``) and their workloads into MetaSchedule database
    ``db``, the intrinsics they tensorize with registered first; the first line of each decode error."""
    from tvm.s_tir import meta_schedule as ms

    register_intrinsics(spec, (r for _, r in records))
    decoded, errors = {}, []
    for index, record in records:
        try:
            if index not in decoded:
                decoded[index] = db.commit_workload(ms.database.Workload.from_json(workloads[index]).mod)
            db.commit_tuning_record(decoded_record(record, decoded[index]))
        except Exception as err:  # noqa: BLE001 - any decode failure of one line is that line's problem
            errors.append(str(err).splitlines()[0][:200])
    return errors


def decoded_record(record: list, workload):
    """The MetaSchedule record of a record line's JSON (:func:`record_json`) for ``workload``."""
    from tvm.s_tir import meta_schedule as ms

    def objects(obj):
        if isinstance(obj, list):
            return [objects(i) for i in obj]
        if isinstance(obj, dict):
            if set(obj) == {TVM_OBJECT}:
                return obj[TVM_OBJECT]  # read back from TVM's JSON string by the instruction itself
            return {k: objects(v) for k, v in obj.items()}
        return obj

    return ms.database.TuningRecord.from_json(objects(record), workload)
