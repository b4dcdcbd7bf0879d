"""The CUDA backend: tvmfuse's own kernels for every partition, TVM's dlight rules for the rest.

Each partition kernel gets its family's rule (``families.Kernel.rules["cuda"]``): depthwise conv2d a
shared-memory tile and a register strip per thread (:mod:`.depthwise_conv2d`), conv2d an implicit GEMM
(:mod:`.conv2d`; fp16 on the tensor cores, :mod:`.tensor_core`), dense a GEMV or the GEMM tiles
(:mod:`.dense`), grouped conv2d the GEMM per group where a tile divides the group (:mod:`.group_conv2d`); a
kernel no rule fits (a group no tile divides, a depthwise window too wide for shared memory) gets
:mod:`.fused`. Kernels outside every partition (pools, reshapes, softmax) are scheduled by TVM's
dlight rules, as TVM's own CUDA pipeline does. Every kernel records who scheduled it in its
``tvmfuse.scheduled_by`` attribute (``tvmfuse.cuda.<rule>``, ``dlight.<Rule>``), which the manifest lists.
INT8 kernels: conv2d and dense
on the tensor cores in s8 x s8 (:mod:`.tensor_core`), depthwise in int32 on the CUDA cores (:mod:`.int8`).
Tuning is offline: candidates built here, timed on a GPU
(``tvmfuse.tune.offline``).
"""

from __future__ import annotations

import importlib
import warnings

from tvm import s_tir

from tvmfuse import cuda_driver

from .. import families
from ..backend import SCHEDULED_BY, kernel_of
from ..backend import Backend as _Base
from ..backend import is_scheduled
from . import fused
from .common import lower_llvm_fma, sm_count

NAME = "cuda"
RULES = {name: importlib.import_module(f"{__name__}.{k.rules[NAME]}")
         for name, k in families.KERNELS.items() if NAME in k.rules}


def scheduled(func, kernel: str | None, sms: int):
    """(schedule, rule name) tvmfuse gives ``func`` on CUDA; (None, None) for a kernel of TVM's default path
    (``kernel`` None) or one whose anchor is missing."""
    if kernel is None:
        return None, None
    module = RULES.get(kernel)
    if module is not None:
        sch = s_tir.Schedule(func)
        if module.schedule(sch, sms):
            return sch, module.__name__.rsplit(".", 1)[-1]
    sch = s_tir.Schedule(func)  # a fresh one: a rule that does not fit leaves nothing behind
    return (sch, "fused") if fused.schedule(sch, kernel) else (None, None)


def dlight_rules() -> list:
    """TVM's CUDA rules, in the order its default pipeline tries them."""
    from tvm.s_tir import dlight as dl

    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


def ScheduleWithDlight():  # noqa: N802 - TVM pass naming
    """dlight's rules for every kernel still unscheduled, one rule at a time so each kernel records which
    one scheduled it (``dlight.<Rule>``)."""
    import tvm
    from tvm import tirx
    from tvm.s_tir import dlight as dl

    @tvm.transform.module_pass(opt_level=0, name="tvmfuse.ScheduleWithDlight")
    def _apply(mod, _ctx):
        order = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
        for rule in dlight_rules():
            before = {gv.name_hint for gv, f in mod.functions_items()
                      if isinstance(f, tirx.PrimFunc) and not is_scheduled(f)}
            mod = dl.ApplyDefaultSchedule(rule)(mod)
            for gv, func in list(mod.functions_items()):
                if gv.name_hint in before and is_scheduled(func):
                    mod.update_func(gv, func.with_attr(SCHEDULED_BY, f"dlight.{type(rule).__name__}"))
        # dlight moves a kernel it schedules to the module's end; every kernel is put back in the order it came
        # in, as the kernel cache puts back the kernels it found (the device code lists them in this order)
        for name in order:
            mod.update_func(mod.get_global_var(name), mod[name])
        return mod

    return _apply


class Backend(_Base):
    """CUDA for one ``sm_XX`` target."""

    name = NAME
    device = "cuda"
    precisions = ("fp32", "fp16")
    tensor_intrin = ("cuda",)
    # Records of tuning_logs/cuda-<arch>/ (written by `tvmfuse tune --import-results` from times measured on a
    # GPU) are applied before the rules; the import files them under each kernel's shared form (an INT8 record then
    # applies whatever the calibration table).
    applies_tuning_logs = True
    shared_records = True
    # INT8 kernels on the tensor cores (conv2d, dense: s8 x s8 wmma) and CUDA cores (depthwise, GEMV), bit-exact
    # against int8_ref like x86's; activations NCHW between them.
    int8_kernels = True
    int8_weights = "signed"

    def __init__(self, spec):
        super().__init__(spec)
        self.sms = sm_count(str(spec.config.get("arch", "")))
        cuda_driver.preload()  # before the first build: kernels compile to cubins only with TVM's CUDA runtime
        lower_llvm_fma()

    def register_record_intrinsics(self, names) -> list[str]:
        """TVM's CUDA intrinsics (the tensor-core conv/dense records tensorize with ``wmma_*``), registered by
        importing their module, when any of ``names`` is one of them: decoding a record looks its intrinsic up
        by name, and without this every such record was refused."""
        if not names:
            return []
        from tvm.s_tir import TensorIntrin

        from tvmfuse.tvmscript import light_tensor_intrin

        light_tensor_intrin(self.name)
        import tvm.s_tir.tensor_intrin.cuda  # noqa: F401 - registers the intrinsics on import

        return [n for n in names if TensorIntrin.get(n, allow_missing=True) is not None]

    def toolchain(self) -> str:
        """nvcc's version and the compiler settings TVM reads from the environment."""
        return cuda_driver.toolchain()

    def why_not_runnable(self) -> str:
        return "" if cuda_driver.cuda_available() else "no CUDA device on this machine"

    def device_label(self) -> str:
        if cuda_driver.cuda_available():
            import tvm

            return f"cuda: {tvm.cuda(0).device_name}"
        return f"cuda: {self.spec.config.get('arch', '')}"

    def weight_block(self, fn) -> int | None:
        """1 for a dense of fewer than ``dense.GEMM_ROWS`` rows: its ``[K, N]`` weight packed ``[N, K, 1]``
        (each output's weights contiguous, for :func:`.gemv.schedule_rows`); None (kept as is) otherwise."""
        from ..computes.partition import anchor_call
        from . import dense

        call = anchor_call(fn)
        if call is None or families.family_of(call) is not families.DENSE:
            return None
        return 1 if int(call.args[0].ty.shape[0]) < dense.GEMM_ROWS else None

    def schedule(self, func):
        sch, rule = scheduled(func, kernel_of(func), self.sms)
        if sch is None:
            return func
        return sch.mod["main"].with_attrs({"tirx.is_scheduled": True, SCHEDULED_BY: f"tvmfuse.cuda.{rule}"})

    def serial_check_schedule(self, func):
        """:meth:`schedule`'s kernel without its final tensorize steps (``tensor_core.TENSORIZE``): every stage
        tiled, placed and laid out, the wmma loads, products and stores left as the loops they replace, so its
        threads can run one after another on the CPU (``tvmfuse.fuzz.cuda_cpu``)."""
        from .tensor_core import untensorized

        with untensorized():
            return self.schedule(func)

    def candidates(self, mod) -> list:
        """The rule's configs (``kernel_candidates`` of its module: the GEMM tiles of conv2d and dense, the
        depthwise tiles), each
        scheduled; the first is the default, so its trace is :meth:`default_trace`'s."""
        import dataclasses

        func = mod["main"]
        module = RULES.get(kernel_of(func))
        finder = getattr(module, "kernel_candidates", None)
        found = []
        for config in finder(func, self.sms) if finder is not None else ():
            sch = s_tir.Schedule(func)
            if module.schedule(sch, self.sms, config):
                found.append((dataclasses.asdict(config), sch.trace))
        return found

    def default_trace(self, mod):
        sch, _ = scheduled(mod["main"], kernel_of(mod["main"]), self.sms)
        return sch.trace if sch is not None else super().default_trace(mod)

    def legalize_passes(self, target) -> list:
        """TVM's CUDA library dispatch and legalization, without its dlight step (``relax_pipeline`` places
        the scheduling after these), with ``x ** 2`` computed as ``x * x``: TVM's CUDA code computes every
        power with ``__powf`` (``exp2(y * log2(x))``), NaN for a negative base, so the variance of an
        ONNX-exported LayerNorm (``Pow(x - mean, 2)``) was NaN and ConvNeXt-T's every output with it, in plain
        TVM too (measured on the H100)."""
        from tvm import relax
        from tvm.relax.backend.cuda import pipeline as cuda

        from ..computes import activations

        passes = cuda.legalize_passes(target)
        assert type(passes[-1]).__name__ == "ApplyDefaultSchedule", passes[-1]
        assert isinstance(passes[0], type(relax.transform.LegalizeOps())), passes[0]
        legalize = relax.transform.LegalizeOps(customize_legalize_map={"relax.power": activations.legalize_power})
        return cuda.library_dispatch_passes(target) + [legalize] + passes[1:-1]

    @staticmethod
    def fallback_passes() -> list:
        """dlight for every kernel tvmfuse's rules left (in YOLOv8n 23 of 65, in the CRNN's LSTM 131 of 143)."""
        return [ScheduleWithDlight()]

    def relax_pipeline(self, target, scheduling: list):
        """TVM's CUDA pipeline with ``scheduling`` (tvmfuse's rules, then dlight for the rest: see
        :meth:`fallback_passes`) in place of its dlight step."""
        import tvm
        from tvm.relax.backend.cuda import pipeline as cuda

        @tvm.transform.module_pass(opt_level=0, name="tvmfuse.RelaxPipeline")
        def _pipeline(mod, _ctx):
            with target:
                passes = (self.legalize_passes(target) + scheduling
                          + cuda.dataflow_lower_passes(target) + cuda.finalize_passes(target))
                return tvm.transform.Sequential(passes)(mod)

        return _pipeline

    # A static-shape model's kernel launches are captured in a CUDA graph on the first run and replayed after
    # (TVM's RewriteCUDAGraph: the VM's "vm.builtin.cuda_graph.run_or_capture"). Measured on an H100, batch 1:
    # 0.92-0.98x the time of plain launches (bench/cuda_graph.py).
    captures_graphs = True

    def pass_config(self, graph: bool = False) -> dict:
        return {"relax.backend.use_cuda_graph": bool(graph)}

    def build_info(self, graph: bool = False) -> dict:
        """``cuda_code``: how the library will hold its kernels, ``"binary"`` (cubin) or ``"source"``, with a
        warning (no TVM CUDA runtime loaded, so a GPU machine may not load the library); ``cuda_graph``:
        whether its launches are captured in a CUDA graph."""
        if cuda_driver.cuda_codegen_ready():
            return {"cuda_code": "binary", "cuda_graph": bool(graph)}
        warnings.warn("TVM's CUDA runtime is not loaded (no NVIDIA driver, and the build stub was off or could not "
                      f"be built: {cuda_driver.state['driver']}), so the CUDA kernels are kept as source, which a "
                      "GPU machine may not load; keep a C compiler on PATH (TVMFUSE_CUDA_STUB=0 turns the stub off)",
                      stacklevel=4)
        return {"cuda_code": "source", "cuda_graph": bool(graph)}
