"""CUDA device code reused kernel by kernel (tvmfuse.cache.cuda_kernels): the source and nvcc's PTX split as
expected, the fatbin made from stored PTX entries equal byte for byte to the one nvcc makes of the whole
source, a changed kernel the only one translated, and whatever has another form compiled whole."""

from __future__ import annotations

import shutil

import pytest

import tvmfuse
from tvmfuse import cuda_driver, targets, zoo
from tvmfuse.cache import cuda_binaries, cuda_kernels, resolve

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
TARGET = "cuda-sm90"


@pytest.fixture(scope="module")
def source():
    """TVM's CUDA source of the tiny ConvNet's kernels (9, among them convs, a dense and a mean)."""
    return tvmfuse.compile("zoo:tiny_convnet", target=TARGET, cache=False).kernel_source()


@pytest.fixture(scope="module")
def whole(source):
    """What TVM's own callback (nvcc, the whole source) makes of it."""
    cuda_driver.preload()
    with targets.resolve(TARGET).tvm_target():
        return bytes(cuda_binaries._INSTALLED.get("compile", _tvm_compile)(source))


def _tvm_compile(code):
    from tvm.support import nvcc

    return nvcc.tvm_callback_cuda_compile(code)


def _first_definition(code: str) -> int:
    """Where the first kernel's definition starts (after the preamble and the declarations)."""
    return code.index(next(line for line in code.splitlines(keepends=True)
                           if line.startswith('extern "C" __global__') and line.rstrip().endswith("{")))


def _compile(code, store):
    counts = {"kernels_found": [], "kernels_built": []}
    with targets.resolve(TARGET).tvm_target():
        binary = cuda_kernels.compile(code, store, counts, *cuda_binaries._context(), 2)
    return binary, counts


def test_the_source_splits_into_its_preamble_and_kernels(source):
    preamble, kernels = cuda_kernels.split_source(source)
    assert len(kernels) == 9 and "#include" in preamble and all(n.endswith("_kernel") for n, _, _ in kernels)
    assert preamble + "".join(d for _, d, _ in kernels) + "".join(b for _, _, b in kernels) == source
    # anything but kernels after the preamble and the kernels' declarations is another form: compiled whole
    helper = '__device__ float twice(float x) { return 2 * x; }\n'
    first = _first_definition(source)
    assert cuda_kernels.split_source(source[:first] + helper + source[first:]) is None
    last = source.rindex('extern "C" __global__')
    assert cuda_kernels.split_source(source[:last] + helper + source[last:]) is None  # between two kernels


def test_ptx_splits_into_canonical_entries():
    ptx = "\n".join([".version 9.0", ".target sm_90", ".address_size 64", "// .globl\tk_kernel",
                     ".extern .shared .align 64 .b8 buf_dyn_shmem_ptr[];",
                     ".visible .entry k_kernel(", "\t.param .u64 k_kernel_param_0", ")", "{",
                     "\tbra.uni \t$L__BB3_2;", "$L__BB3_2:", "\t{ .reg .b32 t; }", "\tret;", "}"])
    header, shared, entries = cuda_kernels.split_ptx(ptx)
    assert header == [".version 9.0", ".target sm_90", ".address_size 64"]
    assert list(shared) == ["buf_dyn_shmem_ptr"] and list(entries) == ["k_kernel"]
    assert "$L__BB0_2:" in entries["k_kernel"] and "BB3" not in entries["k_kernel"]
    assert cuda_kernels.split_ptx(ptx + "\n.func helper()\n{\n\tret;\n}") is None  # module-scope code
    assert cuda_kernels.split_ptx(ptx[: ptx.rindex("}")]) is None  # an entry that never ends


def test_kernels_from_stored_ptx_make_the_whole_sources_fatbin(tmp_path, source, whole):
    store = resolve(tmp_path)
    first, counts = _compile(source, store)
    assert first == whole and len(counts["kernels_built"]) == 9 and not counts["kernels_found"]
    # one kernel changed: the only one translated again, the result nvcc's for the new source
    preamble, kernels = cuda_kernels.split_source(source)
    name, _, body = next(k for k in kernels if "dense" in k[0])
    changed = source.replace(body, body.replace("}\n", "  __syncthreads();\n}\n", 1))
    assert changed != source
    second, counts = _compile(changed, store)
    assert counts["kernels_built"] == [name] and len(counts["kernels_found"]) == 8
    cuda_driver.preload()
    with targets.resolve(TARGET).tvm_target():
        assert second == bytes(_tvm_compile(changed))
    # a damaged entry is translated again
    path = store.path(next(iter(_keys(source))))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.warns(UserWarning, match="damaged"):
        third, counts = _compile(source, store)
    assert third == whole and len(counts["kernels_built"]) == 1


def _keys(code):
    preamble, kernels = cuda_kernels.split_source(code)
    with targets.resolve(TARGET).tvm_target():
        base, arch = cuda_binaries._context()
    import hashlib

    return [hashlib.sha256("\n".join([cuda_kernels.FORMAT, base, arch, preamble, d, b]).encode()).hexdigest()
            for _, d, b in kernels]


def test_another_form_or_compiler_is_compiled_whole(tmp_path, source, monkeypatch):
    store = resolve(tmp_path)
    first = _first_definition(source)
    odd = source[:first] + "__device__ int helper() { return 1; }\n" + source[first:]
    assert _compile(odd, store) == (None, {"kernels_found": [], "kernels_built": []})
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvrtc")
    assert _compile(source, store)[0] is None
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    monkeypatch.setenv("TVM_KERNEL_DEBUG", "1")
    assert _compile(source, store)[0] is None
    assert not list(store.entries())  # nothing stored on the way
    monkeypatch.delenv("TVM_KERNEL_DEBUG")

    def refused(*_args):
        raise RuntimeError("ptxas failed")

    monkeypatch.setattr(cuda_kernels, "_assemble", refused)  # ptxas refusing the module: nvcc on the whole
    assert _compile(source, store) == (None, {"kernels_found": [], "kernels_built": []})


def test_a_model_with_one_changed_layer_reuses_the_other_kernels(tmp_path):
    """Relu -> LeakyRelu in the middle of the tiny ConvNet: its other kernels' PTX and schedules come from the
    cache, and the library is byte for byte the one built without it."""
    model = zoo.get("tiny_convnet")
    tvmfuse.compile(model, target=TARGET, cache=tmp_path)
    relus = [n for n in model.graph.node if n.op_type == "Relu"]
    relus[len(relus) // 2].op_type = "LeakyRelu"
    changed = tvmfuse.compile(model, target=TARGET, cache=tmp_path)
    plain = tvmfuse.compile(model, target=TARGET, cache=False)
    info = changed.cache_info
    assert info["model"] == "miss" and 0 < info["from_cache"] < info["kernels"]
    assert changed.library_bytes() == plain.library_bytes()


def test_fp16_kernels_sharing_dynamic_shared_memory_make_the_same_fatbin(tmp_path):
    """fp16 tensor-core kernels declare the module's dynamic shared memory: declared once in the assembled PTX,
    the fatbin is still nvcc's for the whole source."""
    code = tvmfuse.compile("zoo:tiny_convnet", target=TARGET, cache=False, precision="fp16").kernel_source()
    assert "buf_dyn_shmem" in code
    binary, counts = _compile(code, resolve(tmp_path))
    cuda_driver.preload()
    with targets.resolve(TARGET).tvm_target():
        assert binary == bytes(_tvm_compile(code)) and counts["kernels_built"]
