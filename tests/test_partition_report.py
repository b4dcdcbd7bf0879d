"""`tvmfuse partition`: the report, the 95% FLOPs bar on the zoo, and op-check mode."""

import re

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse import cli, model_info, targets
from tvmfuse.opcheck import OpCheckError
from tvmfuse.partition_report import partitions
from tvmfuse.schedules.computes import blocked

from helpers import HOST
from helpers import make_model

ZOO = ["tiny_convnet", "mobilenet_v2", "resnet18", "resnet50", "efficientnet_lite0"]


@pytest.mark.parametrize("name", ZOO)
def test_zoo_flops_in_partitions(name):
    report = partitions(f"zoo:{name}", target=HOST)
    assert re.fullmatch(r"\d+ ops, \d+ in partitions, \d+\.\d% of conv/dense FLOPs, \d+ layout transforms.*",
                        report.summary())
    assert report.flops_share >= 0.95
    # The partitions account for exactly the conv/gemm FLOPs `tvmfuse info` counts on the ONNX graph.
    assert sum(p.flops for p in report.partitions) == model_info.info(f"zoo:{name}").flops
    assert report.ops_in_partitions <= report.num_ops
    assert all(o.reason for o in report.left_out)


def test_report_names_patterns_shapes_and_left_out_reasons():
    report = tvmfuse.partitions("zoo:tiny_convnet", target=HOST)
    text = report.format()
    assert "tvmfuse.conv2d_add_relu" in text and "tvmfuse.depthwise_conv2d_clip" in text
    first = report.partitions[0]
    assert first.pattern == "tvmfuse.conv2d_relu" and first.ops == ["conv2d", "add", "relu"]
    assert first.output == (1, 16, 32, 32) and first.inputs[0] == (1, 3, 32, 32)
    # 16 x 32 x 32 outputs x (3 x 3 x 3) multiply-adds x 2.
    assert first.flops == 2 * 16 * 32 * 32 * 27
    assert first.bytes_moved == 4 * (3 * 32 * 32 + 16 * 3 * 3 * 3 + 16 + 16 * 32 * 32)
    assert [o.op for o in report.left_out] == ["mean", "reshape"]


def _matmul_runtime_weight():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    return make_model(nodes, [("x", [2, 4]), ("w", [4, 3])], [("y", [2, 3])])


def test_left_out_conv_dense_reason():
    report = partitions(_matmul_runtime_weight(), target=HOST)
    assert not report.partitions
    assert report.left_out[0].op == "matmul" and "weight is computed at run time" in report.left_out[0].reason
    assert report.summary() == "1 ops, 0 in partitions, 0.0% of conv/dense FLOPs, 0 layout transforms"


def _two_convs(middle: str, **attrs):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype("float32"), n) for n in ("W1", "W2")]
    nodes = [helper.make_node("Conv", ["x", "W1"], ["a"], pads=[1] * 4),
             helper.make_node(middle, ["a"], ["s"], **attrs),
             helper.make_node("Conv", ["s", "W2"], ["y"], pads=[1] * 4)]
    return make_model(nodes, [("x", [1, 16, 8, 8])], [("y", None)], inits)


def test_layout_transforms_are_counted_where_a_blocked_tensor_meets_a_plain_consumer():
    # The Relu joins the first conv: the activation stays blocked, one transform for the model's output.
    assert partitions(_two_convs("Relu"), target=HOST).transforms == {"to_plain": 1}
    # A channel Softmax has no blocked form: the first conv's output goes plain too.
    report = partitions(_two_convs("Softmax", axis=1), target=HOST)
    assert report.transforms == {"to_plain": 2} and report.num_transforms == 2
    assert report.summary().endswith(", 2 layout transforms (2 to_plain)")
    # In the NCHW layout there is nothing to transform, and a compiled model reports what it was built with.
    cm = tvmfuse.compile(_two_convs("Softmax", axis=1), target=HOST, layout="nchw")
    assert cm.partition_report().transforms == {}


def test_broadcast_add_reason_is_reported():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype("float32"), "W")]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["x"], ["g"]),
             helper.make_node("Add", ["c", "g"], ["y"])]
    report = partitions(make_model(nodes, [("x", [1, 4, 8, 8])], [("y", None)], inits), target=HOST)
    assert [p.pattern for p in report.partitions] == ["tvmfuse.conv2d"]
    add = [o for o in report.left_out if o.op == "add"]
    assert len(add) == 1


def test_kernels_carry_family_and_layout():
    cm = tvmfuse.compile("zoo:tiny_convnet", target=HOST)
    kernels = {gv.name_hint: f for gv, f in cm.mod.functions_items() if gv.name_hint.startswith("tvmfuse_")}
    layouts = {str(f.attrs["tvmfuse.family"]): str(f.attrs["tvmfuse.layout"]) for f in kernels.values()}
    # Convs write blocked NCHW[b]c and read weights packed for it (the stem reads the plain 3-channel input);
    # dense reads NC data and its weight packed in panels of the tile's columns.
    b = blocked.block_for(16, targets.resolve(HOST).vector_bits() // 32)
    assert layouts["conv2d_nchwc"].startswith(f"NCHW{b}c, weight OIHW") and layouts["conv2d_nchwc"].endswith(f"{b}o")
    assert layouts["depthwise_conv2d_nchwc"] == f"NCHW{b}c, weight CHW{b}c"
    assert layouts["dense"].startswith("NC, weight NK") and layouts["dense"].endswith("n")
    nchw = tvmfuse.compile("zoo:tiny_convnet", target=HOST, layout="nchw")
    families = {str(f.attrs["tvmfuse.family"]) for gv, f in nchw.mod.functions_items() if gv.name_hint.startswith("tvmfuse_")}
    assert families == {"conv2d", "depthwise_conv2d", "dense"}


def test_opcheck_passes_on_zoo_model():
    cm = tvmfuse.compile("zoo:tiny_convnet", target=HOST)
    checks = cm.opcheck()
    assert len(checks) == 7 and all(c.max_abs_error <= 1e-4 for c in checks)
    assert {c.partition for c in checks} >= {"tvmfuse.conv2d_add_relu", "tvmfuse.dense"}


def _conv_act(act: str):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("float32"), "W")]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), helper.make_node(act, ["c"], ["y"])]
    return make_model(nodes, [("x", [1, 3, 8, 8])], [("y", None)], inits)


def test_opcheck_stops_at_a_wrong_partition():
    cm = tvmfuse.compile(_conv_act("Relu"), target=HOST)
    other = tvmfuse.compile(_conv_act("Sigmoid"), target=HOST)
    # Make the reference of the relu kernel a sigmoid: op-check must name the kernel and the error.
    (kernel,) = cm.record.kernels
    cm.record.kernels[kernel] = next(iter(other.record.kernels.values()))
    with pytest.raises(OpCheckError, match=rf"kernel {kernel}, call 1\).*max abs error"):
        cm.opcheck()


def test_opcheck_env_checks_every_run(monkeypatch):
    cm = tvmfuse.compile(_conv_act("Relu"), target=HOST)
    (kernel,) = cm.record.kernels
    cm.record.kernels[kernel] = next(iter(tvmfuse.compile(_conv_act("Sigmoid"), target=HOST).record.kernels.values()))
    x = {"x": np.ones((1, 3, 8, 8), "float32")}
    cm.run(x)  # op-check off: runs
    monkeypatch.setenv("TVMFUSE_OPCHECK", "1")
    with pytest.raises(OpCheckError):
        cm.run(x)


def test_cli_partition(capsys):
    assert cli.main(["partition", "zoo:tiny_convnet", "--target", HOST]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("26 ops, 24 in partitions, 100.0% of conv/dense FLOPs, 0 layout transforms")
    assert cli.main(["partition", "zoo:tiny_convnet", "--target", HOST, "--opcheck"]) == 0
    assert "op-check: 7 partition calls match the unfused reference" in capsys.readouterr().out
