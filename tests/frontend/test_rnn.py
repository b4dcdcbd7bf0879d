"""Unrolling LSTM, GRU and RNN into basic ops: the rewritten graph must match onnxruntime on the original."""

import copy

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tvmfuse.errors import UnsupportedOpError
from tvmfuse.frontend.rnn import rewrite_recurrent_ops

from helpers import HOST, make_model, ort_run

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_OUTPUTS = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h"), "RNN": ("Y", "Y_h")}


def recurrent_model(op="LSTM", seq=7, batch=2, inp=5, hidden=6, direction="forward", layout=0, bias=True,
                    initial_h=False, initial_c=False, peepholes=False, outputs=None, constants=False,
                    seq_lens=None, opset=17, seed=0, **attrs):
    """A one-node model ``op(x, W, R, B, sequence_lens, h0, c0, P)``; h0 and c0 are graph inputs."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    g = _GATES[op]

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.5).astype("float32")

    weights = {"W": rand(dirs, g * hidden, inp), "R": rand(dirs, g * hidden, hidden)}
    if bias:
        weights["B"] = rand(dirs, 2 * g * hidden)
    if peepholes:
        weights["P"] = rand(dirs, 3 * hidden)
    nodes, inits = [], []
    for name, value in weights.items():
        if constants:
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name),
                                          name=f"const_{name}"))
        else:
            inits.append(numpy_helper.from_array(value, name))
    if seq_lens is not None:
        inits.append(numpy_helper.from_array(np.array(seq_lens, np.int32), "seq_lens"))
    state = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    graph_inputs = [("x", [batch, seq, inp] if layout else [seq, batch, inp])]
    graph_inputs += [(n, state) for n, on in (("h0", initial_h), ("c0", initial_c)) if on]
    names = ["x", "W", "R", "B" if bias else "", "seq_lens" if seq_lens is not None else "",
             "h0" if initial_h else ""]
    if op == "LSTM":
        names += ["c0" if initial_c else "", "P" if peepholes else ""]
    while names[-1] == "":
        names.pop()
    outputs = _OUTPUTS[op] if outputs is None else outputs
    if layout:
        attrs["layout"] = 1
    nodes.append(helper.make_node(op, names, list(outputs), name="rnn_1", hidden_size=hidden,
                                  direction=direction, **attrs))
    shapes = {"Y": [batch, seq, dirs, hidden] if layout else [seq, dirs, batch, hidden], "Y_h": state, "Y_c": state}
    graph_outputs = [(o, shapes.get(role)) for o, role in zip(outputs, _OUTPUTS[op]) if o]
    return make_model(nodes, graph_inputs, graph_outputs, inits, opset=opset)


def feeds(model, seed=1):
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]).astype("float32")
            for v in model.graph.input}


def check_rewrite(model, replaced=1, reference=None):
    """Rewrite a copy; it must be valid, hold no recurrent op and match onnxruntime on the original.

    ``reference(inputs)`` replaces onnxruntime on the original, which refuses ``layout=1``.
    """
    inputs = feeds(model)
    expected = (reference or (lambda feed: ort_run(model, feed)))(inputs)
    rewritten, n = rewrite_recurrent_ops(copy.deepcopy(model), "m.onnx")
    assert n == replaced
    onnx.checker.check_model(rewritten)
    onnx.shape_inference.infer_shapes(rewritten, check_type=True, strict_mode=True)
    ops = {node.op_type for node in rewritten.graph.node}
    assert not ops & {"LSTM", "GRU", "RNN", "Constant"}
    assert [o.name for o in rewritten.graph.output] == [o.name for o in model.graph.output]
    got = ort_run(rewritten, inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    return rewritten


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_directions(direction, bias):
    check_rewrite(recurrent_model("LSTM", direction=direction, bias=bias))


@pytest.mark.parametrize("seq,batch", [(1, 1), (1, 2), (7, 1)])
def test_lstm_small_shapes(seq, batch):
    check_rewrite(recurrent_model("LSTM", seq=seq, batch=batch, direction="bidirectional", initial_h=True,
                                  initial_c=True))


@pytest.mark.parametrize("initial_h,initial_c", [(True, True), (True, False), (False, True)])
def test_lstm_initial_state(initial_h, initial_c):
    check_rewrite(recurrent_model("LSTM", direction="bidirectional", initial_h=initial_h, initial_c=initial_c))


@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_peepholes(initial, direction):
    check_rewrite(recurrent_model("LSTM", direction=direction, peepholes=True, initial_h=initial,
                                  initial_c=initial))


def check_layout_1(**kwargs):
    """Rewrite a ``layout=1`` model; onnxruntime lacks it, so the reference is layout 0 on transposed tensors."""
    seq_major = recurrent_model(**kwargs)

    def reference(inputs):
        outputs = ort_run(seq_major, {n: v.transpose(1, 0, 2) for n, v in inputs.items()})
        return [v.transpose(2, 0, 1, 3) if v.ndim == 4 else v.transpose(1, 0, 2) for v in outputs]

    check_rewrite(recurrent_model(layout=1, **kwargs), reference=reference)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_layout_1(direction):
    check_layout_1(op="LSTM", direction=direction, initial_h=True, initial_c=True, peepholes=True)


@pytest.mark.parametrize("outputs", [("Y",), ("", "Y_h"), ("", "", "Y_c"), ("Y", "", "Y_c"), ("Y", "Y_h")])
def test_lstm_output_subsets(outputs):
    rewritten = check_rewrite(recurrent_model("LSTM", direction="bidirectional", outputs=outputs))
    produced = {o for node in rewritten.graph.node for o in node.output}
    assert {"Y", "Y_h", "Y_c"} & produced == {o for o in outputs if o}


def test_lstm_weights_from_constant_nodes():
    rewritten = check_rewrite(recurrent_model("LSTM", direction="bidirectional", constants=True, peepholes=True))
    # The old weights are gone; the new ones are named after the node.
    names = {t.name for t in rewritten.graph.initializer}
    assert not names & {"W", "R", "B", "P"}
    assert all(n.startswith("rnn_1/") for n in names)


def test_lstm_clip_and_input_forget():
    check_rewrite(recurrent_model("LSTM", direction="bidirectional", clip=0.7, peepholes=True,
                                  initial_h=True, initial_c=True))
    check_rewrite(recurrent_model("LSTM", direction="bidirectional", input_forget=1, peepholes=True,
                                  initial_h=True, initial_c=True))


def test_full_sequence_lens_accepted():
    check_rewrite(recurrent_model("LSTM", batch=2, direction="bidirectional", seq_lens=[7, 7]))
    check_rewrite(recurrent_model("GRU", batch=2, seq_lens=[7, 7]))


def test_old_opset_attribute_forms():
    # opset 9: Slice and Clip take attributes, LSTM-7 has no layout.
    check_rewrite(recurrent_model("LSTM", direction="bidirectional", opset=9, clip=0.8, initial_h=True))
    check_rewrite(recurrent_model("GRU", opset=9, linear_before_reset=1))


def test_stacked_and_node_names():
    # An LSTM feeding a GRU: the GRU's sequence length comes from shape inference through a Reshape.
    first = recurrent_model("LSTM", direction="bidirectional", outputs=("y1",), hidden=4)
    rng = np.random.default_rng(5)
    w2 = numpy_helper.from_array((rng.standard_normal((1, 9, 8)) * 0.5).astype("float32"), "W2")
    r2 = numpy_helper.from_array((rng.standard_normal((1, 9, 3)) * 0.5).astype("float32"), "R2")
    graph = first.graph
    graph.node.extend([helper.make_node("Transpose", ["y1"], ["y1t"], perm=[0, 2, 1, 3], name="t"),
                       helper.make_node("Reshape", ["y1t", "shape"], ["x2"], name="r"),
                       helper.make_node("GRU", ["x2", "W2", "R2"], ["", "h2"], hidden_size=3, name="gru_2")])
    graph.initializer.extend([w2, r2, numpy_helper.from_array(np.array([7, 2, 8], np.int64), "shape")])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("h2", onnx.TensorProto.FLOAT, [1, 2, 3]))
    rewritten = check_rewrite(first, replaced=2)
    prefixes = {n.name.split("/")[0] for n in rewritten.graph.node}
    assert prefixes == {"rnn_1", "gru_2", "t", "r"}
    assert any(n.name == "gru_2/fw/step6/h" for n in rewritten.graph.node)


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_gru(lbr, direction):
    check_rewrite(recurrent_model("GRU", direction=direction, linear_before_reset=lbr))


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_variants(lbr):
    check_layout_1(op="GRU", direction="bidirectional", linear_before_reset=lbr, initial_h=True)
    check_rewrite(recurrent_model("GRU", direction="bidirectional", linear_before_reset=lbr, bias=False,
                                  outputs=("", "Y_h"), clip=0.6))
    check_rewrite(recurrent_model("GRU", linear_before_reset=lbr, seq=1, batch=1, initial_h=True, clip=0.6))


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("activation", ["Tanh", "Relu"])
def test_rnn(direction, activation):
    dirs = 2 if direction == "bidirectional" else 1
    check_rewrite(recurrent_model("RNN", direction=direction, activations=[activation] * dirs, initial_h=True))
    check_rewrite(recurrent_model("RNN", direction=direction, activations=[activation] * dirs, clip=0.5))
    check_layout_1(op="RNN", direction=direction, seq=1, batch=1, bias=False)


def _error(model) -> str:
    with pytest.raises(UnsupportedOpError) as e:
        rewrite_recurrent_ops(model, "m.onnx")
    message = str(e.value)
    assert "\n" not in message and message.startswith("m.onnx: ") and "'rnn_1'" in message
    return message


def test_dynamic_sequence_length_raises():
    model = recurrent_model("LSTM")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    message = _error(model)
    assert message == ("m.onnx: LSTM node 'rnn_1': input 'x' needs a static sequence length (shape (?, 2, 5)); "
                       "pass shapes= for the model's inputs")
    model = recurrent_model("GRU", layout=1)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    assert "static batch size (shape (?, 7, 5))" in _error(model)


def test_unsupported_attributes_raise():
    assert "sequence_lens [7, 3]" in _error(recurrent_model("LSTM", seq_lens=[7, 3]))
    assert "activation 'HardSigmoid' is not supported" in _error(
        recurrent_model("LSTM", activations=["HardSigmoid", "Tanh", "Tanh"]))
    assert "activation 'LeakyRelu'" in _error(recurrent_model("GRU", activations=["Sigmoid", "LeakyRelu"]))
    assert "direction 'sideways'" in _error(recurrent_model("RNN", direction="sideways"))


def test_runtime_sequence_lens_raise():
    model = recurrent_model("LSTM", seq_lens=[7, 7])
    lens = next(t for t in model.graph.initializer if t.name == "seq_lens")
    model.graph.input.append(helper.make_tensor_value_info("seq_lens", onnx.TensorProto.INT32, [2]))
    model.graph.initializer.remove(lens)
    assert "sequence_lens 'seq_lens' is computed at run time; only full-length" in _error(model)


def test_runtime_weights_raise():
    model = recurrent_model("GRU")
    w = next(t for t in model.graph.initializer if t.name == "W")
    model.graph.input.append(helper.make_tensor_value_info("W", onnx.TensorProto.FLOAT, list(w.dims)))
    model.graph.initializer.remove(w)
    assert "W 'W' is computed at run time" in _error(model)


def test_no_recurrent_ops_is_a_no_op():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, 4])], [("y", [1, 4])])
    assert rewrite_recurrent_ops(model, "m.onnx") == (model, 0)


@pytest.mark.parametrize("op,attrs", [
    ("LSTM", {"direction": "bidirectional", "initial_h": True, "initial_c": True, "peepholes": True}),
    ("LSTM", {"direction": "bidirectional", "layout": 1}),
    ("GRU", {"direction": "bidirectional", "linear_before_reset": 1, "initial_h": True}),
    ("GRU", {"linear_before_reset": 0, "outputs": ("", "Y_h")}),
])
def test_tvm_end_to_end(op, attrs):
    import tvmfuse

    attrs = dict(attrs)
    layout = attrs.pop("layout", 0)
    model = recurrent_model(op, seq=5, batch=2, inp=8, hidden=16, layout=layout, **attrs)
    inputs = feeds(model)
    if layout:  # onnxruntime lacks layout=1: run layout 0 on transposed tensors
        outputs = ort_run(recurrent_model(op, seq=5, batch=2, inp=8, hidden=16, **attrs),
                          {n: v.transpose(1, 0, 2) for n, v in inputs.items()})
        expected = [v.transpose(2, 0, 1, 3) if v.ndim == 4 else v.transpose(1, 0, 2) for v in outputs]
    else:
        expected = ort_run(model, inputs)
    rewritten, _ = rewrite_recurrent_ops(copy.deepcopy(model), "m.onnx")
    cm = tvmfuse.compile(rewritten, target=HOST, layout="nchw")
    got = cm.run(inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)
