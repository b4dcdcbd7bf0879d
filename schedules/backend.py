"""The backend interface: everything a backend contributes to a compile, and what it says about the device.

Each folder ``schedules/<name>/`` is a backend; its ``__init__`` defines ``Backend``, a subclass of
:class:`Backend`. A target names its folder (``TargetSpec.backend_name``) and ``TargetSpec.backend()``
returns the instance, made once per target; the passes, the tuner, the API and the reports ask it and never
branch on the target kind. The defaults here describe a backend that contributes nothing: kernels stay as
lowered, NCHW only, no INT8 kernels, no templates, no tuning logs, nothing runnable here.
"""

from __future__ import annotations

# PrimFunc attribute naming who scheduled a kernel (``tvmfuse.<backend>[.<rule>]``, ``tuning_log``,
# ``dlight.<Rule>``); the manifest's ``scheduled_by`` lists it.
SCHEDULED_BY = "tvmfuse.scheduled_by"


def is_scheduled(func) -> bool:
    """Whether ``func`` carries TVM's scheduled mark (tuning logs, a backend's rule, dlight)."""
    return bool(func.attrs) and bool(func.attrs.get("tirx.is_scheduled", False))


def kernel_of(func) -> str | None:
    """A kernel's ``tvmfuse.family`` attribute, else the row kernel whose mark one of its blocks carries
    (``families.ROW_MARK``: fusion drops the attributes of a row kernel's function); None: a kernel of TVM's
    default path."""
    kernel = func.attrs.get("tvmfuse.family") if func.attrs else None
    return str(kernel) if kernel is not None else row_kernel_of(func)


def row_kernel_of(func) -> str | None:
    """The row kernel (``families.ROW_KERNELS``) whose mark one top-level block of ``func`` carries, or
    None (also for a function without blocks)."""
    import tvm
    from tvm import s_tir

    from .families import ROW_MARK

    try:
        sch = s_tir.Schedule(func)
        blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    except (tvm.error.TVMError, s_tir.ScheduleError):
        return None
    marks = [str(b.annotations[ROW_MARK]) for b in blocks if ROW_MARK in b.annotations]
    return marks[0] if len(marks) == 1 else None


class Backend:
    """What one target kind contributes. Subclasses override what they have.

    Attributes
    ----------
    name : str
        The folder under ``schedules/``.
    device : str
        The TVM runtime device the code runs on (``"cpu"``, ``"cuda"``).
    precisions : tuple of str
        The float precisions it builds (``fp32``; ``fp16``: float16 tensors, float32 accumulation).
    int8_kernels : bool
        Whether the INT8 kernels (``QuantizeGraph``, ``FuseQDQ``) can be scheduled for it.
    int8_weights : str
        How its INT8 kernels take their weights: ``"vnni"``, the packing for AVX512-VNNI (``Int8.vnni_pack``
        where a family has one); ``"avxvnni"``, 256-bit VNNI (conv2d and dense blocks as for VNNI, the
        depthwise taps as ``Int8.pairs_pack``); ``"pairs"``, conv2d and dense 16x4 blocks as int16 pairs for
        the ``vpmaddwd`` step of CPUs without VNNI (``Int8.pairs``, ``pairs_pack``); ``"signed"``, the
        families' packing, conv2d and dense summing their input shifted to int8 (``Int8.signed_data``: s8 x s8
        tensor cores); ``""``, the families' packing.
    int8_blocked : bool
        Whether its INT8 kernels pass uint8 codes NCHW16c where a family has that form (quantize's
        ``layout="blocked"``); else every INT8 kernel reads and writes NCHW.
    applies_tuning_logs : bool
        Whether compile applies records from ``tuning_logs/<target>/``.
    online_tuning : bool
        Whether ``tvmfuse tune`` searches its templates with MetaSchedule (else only offline candidates,
        :meth:`candidates`).
    shared_records : bool
        Whether a compile looks a kernel without an exact record up by its shared form
        (:mod:`tvmfuse.tune.shared_form`), as offline imports file them; a lookup costs about 0.3 ms a kernel, so
        only where records are filed that way.
    fused_recurrence : bool
        Whether LSTM/GRU directions import as the whole-sequence kernels of :mod:`.recurrence` (serial CPU
        loops) instead of unrolled steps.
    tensor_intrin : tuple of str
        The ``tvm.s_tir.tensor_intrin`` modules tuning workers need for it.
    channel_layer_norm : bool
        Whether it computes a LayerNorm over NCHW's channels as one kernel (``FuseLayerNorm`` then rewrites
        the spelt-out channels-first form into ``relax.nn.layer_norm``; else it stays TVM's ops).
    """

    name = ""
    device = "cpu"
    precisions: tuple = ("fp32",)  # what compile(precision=...) may ask of it
    int8_kernels = False
    int8_weights = ""
    int8_blocked = False
    applies_tuning_logs = False
    online_tuning = False  # MetaSchedule templates: `tvmfuse tune` searches and measures here (or over RPC)
    shared_records = False
    fused_recurrence = False
    tensor_intrin: tuple = ()
    channel_layer_norm = False

    def __init__(self, spec):
        self.spec = spec

    def int8_caution(self, weight_bits: int = 8) -> str:
        """What a user quantizing for this target (conv and dense weights of ``weight_bits``) should know before
        shipping it ('' when nothing)."""
        return ""

    # --- the device (asked where the compiler is present; a runtime-only process has the manifest's
    # ``device`` and ``cpu_flags`` instead) ---
    def why_not_runnable(self) -> str:
        """Why code compiled for the target cannot run on this machine ('' when it can)."""
        return f"backend {self.name!r} runs nothing here"

    def can_run(self) -> bool:
        """Whether code compiled for the target runs on this machine."""
        return not self.why_not_runnable()

    def runs_on_this_cpu(self) -> bool:
        """Whether the code runs on this machine's CPU (calibration and op-check run the model there)."""
        return self.device == "cpu" and self.can_run()

    def build_warning(self) -> str:
        """A line a compile warns with when the library it writes cannot run here ('' when none is due)."""
        return ""

    def device_label(self) -> str:
        """The device key of report rows measured with code for the target (``cpu: <CPU>``, ``cuda: <GPU>``)."""
        return self.device

    # --- lowering partitions (LowerPartitions) ---
    def vector_lanes(self) -> int | None:
        """float32 lanes of the widest vector: the block of the NCHW[b]c activation layout, and the width
        depthwise rows are computed in; None keeps every kernel NCHW, rows as they are."""
        return None

    def weight_block(self, fn) -> int | None:
        """oc_block to pre-pack an NCHW partition's conv2d weight with (None: keep OIHW)."""
        return None

    def annotate(self, func, kernel: str):
        """``func`` marked for the MetaSchedule template of ``kernel`` (unchanged when it has none)."""
        return func

    # --- scheduling (ScheduleKernels, tuning validation) ---
    def schedule(self, func):
        """The default schedule of any kernel: tvmfuse's (``tvmfuse.family`` attribute) or TVM's default
        path's. Compile and the validation of tuned kernels both call this."""
        return func

    def serial_check_schedule(self, func):
        """``func`` scheduled as :meth:`schedule` schedules it, for a serial run on this CPU
        (``tvmfuse.fuzz.cuda_cpu``: a GPU kernel's threads one after another); None where the backend's kernels
        run here as they are built."""
        return None

    def default_trace(self, mod):
        """A trace that replays :meth:`schedule` on the kernel of ``mod`` (what a "default kept" tuning
        record stores)."""
        from tvm import s_tir

        return s_tir.Schedule(mod).trace

    # --- the Relax pipeline ---
    def legalize_passes(self, target) -> list:
        """Passes up to the state tuning tasks are extracted from and tuning logs are applied to."""
        from tvm.relax.backend.cpu_generic import pipeline as generic

        return generic.library_dispatch_passes(target) + generic.legalize_passes(target)

    @staticmethod
    def kernel_passes() -> list:
        """TIR passes run on every scheduled kernel, by compile and by the tuner's builder alike (so a tuned
        candidate is timed as compile will build it)."""
        return []

    @staticmethod
    def fallback_passes() -> list:
        """Passes that schedule the kernels the backend's rules left (after :meth:`kernel_passes`, with the
        scheduling: what they make of a kernel is cached with it)."""
        return []

    @staticmethod
    def tir_pipeline() -> str:
        """The name of the TIR pipeline its kernels build with (``tvm.tirx.build``'s ``pipeline``), by compile,
        the kernel cache, tuning and the fuzzer alike."""
        return "default"

    def relax_pipeline(self, target, scheduling: list):
        """The pipeline for ``tvm.compile``; ``scheduling`` (tuning logs, then :meth:`schedule` for every
        kernel, then :meth:`kernel_passes`) runs where the backend schedules kernels."""
        raise NotImplementedError(f"backend {self.name!r} has no Relax pipeline")

    # --- tuning ---
    def register_record_intrinsics(self, names) -> list[str]:
        """Register the tensor intrinsics of this backend among ``names``, those tuning records tensorize with
        (decoding a record looks its intrinsic up by name); return them."""
        return []

    def register_templates(self) -> list[str]:
        """Register the MetaSchedule templates of the rules; return their global names."""
        return []

    def space_size(self, mod) -> int | None:
        """How many schedules the template of ``mod``'s kernel can give (None: no template)."""
        return None

    def candidates(self, mod) -> list:
        """``(config as a dict, trace)`` of each schedule an offline tuning round builds here and times on the
        device (``tvmfuse tune --export-candidates``), the default first; [] for a kernel without knobs."""
        return []

    def space_generator(self):
        """The MetaSchedule design space for kernels with a template."""
        return "post-order-apply"

    # --- build ---
    captures_graphs = False  # whether its runtime can replay a model's kernel launches as one graph

    def toolchain(self) -> str:
        """What decides its code besides tvmfuse, TVM and LLVM (:func:`tvmfuse.cache.fingerprint.versions`) and
        the target: a whole build's cache key takes it ('' when nothing)."""
        return ""

    def build_info(self, graph: bool = False) -> dict:
        """Manifest entries the backend adds for a build (checked before building); ``graph``: the build
        captures its launches in a graph (see :meth:`pass_config`)."""
        return {}

    def pass_config(self, graph: bool = False) -> dict:
        """TVM ``PassContext`` options for a build (``graph``: capture the launches, where it can)."""
        return {}
