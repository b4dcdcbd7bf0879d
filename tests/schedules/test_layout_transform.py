"""The x86 layout transforms (schedules/x86/layout.py): NCHW <-> NCHW[b]c moved in b x v tiles.

Numbers: exact against numpy for rows a vector divides and rows it does not, both blocks, float32, uint8 and
int8 (codes back to NCHW through the 16 x 16 byte transpose). Structure: no vectorized loop wider than two of
the target's vectors (a 320-lane vector once cost 20 s of LLVM time for one kernel; a 25-pixel row no vector
divides is one short vector, 0.06 s), the channel loop of a tile unrolled, the rows in parallel.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.tirx import ForKind

from tvmfuse import targets
from tvmfuse.schedules.computes import blocked
from tvmfuse.schedules.x86 import layout

from helpers import HOST

SPEC = targets.resolve(HOST)
LANES = SPEC.vector_bits() // 32


def _kernel(direction: str, plain_shape, block: int, dtype: str):
    n, c, h, w = plain_shape
    if direction == "to_plain":
        data = te.placeholder((n, c // block, h, w, block), dtype, name="data")
        return te.create_prim_func([data, blocked.to_plain(data)])
    data = te.placeholder(plain_shape, dtype, name="data")
    return te.create_prim_func([data, blocked.to_blocked(data, block)])


def _loops(func):
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_child_blocks(sch.get_sblock("root"))[0]
    return [sch.get(loop) for loop in sch.get_loops(block)]


@pytest.mark.parametrize("direction", ["to_plain", "to_blocked"])
@pytest.mark.parametrize("plain_shape,block", [((1, 16, 320, 320), 16), ((1, 48, 20, 40), 16),
                                               ((2, 24, 7, 12), 8), ((1, 32, 5, 25), 16), ((1, 8, 3, 3), 8)])
@pytest.mark.parametrize("dtype", ["float32", "uint8", "int8"])
def test_transform_is_exact(direction, plain_shape, block, dtype):
    func = layout.apply(_kernel(direction, plain_shape, block, dtype), LANES)
    assert func is not None
    n, c, h, w = plain_shape
    rng = np.random.default_rng(0)
    plain = rng.integers(0, 255, plain_shape).astype(dtype)
    blocked_array = plain.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2).copy()
    src, want = (blocked_array, plain) if direction == "to_plain" else (plain, blocked_array)
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=SPEC.tvm_target())
    args = [tvm.runtime.tensor(src), tvm.runtime.tensor(np.zeros(want.shape, dtype))]
    lib["main"](*args)
    np.testing.assert_array_equal(args[1].numpy(), want)


@pytest.mark.parametrize("direction", ["to_plain", "to_blocked"])
def test_tiles_are_vector_by_block(direction):
    loops = _loops(layout.apply(_kernel(direction, (1, 32, 320, 320), 16, "float32"), LANES))
    kinds = [loop.kind for loop in loops]
    assert kinds[0] == ForKind.PARALLEL and kinds[-2:] == [ForKind.UNROLLED, ForKind.VECTORIZED]
    assert int(loops[-1].extent) == LANES and int(loops[-2].extent) == 16


@pytest.mark.parametrize("direction", ["to_plain", "to_blocked"])
@pytest.mark.parametrize("width", [320, 65, 25, 7])
def test_no_vector_is_wider_than_the_target(direction, width):
    loops = _loops(layout.apply(_kernel(direction, (1, 16, 4, width), 16, "float32"), LANES))
    assert all(int(loop.extent) <= 2 * LANES for loop in loops if loop.kind == ForKind.VECTORIZED)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_byte_codes_go_back_to_nchw_as_16x16_tiles_transposed_in_registers(dtype):
    """INT8 codes in blocks of 16, a row 16 divides: 16 loads, four rounds of 16 interleaves, 16 stores per tile
    (``intrin/transpose_bytes.py``), no vector gather; other rows keep the vector-by-block tile."""
    script = layout.apply(_kernel("to_plain", (1, 32, 6, 48), 16, dtype), LANES).script()
    assert script.count("T.Shuffle") == 64 and "T.vectorized" not in script
    assert "T.parallel" in script
    for other in (_kernel("to_plain", (1, 32, 6, 40), 16, dtype), _kernel("to_plain", (1, 32, 6, 48), 8, dtype),
                  _kernel("to_blocked", (1, 32, 6, 48), 16, dtype)):
        assert "T.Shuffle" not in layout.apply(other, LANES).script()


def test_other_kernels_are_not_taken():
    a = te.placeholder((4, 16), name="a")
    assert layout.apply(te.create_prim_func([a, te.compute((4, 16), lambda i, j: a[i, j] * 2, name="to_x")]),
                        LANES) is None
