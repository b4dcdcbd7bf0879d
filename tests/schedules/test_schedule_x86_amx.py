"""INT8 conv2d on AMX tiles (schedules/x86/int8_amx.py, intrin/amx.py, computes/int8_amx.py).

Bit-exact against ``int8_ref.conv2d_ref`` on any CPU through the emulated tile program (the same tile loads,
stores and strides as the AMX code, each tile a local array); the AMX build's instructions from its assembly;
the AMX code itself where this CPU has AMX (otherwise skipped; ``bench/device/`` runs it on the lent host).
"""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import te

import tvmfuse
from tvmfuse import targets
from tvmfuse.schedules.computes import int8, int8_amx, int8_ref
from tvmfuse.schedules.x86 import int8_amx as rule
from tvmfuse.schedules.x86.intrin import amx

from helpers import HOST
from helpers.int8_kernels import Conv, build, codes, epilogue, kernel_data

SAPPHIRE = {"kind": "llvm", "mcpu": "sapphirerapids"}
HAS_AMX = "amx_int8" in targets._cpuinfo_flags()

CASES = [
    (Conv(64, 32, 14, 1), None),  # one chunk, 2 channel blocks
    (Conv(19, 37, 14, 3, pad=1, act="relu"), None),  # C, O not multiples of 16
    (Conv(3, 20, 15, 7, stride=2, pad=3), None),  # 7x7 stem, stride 2
    (Conv(32, 16, 9, 1, out="float32", act="relu6"), None),  # dequantized output
    (Conv(21, 33, 11, 3, stride=2, residual="uint8", out="int8"), None),  # residual add, no padding
    (Conv(8, 5, 12, 3, pad=2, dilation=2, za=255), None),  # dilation
    (Conv(6, 18, (9, 13), 3, stride=2, pad=(0, 1, 1, 0), n=2, act="relu"), None),  # batch 2, asymmetric
    (Conv(24, 40, 7, 1, act="hardswish"), None),
    (Conv(64, 48, 10, 1, act="requantized_relu", residual="uint8"), None),  # a QDQ model's residual add
    (Conv(130, 64, 28, 1), rule.Config(2, 28, "emulated")),  # 3 chunks, 2 runs x 2 blocks: 4 accumulators
    (Conv(70, 32, 28, 3, pad=1, za=0), rule.Config(1, 4, "emulated")),
    (Conv(40, 32, 14, 3, pad=1), rule.Config(2, 14, "emulated", 2)),  # 2 rows x 2 blocks
    (Conv(24, 16, (10, 7), 3, stride=2, pad=1), rule.Config(1, 4, "emulated", 1)),  # rows 5 x 4 (odd height)
    (Conv(20, 48, (13, 9), 3, stride=2, pad=1, dilation=2), rule.Config(1, 4, "emulated", 2)),  # 2 rows, stride 2
]


def _conv(case: Conv, blocked: bool = False, out_layout: str = "NCHW"):
    n, c, h, w = case.in_shape()
    shape = (n, -(-c // 16), h, w, 16) if blocked else case.in_shape()
    x = te.placeholder(shape, "uint8", name="x")
    wt = te.placeholder((-(-case.o // 16), -(-c // 64), case.k, case.k, 16, 16, 4), "int8", name="w")
    out_shape = int8.out_shape_of(*case.out_shape()[:1], case.o, *case.out_shape()[2:], out_layout)
    lanes = case.o if out_layout == "NCHW" else out_shape[1] * 16  # NCHW16c: bias and multiplier padded
    b, m = te.placeholder((lanes,), "int32", name="b"), te.placeholder((lanes,), "float32", name="m")
    r = te.placeholder(out_shape, case.residual, name="r") if case.residual else None
    out = int8_amx.conv2d_kernel(x, wt, b, m, r, channels=case.o, strides=case.stride, padding=case.pad,
                                 dilation=case.dilation, input_zero_point=case.za,
                                 epilogue=epilogue(case.out, case.act, case.residual), out_layout=out_layout)
    return int8.prim_func([x, wt, b, m] + ([r] if r is not None else []) + [out]), out


def _to_blocked(a: np.ndarray) -> np.ndarray:
    n, c, h, w = a.shape
    full = np.zeros((n, -(-c // 16) * 16, h, w), a.dtype)
    full[:, :c] = a
    return np.ascontiguousarray(full.reshape(n, -1, 16, h, w).transpose(0, 1, 3, 4, 2))


def _check(case: Conv, config, blocked=False, out_layout="NCHW", target=None, kind="emulated"):
    func, out = _conv(case, blocked, out_layout)
    config = config or rule.default_config(-(-case.o // 16), case.out_shape()[3], kind)
    sched = rule.apply(func, config)
    assert sched is not None
    rng = np.random.default_rng(1)
    x = codes(rng, case.in_shape(), "uint8", False)
    w = codes(rng, (case.o, case.c, case.k, case.k), "int8", False)
    bias, mult, res = kernel_data(rng, case.out_shape(), case.o, case.residual, False, case.act)
    ep = epilogue(case.out, case.act, case.residual)
    ref = int8_ref.conv2d_ref(x, w, bias, mult, res, strides=case.stride, padding=case.pad, dilation=case.dilation,
                              input_zero_point=case.za, epilogue=ep)
    blocked_out = out_layout != "NCHW"
    args = [_to_blocked(x) if blocked else x, int8_amx.pack_weight(w), int8_ref.fold_zero_point(bias, w, case.za),
            _padded(mult, out) if blocked_out else mult]
    args[2] = _padded(args[2], out) if blocked_out else args[2]
    if res is not None:
        args.append(_to_blocked(res) if blocked_out else res)
    lib = build(rule.with_tile_state(sched), target or HOST)
    got = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], str(out.dtype)))
    lib.mod["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in args], got)
    got = got.numpy()
    if blocked_out:  # the padded output channels hold the epilogue of a zero sum: not compared
        n, blocks, h, w, _ = got.shape
        got = got.transpose(0, 1, 4, 2, 3).reshape(n, blocks * 16, h, w)[:, :case.o]
    np.testing.assert_array_equal(got, ref)
    if case.out != "float32":
        assert len(np.unique(ref)) > 2
    return config


def _padded(values: np.ndarray, out) -> np.ndarray:
    length = int(out.shape[1]) * 16
    return np.concatenate([values, np.zeros(length - len(values), values.dtype)])


@pytest.mark.parametrize("case,config", CASES, ids=lambda v: str(v) if isinstance(v, Conv) else "")
def test_emulated_tiles_bit_exact(case, config):
    _check(case, config)


def test_blocked_input_and_output():
    """NCHW16c codes in (the padded channels' garbage never read: their weights are zero) and out."""
    _check(Conv(40, 24, 10, 3, pad=1, act="relu", residual="uint8"), None, blocked=True, out_layout="NCHW16c")


def test_weight_packing_round_trip_and_tile_rows():
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (37, 70, 3, 3)).astype(np.int8)
    packed = int8_amx.pack_weight(w)
    assert packed.shape == (3, 2, 3, 3, 16, 16, 4)
    np.testing.assert_array_equal(int8_amx.unpack_weight(packed, 37, 70), w)
    # a tile's row k, column 4i + q: input channel 64c + 4k + q of output 16b + i
    assert packed[1, 0, 2, 1, 5, 3, 2] == w[16 + 3, 4 * 5 + 2, 2, 1]
    assert not packed[:, 1, :, :, 2:].any()  # channels 72.. of chunk 1 are padding


def test_tile_config_record():
    record = amx.tile_config(amx.Shape(2, 1, 28, 1, 3, 3))  # 2 blocks x 2 runs of 14: accumulators 0-3, A 4-5, B 6-7
    assert record[0] == 1 and len(record) == 64
    assert [record[48 + t] for t in range(8)] == [14, 14, 14, 14, 14, 14, 16, 16]
    assert all(record[16 + 2 * t] == 64 and record[17 + 2 * t] == 0 for t in range(8))
    assert not any(record[1:16]) and not any(record[32:48]) and not any(record[56:])
    two_rows = amx.tile_config(amx.Shape(1, 2, 7, 1, 1, 1))  # 1 block x 2 rows of 7: accumulators 0-1, A 4-5, B 6
    assert two_rows[48:56] == [7, 7, 0, 0, 7, 7, 16, 0]
    assert [two_rows[16 + 2 * t] for t in range(8)] == [64, 64, 0, 0, 64, 64, 64, 0]
    with pytest.raises(ValueError):
        amx.Shape(3, 1, 8, 1, 1, 1)  # 3 weight tiles
    with pytest.raises(ValueError):
        amx.Shape(1, 2, 28, 1, 1, 1)  # 4 runs of pixels
    with pytest.raises(ValueError):
        amx.groups_of(33)


def test_the_kernel_loads_the_record_once_per_thread():
    """The tile program loads no shapes; the kernel stores tile_config's 64 bytes as 8 little-endian words and
    runs ldtilecfg where each thread starts its share of the output tiles (the parallel launch point), after the
    input's packing and before the tiles' loop; a kernel too small for threads loads them before that loop."""
    assert "ldtilecfg" not in amx.impl("amx", amx.Shape(2, 1, 28, 1, 3, 3)).script()
    for case, parallel in ((Conv(70, 32, 28, 3, pad=1), True), (Conv(64, 16, 2, 1), False)):
        func, _ = _conv(case)
        sched = rule.apply(func)
        config = rule.default_config(-(-case.o // 16), case.out_shape()[3], out_height=case.out_shape()[2])
        shape = amx.Shape(config.oc_blocks, config.out_rows, config.pixels, -(-case.c // 64), case.k, case.k)
        text = rule.with_tile_state(sched).script()
        words = [int(v) for v in re.findall(r"T.uint64\((\d+)\)", text)][:8]  # then the restore's palette mask
        assert b"".join(w.to_bytes(8, "little") for w in words) == bytes(amx.tile_config(shape))
        load, tiles = text.index("llvm.x86.ldtilecfg"), text.index("llvm.x86.tdpbusd")
        assert text.index("sblock(\"data_pack\")") < text.index("llvm.x86.sttilecfg") < load < tiles
        assert text.index("T.uint64(") < load
        # the thread's own shapes put back after the tiles (or released when it had none)
        assert tiles < text.rindex("llvm.x86.ldtilecfg") and tiles < text.index("llvm.x86.tilerelease")
        assert text.count("llvm.x86.ldtilecfg") == 2
        assert ("pragma_parallel_launch_point" in text) == parallel
        # the accumulators' init block is dead (the tile program starts from tilezero) and dropped
        assert "conv2d_int8_init" in sched.script() and "conv2d_int8_init" not in text
        if parallel:
            assert text.index("pragma_parallel_launch_point") < load < text.index("T.parallel", load)


def test_default_tiles():
    assert rule.default_config(4, 56, out_height=56) == rule.Config(2, 28)  # 2 runs of a row
    assert rule.default_config(4, 14, out_height=14) == rule.Config(2, 14, out_rows=2)  # 2 rows of one run
    assert rule.default_config(3, 7, out_height=7) == rule.Config(1, 7)  # an odd height: one row
    assert rule.default_config(2, 13, out_height=2) == rule.Config(2, 13, out_rows=2)
    assert rule.default_config(2, 17) == rule.Config(2, 1)  # a prime row over 16: one pixel a tile


def _amx_assembly(case: Conv, blocked: bool = False) -> str:
    func, _ = _conv(case, blocked, "NCHW16c" if blocked else "NCHW")
    sched = rule.with_tile_state(rule.apply(func))
    return build(sched, SAPPHIRE).mod.inspect_source("asm")


def test_amx_build_instructions():
    """2 chunks x 9 taps x (2 runs x 2 blocks): per tap 4 tdpbusd, 2 data and 2 weight loads; the accumulators
    zeroed in their tiles and stored once, no memset of the local buffer they go to; the tiles configured once
    per call, the tile state asked for once per kernel."""
    asm = _amx_assembly(Conv(70, 32, 28, 3, pad=1))
    found = collections.Counter(re.findall(r"\b(ldtilecfg|tileloadd|tilezero|tdpbusd|tilestored|vpdpbusd)\b", asm))
    # ldtilecfg: the kernel's shapes, then the thread's own put back
    assert found == {"tdpbusd": 72, "tileloadd": 18 * 4, "tilezero": 4, "tilestored": 4, "ldtilecfg": 2}, found
    assert re.search(r"call\w*\s+syscall", asm) and "memset" not in asm


def test_blocked_codes_are_packed_with_plain_moves():
    """From NCHW16c codes (what INT8 kernels pass each other) each 16 channels of a pixel are one 16-byte move
    into the 64-channel pixel, and the NCHW16c output is stored from the accumulators as they lie: no gathers,
    no byte inserts."""
    asm = _amx_assembly(Conv(64, 32, 14, 3, pad=1), blocked=True)
    # 14-wide rows: 2 rows x 2 blocks, 4 accumulators; per tap 4 tdpbusd on 2 data and 2 weight loads
    assert asm.count("tdpbusd") == 9 * 4 and asm.count("tileloadd") == 9 * 4
    assert not re.search(r"\b(vpgather\w+|vpinsrb|vpextrb)\b", asm)


def _quantize_for_sapphire(model, calib):
    """Quantized for a Sapphire Rapids: a CPU without AMX calibrates on its own code and says so."""
    if HAS_AMX:
        return tvmfuse.quantize(model, calib=calib, target=SAPPHIRE)
    with pytest.warns(UserWarning, match="lacks"):
        return tvmfuse.quantize(model, calib=calib, target=SAPPHIRE)


def test_quantize_for_an_amx_cpu_puts_convs_on_tiles(tmp_path):
    """The passes pack conv weights into tiles for a target with amx-int8 (dense stays on VNNI), not for
    x86-avx512, which turns AMX off."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 64, 3, 3)).astype(np.float32) * 0.1, "W")
    d = numpy_helper.from_array(rng.standard_normal((10, 32 * 8 * 8)).astype(np.float32) * 0.1, "D")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Gemm", ["f", "D"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], [w, d])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    calib = [{"x": rng.random((1, 64, 8, 8)).astype(np.float32)}]
    assert targets.resolve(SAPPHIRE).backend().int8_weights == "amx"
    assert targets.resolve("x86-avx512").backend().int8_weights == "vnni"
    tiles = _quantize_for_sapphire(model, calib)
    asm = tiles.kernel_source("asm")
    assert asm.count("ldtilecfg") == 2 and "vpdpbusd" in asm  # the conv on tiles (load, restore), dense on VNNI
    plain = tvmfuse.quantize(model, calib=calib, target="x86-avx512").kernel_source("asm")
    assert "tdpbusd" not in plain and "ldtilecfg" not in plain


def test_a_conv_of_few_input_channels_keeps_vnni():
    """An RGB stem would use 3 of a tile row's 64 channels, MobileNetV2's 24 -> 144 conv 24: a conv that fills
    less than int8_amx.MIN_SHARE of its tile rows stays on VNNI."""
    assert [c for c in range(1, 200) if int8_amx.takes_tiles(c)] == list(range(39, 65)) + list(range(77, 200))
    rng = np.random.default_rng(0)
    stem = numpy_helper.from_array(rng.standard_normal((48, 3, 3, 3)).astype(np.float32) * 0.3, "S")
    body = numpy_helper.from_array(rng.standard_normal((32, 48, 3, 3)).astype(np.float32) * 0.1, "W")
    nodes = [helper.make_node("Conv", ["x", "S"], ["s"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Conv", ["r", "W"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [stem, body])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    built = _quantize_for_sapphire(model, [{"x": rng.random((1, 3, 8, 8)).astype(np.float32)}])
    asm = built.kernel_source("asm")
    assert asm.count("ldtilecfg") == 2 and "vpdpbusd" in asm  # the 48-channel conv on tiles, the stem on VNNI


def test_unmarked_kernels_are_left_alone():
    func, _ = _conv(Conv(16, 16, 7, 1))
    emulated = rule.apply(func, rule.Config(1, 7, "emulated"))
    assert rule.with_tile_state(emulated).same_as(emulated)


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX (amx_int8); the emulated tiles are checked above")
@pytest.mark.parametrize("case,config", CASES[:4] + CASES[8:], ids=lambda v: str(v) if isinstance(v, Conv) else "")
def test_amx_tiles_bit_exact(case, config):
    _check(case, config and rule.Config(config.oc_blocks, config.pixels), target=SAPPHIRE, kind="amx")


def _tile_shapes_probe():
    """Two functions for the calling thread: ``set(record)`` loads a tile configuration (after asking Linux for
    the tile state), ``get(out)`` stores the current one (64 zero bytes in the INIT state)."""
    from tvm.script import tirx as T

    @T.prim_func
    def put(a: T.Buffer((8,), "uint64")):
        T.evaluate(T.call_extern("int64", "syscall", T.int64(158), T.int64(0x1023), T.int64(18)))
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", a.access_ptr("r")))

    @T.prim_func
    def get(a: T.Buffer((8,), "uint64")):
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.sttilecfg", a.access_ptr("w")))

    lib = tvm.compile(tvm.IRModule({"put": put.with_attr("global_symbol", "put"),
                                    "get": get.with_attr("global_symbol", "get")}),
                      target=targets.resolve(SAPPHIRE).tvm_target())
    return lib["put"], lib["get"]


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX (amx_int8): the restore is checked by structure above")
def test_a_threads_own_tile_shapes_survive_a_kernel():
    """Other libraries load their tile shapes once per thread and count on them (onnxruntime's AMX QGEMM hit
    SIGILL on the calling thread after a kernel had loaded others): a kernel puts back the calling thread's
    shapes, or releases the tiles when it had none. A kernel too small for threads runs on the calling thread."""
    put, get = _tile_shapes_probe()
    func, _ = _conv(Conv(64, 16, 2, 1))
    lib = build(rule.with_tile_state(rule.apply(func)), SAPPHIRE)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.integers(0, 100, [int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)))
            for p in func.params]
    theirs = amx.tile_config(amx.Shape(2, 1, 32, 1, 1, 1))  # 16-row tiles, as onnxruntime's
    words = np.frombuffer(bytes(theirs), np.uint64).copy()
    for before in (words, np.zeros(8, np.uint64)):
        put(tvm.runtime.tensor(before)) if before.any() else None
        if not before.any():
            put(tvm.runtime.tensor(np.frombuffer(bytes(64), np.uint64).copy()))  # palette 0: back to INIT
        lib.mod["main"](*args)
        now = tvm.runtime.tensor(np.full(8, 7, np.uint64))
        get(now)
        np.testing.assert_array_equal(now.numpy(), before)


_ONNXRUNTIME_AFTER_A_KERNEL = """
import numpy as np, onnxruntime as ort, tvmfuse
from onnx import TensorProto, helper, numpy_helper
rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.integers(-128, 128, (64, 37)).astype(np.int8), "w")
mm = helper.make_graph([helper.make_node("MatMulInteger", ["x", "w"], ["y"])], "mm",
                       [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 3, 64])],
                       [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [w])
sess = ort.InferenceSession(helper.make_model(mm, opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
                            .SerializeToString(), providers=["CPUExecutionProvider"])
x = {"x": rng.integers(0, 256, (2, 3, 64)).astype(np.uint8)}
first = sess.run(None, x)[0]  # onnxruntime's AMX QGEMM loads its tile shapes on this thread
W = numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.1, "W")
conv = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])], "c",
                         [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 28, 28])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [W])
cm = tvmfuse.quantize(helper.make_model(conv, opset_imports=[helper.make_opsetid("", 17)], ir_version=9),
                      calib=[{"x": rng.random((1, 64, 28, 28)).astype(np.float32)}], target="x86-host")
assert "tdpbusd" in cm.kernel_source("asm")
cm.run({"x": rng.random((1, 64, 28, 28)).astype(np.float32)})  # a parallel kernel on tiles
assert (sess.run(None, x)[0] == first).all()  # SIGILL here before the kernels put the shapes back
"""


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX (amx_int8): the restore is checked by structure above")
def test_onnxruntime_int8_runs_after_a_kernel_on_tiles():
    """The user's case: onnxruntime's INT8 GEMM, a tvmfuse library on tiles, onnxruntime again, one process (a
    subprocess here: the failure is a SIGILL)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ONNXRUNTIME_AFTER_A_KERNEL], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
