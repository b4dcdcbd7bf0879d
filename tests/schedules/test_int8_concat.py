"""The channel concat of uint8 codes (schedules/computes/int8_concat.py, the x86 rule in schedules/x86/codes.py):
bit-exact against its numpy twin in both layouts, inputs already in the output's parameters copied, and the
rule's parts each reading one input."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir

from tvmfuse import targets
from tvmfuse.schedules.computes import int8_concat
from tvmfuse.schedules.x86 import codes as rule

from helpers import HOST

SPEC = targets.resolve(HOST)


def _run(func, args, out_shape):
    lib = tvm.compile(tvm.IRModule({"main": SPEC.backend().schedule(func).with_attr("global_symbol", "main")}),
                      target=SPEC.tvm_target(), tir_pipeline=SPEC.backend().tir_pipeline())
    out = tvm.runtime.tensor(np.zeros(out_shape, "uint8"))
    lib["main"](*[tvm.runtime.tensor(a) for a in args], out)
    return out.numpy()


@pytest.mark.parametrize("shapes", [[(1, 1, 20, 20, 16), (1, 2, 20, 20, 16)],
                                    [(1, 5, 9, 12), (1, 3, 9, 12), (1, 8, 9, 12)],
                                    [(2, 16, 3, 7), (2, 24, 3, 7)]], ids=["nchw16c", "nchw-3", "batch-2"])
def test_concat_matches_numpy(shapes):
    rng = np.random.default_rng(len(shapes))
    codes = [rng.integers(0, 256, s).astype(np.uint8) for s in shapes]
    params = [(int(rng.integers(0, 256)), float(rng.uniform(0.2, 2.5))) for _ in shapes]
    params[-1] = (9, 1.0)  # already in the output's parameters: copied
    func = int8_concat.concat_kernel(shapes, params, 9)
    want = int8_concat.concat_codes_ref(codes, params, 9)
    np.testing.assert_array_equal(_run(func, codes, want.shape), want)
    np.testing.assert_array_equal(want[:, -shapes[-1][1]:], codes[-1])


def test_codes_round_half_up_and_clip():
    q = np.array([0, 10, 255, 13], np.uint8).reshape(1, 4, 1, 1)
    # (q - 10) * 0.5 + 3: -5 + 3 -> 0 (clipped at -3 first: 0); 3; 122.5 + 3 -> 126 (half up); 1.5 + 3 -> 5
    np.testing.assert_array_equal(int8_concat.concat_codes_ref([q], [(10, 0.5)], 3).reshape(-1), [0, 3, 126, 5])


def test_each_part_of_the_rule_reads_one_input():
    from tvm import tirx

    shapes = [(1, 1, 20, 20, 16), (1, 2, 20, 20, 16)]
    sch = s_tir.Schedule(int8_concat.concat_kernel(shapes, [(3, 0.5), (7, 1.0)], 7))
    assert rule.schedule(sch, 16)
    mod = tvm.IRModule({"main": sch.mod["main"]})
    lowered = tvm.transform.Sequential([s_tir.transform.LowerInitBlock(), s_tir.transform.ConvertBlocksToOpaque(),
                                        s_tir.transform.StmtSimplify(), s_tir.transform.LowerOpaqueBlock(),
                                        tirx.transform.FlattenBuffer(), tirx.transform.VectorizeLoop(True)])(mod)
    text = lowered["main"].script()
    assert "Select" not in text and text.count("T.parallel") == 2 and "uint8x16" in text
