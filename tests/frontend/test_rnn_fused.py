"""Whole-sequence LSTM and GRU kernels (CPU targets): one kernel per layer (its directions in parallel) instead
of the unrolled steps; numbers against onnxruntime, which variants stay unrolled, and the kernels alone against
numpy."""

import numpy as np
import pytest
import tvm

import tvmfuse
from tvmfuse import frontend, targets
from tvmfuse.frontend import rnn_fused
from tvmfuse.schedules.computes import recurrence

from helpers import HOST, ort_run
from test_rnn import feeds, recurrent_model


def _expected(layout, **kwargs):
    """onnxruntime's outputs for ``recurrent_model(layout=layout, **kwargs)`` (layout 1: layout 0 on transposed
    tensors, which onnxruntime lacks) and the model."""
    model = recurrent_model(layout=layout, **kwargs)
    inputs = feeds(model)
    if not layout:
        return model, inputs, ort_run(model, inputs)
    outputs = ort_run(recurrent_model(**kwargs), {n: v.transpose(1, 0, 2) for n, v in inputs.items()})
    return model, inputs, [v.transpose(2, 0, 1, 3) if v.ndim == 4 else v.transpose(1, 0, 2) for v in outputs]


def _recurrent_kernels(cm) -> list[str]:
    return sorted(gv.name_hint for gv, f in cm.lowered.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and f.attrs.get("tvmfuse.family") == "recurrence")


CASES = [
    ("LSTM", 0, {"direction": "forward"}),
    ("LSTM", 0, {"direction": "reverse", "bias": False}),
    ("LSTM", 0, {"direction": "bidirectional", "initial_h": True, "initial_c": True}),
    ("LSTM", 0, {"direction": "bidirectional", "initial_c": True, "outputs": ("", "Y_h", "Y_c")}),
    ("LSTM", 0, {"direction": "forward", "seq": 1, "batch": 3, "outputs": ("Y", "", "Y_c")}),
    ("LSTM", 1, {"direction": "bidirectional", "initial_h": True}),
    ("LSTM", 0, {"direction": "forward", "hidden": 48, "inp": 16, "seq": 9}),
    # from recurrence.SPLIT_FROM units each step is split over the threads, the weight packed per slice
    ("LSTM", 0, {"direction": "bidirectional", "hidden": 256, "inp": 8, "seq": 4, "initial_h": True,
                 "initial_c": True}),
    ("LSTM", 1, {"direction": "reverse", "hidden": 256, "inp": 8, "seq": 3, "batch": 2}),
    ("GRU", 0, {"direction": "forward"}),
    ("GRU", 0, {"direction": "bidirectional", "initial_h": True}),
    ("GRU", 0, {"direction": "reverse", "linear_before_reset": 1, "initial_h": True}),
    ("GRU", 0, {"direction": "bidirectional", "linear_before_reset": 1, "bias": False}),
    ("GRU", 1, {"direction": "bidirectional", "linear_before_reset": 1, "outputs": ("", "Y_h")}),
    ("GRU", 0, {"direction": "forward", "hidden": 12, "batch": 1}),
]


@pytest.mark.parametrize("op,layout,attrs", CASES, ids=[f"{c[0]}-l{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_fused_directions_match_onnxruntime(op, layout, attrs):
    model, inputs, expected = _expected(layout, op=op, **attrs)
    cm = tvmfuse.compile(model, target=HOST)
    assert len(_recurrent_kernels(cm)) == 1
    got = cm.run(inputs)
    assert len(got) == len(expected)
    # 256 units: each gate sums 256 products of size ~0.5, in another order than onnxruntime's GEMM
    atol = 2e-5 if attrs.get("hidden", 0) >= 256 else 2e-6
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("op,attrs", [
    ("LSTM", {"peepholes": True}),
    ("LSTM", {"clip": 1.5}),
    ("LSTM", {"input_forget": 1}),
    ("LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"] * 2}),
    ("GRU", {"activations": ["Sigmoid", "Relu"] * 2}),
    ("RNN", {}),
])
def test_other_cells_stay_unrolled(op, attrs):
    model = recurrent_model(op, direction="bidirectional", **attrs)
    inputs = feeds(model)
    cm = tvmfuse.compile(model, target=HOST)
    assert _recurrent_kernels(cm) == []
    for g, e in zip(cm.run(inputs), ort_run(model, inputs)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_only_cpu_targets_fuse():
    """The fused node exists for CPU targets only: CUDA's import unrolls (the kernel has no thread binding)."""
    model = recurrent_model("LSTM", direction="bidirectional")
    cpu, *_ = frontend.prepare(model, fused_recurrence=True)
    cuda, *_ = frontend.prepare(model, fused_recurrence=False)
    assert [n.op_type for n in cpu.graph.node if n.domain == rnn_fused.DOMAIN] == [rnn_fused.OP_TYPE]
    assert not [n for n in cuda.graph.node if n.domain == rnn_fused.DOMAIN]
    assert not targets.resolve("cuda-sm90").backend().fused_recurrence
    assert targets.resolve(HOST).backend().fused_recurrence


def test_a_stacked_model_has_one_kernel_per_layer():
    """CRNN-like: a bidirectional LSTM feeding a bidirectional GRU compiles to 2 recurrent kernels, and far
    fewer kernel calls than the unrolled steps."""
    from tvmfuse import zoo

    cm = tvmfuse.compile(zoo.get("crnn"), target=HOST, shapes=zoo.default_shapes("crnn"))
    assert len(_recurrent_kernels(cm)) == 2
    outputs = cm.lowered["main"].script().count("R.vm.alloc_tensor(")  # one per kernel output
    assert 10 < outputs < 60, outputs  # unrolled, each of the 124 steps allocated 3-4


# ----------------------------------------------------------------------------------------- the kernels alone

def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _run(func, args, outs):
    lib = tvm.tirx.build(func.with_attr("global_symbol", "k"), target=targets.resolve(HOST).tvm_target())
    bufs = [tvm.runtime.tensor(np.zeros(s, "float32")) for s in outs]
    lib["k"](*[tvm.runtime.tensor(a) for a in args], *bufs)
    return [b.numpy() for b in bufs]


def _directions(dirs: int, reverse: bool):
    """Whether each direction runs from the last step (ONNX: a bidirectional layer's second one)."""
    return [False, True] if dirs == 2 else [reverse]


def _numpy_lstm(x, rt, h, c, reverse):
    seq, hidden = x.shape[0], rt.shape[0]
    y = np.zeros((seq,) + h.shape)
    for t in (reversed(range(seq)) if reverse else range(seq)):
        g = x[t] + h @ rt
        i, o, f = (_sigmoid(g[:, k * hidden:(k + 1) * hidden]) for k in range(3))
        c = f * c + i * np.tanh(g[:, 3 * hidden:])
        h = o * np.tanh(c)
        y[t] = h
    return y, h, c


@pytest.mark.parametrize("hidden", [6, 8, 48])
@pytest.mark.parametrize("dirs,reverse", [(1, False), (1, True), (2, False)])
def test_lstm_kernel_against_numpy(hidden, dirs, reverse):
    rng = np.random.default_rng(hidden)
    seq, batch = 5, 2
    x, rt = rng.standard_normal((seq, batch, dirs * 4 * hidden)), rng.standard_normal((dirs, hidden, 4 * hidden)) * 0.5
    h, c = rng.standard_normal((dirs, batch, hidden)), rng.standard_normal((dirs, batch, hidden))
    args = [a.astype("float32") for a in (x, rt, h, c)]
    last = (dirs, batch, hidden)
    y, h_out, c_out = _run(recurrence.lstm_kernel(seq, batch, hidden, dirs, reverse), args,
                           [(seq, dirs, batch, hidden), last, last])
    for d, rev in enumerate(_directions(dirs, reverse)):
        ey, eh, ec = _numpy_lstm(x[:, :, d * 4 * hidden:(d + 1) * 4 * hidden], rt[d], h[d], c[d], rev)
        np.testing.assert_allclose(y[:, d], ey, atol=2e-6)
        np.testing.assert_allclose(h_out[d], eh, atol=2e-6)
        np.testing.assert_allclose(c_out[d], ec, atol=2e-6)


@pytest.mark.parametrize("hidden,codes", [(8, "int8"), (6, "int16"), (48, "int8")])
@pytest.mark.parametrize("dirs", [1, 2])
def test_lstm_codes_kernel_against_numpy(hidden, codes, dirs):
    """The kernel on integer codes and a scale per gate column (a quantized model's ``R``): the float LSTM on
    ``codes * scale``; hidden sizes with and without the four-row step (6 has none)."""
    rng = np.random.default_rng(hidden + dirs)
    seq, batch, limit = 5, 2, 127 if codes == "int8" else 3000
    x = rng.standard_normal((seq, batch, dirs * 4 * hidden)).astype("float32")
    q = rng.integers(-limit, limit + 1, (dirs, hidden, 4 * hidden)).astype(codes)
    scale = rng.uniform(0.5, 1.0, (dirs, 4 * hidden)).astype("float32") / limit
    h, c = (rng.standard_normal((dirs, batch, hidden)).astype("float32") for _ in range(2))
    last = (dirs, batch, hidden)
    y, h_out, c_out = _run(recurrence.lstm_kernel(seq, batch, hidden, dirs, codes=codes), [x, q, h, c, scale],
                           [(seq, dirs, batch, hidden), last, last])
    rt = q.astype(np.float64) * scale[:, None, :]
    for d, rev in enumerate(_directions(dirs, False)):
        ey, eh, ec = _numpy_lstm(x[:, :, d * 4 * hidden:(d + 1) * 4 * hidden], rt[d], h[d], c[d], rev)
        np.testing.assert_allclose(y[:, d], ey, atol=2e-6)
        np.testing.assert_allclose(h_out[d], eh, atol=2e-6)
        np.testing.assert_allclose(c_out[d], ec, atol=2e-6)


def _numpy_gru(x, rt, h, rb, lbr, reverse):
    seq, hidden = x.shape[0], rt.shape[0]
    y = np.zeros((seq,) + h.shape)
    for t in (reversed(range(seq)) if reverse else range(seq)):
        g = h @ rt
        z = _sigmoid(x[t, :, :hidden] + g[:, :hidden])
        r = _sigmoid(x[t, :, hidden:2 * hidden] + g[:, hidden:2 * hidden])
        if lbr:
            cand = np.tanh(x[t, :, 2 * hidden:] + r * (g[:, 2 * hidden:] + rb))
        else:
            cand = np.tanh(x[t, :, 2 * hidden:] + (r * h) @ rt[:, 2 * hidden:])
        h = (1 - z) * cand + z * h
        y[t] = h
    return y, h


@pytest.mark.parametrize("lbr", [False, True])
@pytest.mark.parametrize("dirs,reverse", [(1, False), (1, True), (2, False)])
def test_gru_kernel_against_numpy(lbr, dirs, reverse):
    rng = np.random.default_rng(int(lbr))
    seq, batch, hidden = 4, 3, 8
    x, rt = rng.standard_normal((seq, batch, dirs * 3 * hidden)), rng.standard_normal((dirs, hidden, 3 * hidden)) * 0.5
    h, rb = rng.standard_normal((dirs, batch, hidden)), rng.standard_normal((dirs, hidden))
    args = [a.astype("float32") for a in (x, rt, h, rb)]
    y, h_out = _run(recurrence.gru_kernel(seq, batch, hidden, dirs, reverse, lbr), args,
                    [(seq, dirs, batch, hidden), (dirs, batch, hidden)])
    for d, rev in enumerate(_directions(dirs, reverse)):
        ey, eh = _numpy_gru(x[:, :, d * 3 * hidden:(d + 1) * 3 * hidden], rt[d], h[d], rb[d], lbr, rev)
        np.testing.assert_allclose(y[:, d], ey, atol=2e-6)
        np.testing.assert_allclose(h_out[d], eh, atol=2e-6)


def test_directions_run_in_parallel():
    """A bidirectional layer's kernel launches its directions as parallel tasks (one launch, no barrier per
    step); a single direction has nothing to run beside it. From SPLIT_FROM units the steps are split over the
    threads instead: one launch per call, a barrier per step (and one after the initial state)."""
    target = targets.resolve(HOST).tvm_target()
    for dirs, hidden, launches, barriers in ((2, 32, 1, False), (1, 32, 0, False), (2, 256, 1, True),
                                             (1, 512, 1, True)):
        func = recurrence.lstm_kernel(7, 1, hidden, dirs).with_attr("global_symbol", "k")
        ir = tvm.tirx.build(func, target=target).inspect_source("ll")
        assert ir.count("load ptr, ptr @__TVMBackendParallelLaunch") == launches, (dirs, hidden)
        # LLVM copies the step loop's barrier call as it unrolls: sites, not a count per step
        assert ("load ptr, ptr @__TVMBackendParallelBarrier" in ir) == barriers, (dirs, hidden)


def test_split_lstm_against_numpy():
    """The split kernel (SPLIT_FROM units or more) on pack_split's weight: every direction, batch 2, 4 and 8
    slices; run in the pool's threads, whatever their number."""
    for hidden, dirs, reverse in ((256, 2, False), (320, 1, True)):
        rng = np.random.default_rng(hidden)
        seq, batch = 4, 2
        x = rng.standard_normal((seq, batch, dirs * 4 * hidden)).astype("float32")
        rt = (rng.standard_normal((dirs, hidden, 4 * hidden)) * 0.05).astype("float32")
        h, c = (rng.standard_normal((dirs, batch, hidden)).astype("float32") for _ in range(2))
        parts = recurrence.parts_for(hidden)
        assert parts == (8 if hidden == 256 else 4)
        last = (dirs, batch, hidden)
        y, h_out, c_out = _run(recurrence.lstm_kernel(seq, batch, hidden, dirs, reverse),
                               [x, recurrence.pack_split(rt, parts), h, c], [(seq, dirs, batch, hidden), last, last])
        for d, rev in enumerate(_directions(dirs, reverse)):
            ey, eh, ec = _numpy_lstm(x[:, :, d * 4 * hidden:(d + 1) * 4 * hidden], rt[d], h[d], c[d], rev)
            np.testing.assert_allclose(y[:, d], ey, atol=2e-6)
            np.testing.assert_allclose(h_out[d], eh, atol=2e-6)
            np.testing.assert_allclose(c_out[d], ec, atol=2e-6)


def test_pack_split_layout():
    rt = np.arange(2 * 16 * 64, dtype=np.float32).reshape(2, 16, 64)  # 16 units, 4 slices of 4
    packed = recurrence.pack_split(rt, 4)
    assert packed.shape == (2, 4, 16, 16)
    assert packed[1, 2, 5, 3 * 4 + 1] == rt[1, 5, 3 * 16 + 2 * 4 + 1]  # gate 3, slice 2, unit 1 of the slice
    assert recurrence.pack_split(rt, 1) is rt
    assert recurrence.parts_for(255) == 1 and recurrence.parts_for(512, "int8") == 1


def test_fast_exp_accuracy():
    """The kernels' exponential (TVM's fast_exp polynomial) over [-80, 80], relative to float64."""
    from tvm import te

    xs = np.linspace(-80, 80, 4096).astype("float32")
    a = te.placeholder((xs.size,), "float32", name="a")
    out = te.compute(a.shape, lambda i: recurrence.fast_exp(a[i]), name="e")
    func = te.create_prim_func([a, out]).with_attr("global_symbol", "k")
    lib = tvm.tirx.build(func, target=targets.resolve(HOST).tvm_target())
    got = tvm.runtime.tensor(np.zeros_like(xs))
    lib["k"](tvm.runtime.tensor(xs), got)
    rel = np.abs(got.numpy() / np.exp(xs.astype(np.float64)) - 1)
    assert rel.max() < 5e-7, rel.max()


def test_recurrent_kernels_are_not_tuning_tasks():
    """Written scheduled (serial steps, nothing to search): ``tvmfuse tune`` leaves them out."""
    from tvmfuse.tune import tuner

    model = recurrent_model("LSTM", direction="bidirectional", hidden=16, inp=8)
    names = [t.name for t in tuner.extract_tasks(model, targets.resolve(HOST))]
    assert names and not [n for n in names if "lstm" in n], names
