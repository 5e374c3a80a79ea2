"""Attention kernel dispatch (ddpd.models.attention).

On CPU: the choice rule with fake flash-attn modules (FA2, FA3, FA4 interfaces) put in
sys.modules and a patched GPU capability, the layout each interface is called with,
the recorded backend, forced backends and their errors, torch's flash SDPA backend
against the reference, and autocast training through the same path. On a GPU
(marked gpu): the CUDA kernels that ran, read from the profiler.
"""
import re
import sys
import types

import pytest
import torch

import ddpd.models.attention as attn
from ddpd.models import (
    FLASH_KERNELS,
    attention_backend,
    build_model,
    config_for,
    prepare_for_sampling,
    record_attention,
    resolve_backend,
    set_attention_backend,
)
from ddpd.models.attention import (
    RotaryEmbedding,
    SelfAttention,
    attention,
    clear_flash_cache,
    explicit_attention,
    flash_preference,
    load_flash_kernel,
)

B, H, L, HEAD = 2, 4, 16, 8
MODULE_NAMES = ("flash_attn", "flash_attn_interface", "flash_attn_3", "flash_attn_3.flash_attn_interface",
                "flash_attn.cute")


def qkv(dtype=torch.float32, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, L, HEAD, generator=gen).to(device=device, dtype=dtype) for _ in range(3))


def _reference_blhd(q, k, v, causal):
    """What a flash-attn interface computes, on its [B, L, H, d] layout."""
    out = explicit_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal)
    return out.transpose(1, 2)


def _fake_module(name, calls, returns_tuple=False, dropout=True):
    """A module whose flash_attn_func has the interface of a flash-attn generation."""
    module = types.ModuleType(name)

    def flash_attn_func(q, k, v, *, causal=False, softmax_scale=None, **kwargs):
        if "dropout_p" in kwargs and not dropout:
            raise TypeError("flash_attn_func() got an unexpected keyword argument 'dropout_p'")
        assert q.shape == (B, L, H, HEAD) and q.stride(-1) == 1  # [B, L, H, d], last dim contiguous
        calls.append({"module": name, "causal": causal, **kwargs})
        out = _reference_blhd(q, k, v, causal)
        return (out, torch.zeros(B, H, L)) if returns_tuple else out

    module.flash_attn_func = flash_attn_func
    return module


@pytest.fixture
def fake_flash(monkeypatch):
    """install(*generations, capability=(9, 0), fa3_path="flash_attn_interface") -> list of calls.

    Puts fake FA2 (flash_attn), FA3 (flash_attn_interface or flash_attn_3.flash_attn_interface,
    returning (out, lse) as some releases do) and FA4 (flash_attn.cute, returning (out, lse))
    modules in sys.modules, blocks the real ones, and makes CPU bf16/fp16 tensors look like
    tensors on a GPU of the given compute capability."""
    clear_flash_cache()
    set_attention_backend("auto")

    def install(*generations, capability=(9, 0), fa3_path="flash_attn_interface"):
        calls = []
        for name in MODULE_NAMES:
            monkeypatch.setitem(sys.modules, name, None)  # None: import raises ImportError
        if "fa2" in generations:
            monkeypatch.setitem(sys.modules, "flash_attn", _fake_module("flash_attn", calls))
        if "fa3" in generations:
            if fa3_path != "flash_attn_interface":
                monkeypatch.setitem(sys.modules, "flash_attn_3", types.ModuleType("flash_attn_3"))
            monkeypatch.setitem(sys.modules, fa3_path, _fake_module(fa3_path, calls, returns_tuple=True,
                                                                     dropout=False))
        if "fa4" in generations:
            if "fa2" not in generations:  # FA4 alone: a namespace package without flash_attn_func
                monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
            monkeypatch.setitem(sys.modules, "flash_attn.cute", _fake_module("flash_attn.cute", calls,
                                                                             returns_tuple=True, dropout=False))
        monkeypatch.setattr(attn, "_flash_capability",
                            lambda q: capability if q.dtype in (torch.float16, torch.bfloat16) else None)
        clear_flash_cache()
        return calls

    yield install
    set_attention_backend("auto")
    clear_flash_cache()


# ---- the rule ---------------------------------------------------------------------------

def test_cpu_tensors_never_take_a_flash_kernel():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q = qkv(dtype)[0]
        assert attn._flash_capability(q) is None
        assert resolve_backend(q) == "sdpa"


@pytest.mark.parametrize("capability, expected", [
    ((8, 0), ("fa2",)), ((8, 9), ("fa2",)), ((9, 0), ("fa3", "fa2", "fa4")),
    ((10, 0), ("fa4", "fa2")), ((12, 0), ("fa4", "fa2")), ((7, 5), ()),
])
def test_flash_preference_by_gpu(capability, expected):
    assert flash_preference(capability) == expected


@pytest.mark.parametrize("installed, capability, dropout_p, expected", [
    (("fa2", "fa3", "fa4"), (8, 0), 0.0, "fa2"),
    (("fa2", "fa3", "fa4"), (9, 0), 0.0, "fa3"),
    (("fa2", "fa3", "fa4"), (10, 0), 0.0, "fa4"),
    (("fa2", "fa3", "fa4"), (9, 0), 0.1, "fa2"),        # fa3/fa4 have no dropout
    (("fa3",), (9, 0), 0.1, "sdpa-flash"),
    (("fa3",), (8, 0), 0.0, "sdpa-flash"),              # the Hopper build does not serve an A100
    (("fa4",), (9, 0), 0.0, "fa4"),                     # FA4 alone (flash_attn has no flash_attn_func)
    (("fa2",), (10, 0), 0.0, "fa2"),
    (("fa2", "fa4"), (10, 0), 0.1, "fa2"),               # nor has FA4 on a Blackwell
    (("fa4",), (10, 0), 0.1, "sdpa-flash"),
    ((), (9, 0), 0.0, "sdpa-flash"),                    # no flash-attn: torch's flash backend
])
def test_auto_rule(fake_flash, installed, capability, dropout_p, expected):
    fake_flash(*installed, capability=capability)
    q = qkv(torch.bfloat16)[0]
    assert resolve_backend(q, dropout_p) == expected
    assert resolve_backend(q.float(), dropout_p) == "sdpa"  # float32 keeps SDPA as before


def test_fa3_found_under_its_package_name(fake_flash):
    fake_flash("fa3", fa3_path="flash_attn_3.flash_attn_interface")
    assert load_flash_kernel("fa3") is not None
    assert resolve_backend(qkv(torch.bfloat16)[0]) == "fa3"


# ---- the calls --------------------------------------------------------------------------

@pytest.mark.parametrize("generation, capability", [("fa2", (8, 0)), ("fa3", (9, 0)), ("fa4", (10, 0))])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_interfaces_called_in_their_layout(fake_flash, generation, capability, causal):
    calls = fake_flash(generation, capability=capability)
    q, k, v = qkv(torch.bfloat16)
    with record_attention() as counts:
        out = attention(q, k, v, causal)
    assert counts == {generation: 1}
    assert len(calls) == 1 and calls[0]["causal"] is causal
    assert ("dropout_p" in calls[0]) == (generation == "fa2")
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, explicit_attention(q, k, v, causal), rtol=0, atol=0)


def test_sdpa_flash_backend_matches_reference_on_cpu(fake_flash):
    # without flash-attn, a "GPU" tensor takes torch's flash SDPA backend, which also runs on CPU
    calls = fake_flash(capability=(9, 0))
    for causal in (False, True):
        q, k, v = qkv(torch.bfloat16, seed=1)
        with record_attention() as counts:
            out = attention(q, k, v, causal)
        assert counts == {"sdpa-flash": 1} and calls == []
        torch.testing.assert_close(out.float(), explicit_attention(q.float(), k.float(), v.float(), causal),
                                   rtol=1e-2, atol=1e-2)


def test_record_attention_counts_every_layer(fake_flash):
    fake_flash("fa2", capability=(8, 0))
    torch.manual_seed(0)
    model = build_model("mask-denoiser", config_for("mask-denoiser", 7, L, d_model=32, n_layers=3, n_heads=4))
    prepare_for_sampling(model, "bfloat16")
    x = torch.randint(0, 8, (B, L))
    with record_attention() as outer, torch.no_grad():
        with record_attention() as inner:
            model(x, torch.rand(B))
        model(x, torch.rand(B))
    assert inner == {"fa2": 3} and outer == {"fa2": 6}
    assert attn._recorders == []


def test_autocast_training_takes_the_flash_path_with_gradients(fake_flash):
    # training runs under bf16 autocast: q, k, v come out of the qkv projection in bf16
    calls = fake_flash("fa2", "fa3", capability=(9, 0))
    torch.manual_seed(0)
    layer = SelfAttention(32, 4, L, causal=False, dropout=0.1).train()
    x = torch.randn(B, L, 32)
    with record_attention() as counts, torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert counts == {"fa2": 1}  # dropout in training: FA3 has none
    assert calls[0]["dropout_p"] == 0.1
    out.float().square().mean().backward()
    assert layer.qkv.weight.grad is not None and torch.isfinite(layer.qkv.weight.grad).all()
    with record_attention() as counts, torch.autocast("cpu", dtype=torch.bfloat16):
        layer.eval()(x)
    assert counts == {"fa3": 1}


@pytest.mark.parametrize("installed, dtype", [(("fa2",), torch.bfloat16), ((), torch.bfloat16),
                                             ((), torch.float32)])
def test_dispatch_adds_no_graph_break_after_an_eager_call(fake_flash, installed, dtype):
    # torch.compile and CUDA graphs run after a warm-up; the cached dispatch then traces as constants
    fake_flash(*installed, capability=(8, 0))
    torch.manual_seed(0)
    layer = SelfAttention(32, 4, L, causal=True).eval().to(dtype)
    x = torch.randn(B, L, 32, dtype=dtype)
    torch._dynamo.reset()
    with torch.no_grad(), record_attention() as counts:
        layer(x)
        explained = torch._dynamo.explain(layer)(x)
    assert set(counts) == {"fa2" if installed else "sdpa-flash" if dtype == torch.bfloat16 else "sdpa"}
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()


# ---- forcing ----------------------------------------------------------------------------

def test_forcing_an_absent_kernel_is_refused(fake_flash):
    fake_flash("fa2")
    with pytest.raises(ValueError, match="fa3.*flash_attn_interface"):
        set_attention_backend("fa3")
    with pytest.raises(ValueError, match="name expected one of"):
        set_attention_backend("xformers")
    fake_flash()
    with pytest.raises(ValueError, match="no flash-attn"):
        set_attention_backend("flash")


def test_forced_kernels(fake_flash):
    fake_flash("fa2", "fa3", "fa4", capability=(9, 0))
    q = qkv(torch.bfloat16)[0]
    for name in FLASH_KERNELS + ("sdpa-flash", "sdpa", "math"):
        with attention_backend(name):
            assert resolve_backend(q) == name
    with attention_backend("flash"):
        assert resolve_backend(q) == "fa3"
        assert resolve_backend(q, dropout_p=0.1) == "fa2"
    for name in ("fa3", "fa4"):  # their interfaces take no dropout
        with attention_backend(name), pytest.raises(ValueError, match="dropout_p=0.1"):
            resolve_backend(q, dropout_p=0.1)
    with attention_backend("fa2"), pytest.raises(ValueError, match="CUDA fp16/bf16"):
        resolve_backend(q.float())  # float32: no flash kernel takes it
    assert attn.get_attention_backend() == "auto"


def test_a_forced_sdpa_flash_refuses_float32_on_cuda():
    """Only the CPU's flash kernel takes float32: on CUDA a forced `sdpa-flash` names what it needs
    (docs/models.md) rather than handing float32 to torch's flash backend, which has no kernel for it.
    A stand-in for a CUDA tensor: the rule reads its device, dtype and head_dim only."""
    q = types.SimpleNamespace(is_cuda=True, dtype=torch.float32, shape=(B, H, L, HEAD), device=torch.device("cuda", 0))
    with attention_backend("sdpa-flash"), pytest.raises(ValueError, match="'sdpa-flash' is forced but needs CUDA fp16"):
        resolve_backend(q)


@pytest.mark.parametrize("forced, capability", [("fa3", (8, 0)), ("fa4", (8, 6)), ("fa3", (10, 0))])
def test_forcing_a_kernel_the_gpu_cannot_run_is_refused(fake_flash, forced, capability):
    calls = fake_flash("fa2", "fa3", "fa4", capability=capability)
    q, k, v = qkv(torch.bfloat16)
    runs = re.escape(str(attn.flash_preference(capability)))
    refused = f"{forced}.*compute capability {re.escape(str(capability))}; this GPU runs {runs}"
    with attention_backend(forced), pytest.raises(ValueError, match=refused):
        attention(q, k, v, causal=False)
    assert calls == []


def test_forced_sdpa_flash_on_cpu_matches_reference():
    q, k, v = qkv(torch.float32, seed=2)
    with attention_backend("sdpa-flash"), record_attention() as counts:
        out = attention(q, k, v, causal=True)
    assert counts == {"sdpa-flash": 1}
    torch.testing.assert_close(out, explicit_attention(q, k, v, True), rtol=1e-5, atol=1e-6)
    # torch's CPU flash kernel has no dropout: refused in one line, not "No available kernel"
    refused = "CPU flash kernel runs without dropout, got dropout_p=0.1"
    with attention_backend("sdpa-flash"), pytest.raises(ValueError, match=refused):
        attention(q, k, v, causal=True, dropout_p=0.1)


def test_models_md_states_that_the_cpu_sdpa_flash_takes_float32():
    """docs/models.md said a forced flash backend refuses float32 wherever it runs."""
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text().split())
    assert "On CUDA, a forced backend that cannot take the tensors (a flash kernel for float32" in text
    assert "On the CPU a forced `sdpa-flash` takes float32" in text


# ---- on a GPU: which CUDA kernels ran -----------------------------------------------------

def cuda_kernels(fn):
    """Names of the CUDA kernels that ran in fn()."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm up: lazy initialisation and JIT compilation stay out of the trace
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA}


def _gpu_model(n_layers=2):
    torch.manual_seed(0)
    config = config_for("mask-denoiser", 27, 128, d_model=256, n_layers=n_layers, n_heads=4)
    return build_model("mask-denoiser", config).cuda()


@pytest.mark.gpu
def test_bf16_sampling_runs_a_flash_kernel_on_cuda():
    model = prepare_for_sampling(_gpu_model(), "auto", "cuda")
    x, t = torch.randint(0, 28, (8, 128), device="cuda"), torch.rand(8, device="cuda")
    q = torch.empty(1, 4, 128, 64, device="cuda", dtype=torch.bfloat16)
    expected = resolve_backend(q)
    assert expected in FLASH_KERNELS + ("sdpa-flash",)
    with torch.no_grad(), record_attention() as counts:
        kernels = cuda_kernels(lambda: model(x, t))
    assert set(counts) == {expected}
    flash = [name for name in kernels if "flash" in name.lower()]
    assert flash, f"no FlashAttention kernel among {sorted(kernels)}"
    assert not any("fmha_cutlass" in name for name in kernels)  # not the memory-efficient kernel


@pytest.mark.gpu
def test_float32_on_cuda_keeps_sdpa_and_no_flash_kernel():
    model = _gpu_model().eval()
    x, t = torch.randint(0, 28, (8, 128), device="cuda"), torch.rand(8, device="cuda")
    with torch.no_grad(), record_attention() as counts:
        kernels = cuda_kernels(lambda: model(x, t))
    assert set(counts) == {"sdpa"}
    assert not any("flash" in name.lower() for name in kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", FLASH_KERNELS + ("sdpa-flash",))
@pytest.mark.parametrize("causal", [False, True])
def test_each_flash_backend_on_cuda(backend, causal):
    if backend in FLASH_KERNELS and load_flash_kernel(backend) is None:
        pytest.skip(f"{backend} not installed")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    try:
        with attention_backend(backend):
            resolve_backend(q)
    except ValueError as err:
        pytest.skip(str(err))  # e.g. FA3 on a GPU that is not a Hopper
    with attention_backend(backend):
        out = attention(q, k, v, causal)
        kernels = cuda_kernels(lambda: attention(q, k, v, causal))
    torch.testing.assert_close(out.float(), explicit_attention(q, k, v, causal).float(), rtol=1e-2, atol=1e-2)
    assert any("flash" in name.lower() for name in kernels), sorted(kernels)


@pytest.mark.gpu
def test_autocast_training_step_on_cuda_uses_flash():
    model = _gpu_model().train()
    x, t = torch.randint(0, 28, (8, 128), device="cuda"), torch.rand(8, device="cuda")
    with record_attention() as counts, torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, t).logsumexp(-1).mean()
    loss.backward()
    assert set(counts) <= set(FLASH_KERNELS + ("sdpa-flash",)) and sum(counts.values()) == 2
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_forced_sdpa_flash_on_cpu_takes_a_head_dimension_of_two():
    """The rotated q and k keep a last-dimension stride of 1 at d = 2, which torch's CPU
    flash kernel needs (it answered "No available kernel")."""
    torch.manual_seed(0)
    model = build_model("mask-denoiser", config_for("mask-denoiser", 5, 6, d_model=16, n_layers=1, n_heads=8)).eval()
    x, t = torch.randint(0, 6, (2, 6)), torch.rand(2)
    with attention_backend("math"):
        expected = model(x, t)
    with attention_backend("sdpa-flash"):
        assert torch.allclose(model(x, t), expected, atol=1e-5)


@pytest.mark.parametrize("capability, dtype, head_dim, expected", [
    ((8, 0), torch.bfloat16, 64, (8, 0)), ((8, 0), torch.float16, 8, (8, 0)), ((9, 0), torch.bfloat16, 256, (9, 0)),
    ((7, 5), torch.float16, 64, None), ((8, 0), torch.float32, 64, None), ((8, 0), torch.bfloat16, 12, None),
    ((8, 0), torch.bfloat16, 264, None),
])
def test_flash_takes_half_precision_cuda_tensors_of_its_head_sizes_from_sm80(monkeypatch, capability, dtype,
                                                                              head_dim, expected):
    """The rule of _flash_capability (the fake_flash fixture replaces it), on a stand-in for a
    CUDA tensor: an A100 (sm80) and head sizes that are multiples of 8 up to 256 take flash."""
    monkeypatch.setitem(attn._capabilities, 0, capability)
    q = types.SimpleNamespace(is_cuda=True, dtype=dtype, shape=(B, H, L, head_dim), device=torch.device("cuda", 0))
    assert attn._flash_capability(q) == expected


def test_nested_backend_blocks_restore_the_outer_one():
    with attention_backend("math"):
        with attention_backend("sdpa"):
            assert attn.get_attention_backend() == "sdpa"
        assert attn.get_attention_backend() == "math"
    assert attn.get_attention_backend() == "auto"


def test_the_math_backend_refuses_dropout_it_does_not_apply():
    q, k, v = qkv()
    refused = "the 'math' backend has no dropout, got dropout_p=0.1"
    with attention_backend("math"), pytest.raises(ValueError, match=refused):
        attention(q, k, v, False, dropout_p=0.1)


def test_a_flash_attn_whose_cuda_library_does_not_load_counts_as_absent(monkeypatch):
    """An import that raises OSError (a build whose CUDA library does not load) is no flash-attn."""
    def broken(name):
        raise OSError("libcudart.so.12: cannot open shared object file")

    monkeypatch.setattr(attn, "importlib", types.SimpleNamespace(import_module=broken))
    clear_flash_cache()
    try:
        assert load_flash_kernel("fa2") is None and not attn.flash_available()
    finally:
        clear_flash_cache()


def test_forcing_flash_needs_one_generation_only(fake_flash):
    """'flash' is accepted when a single generation is installed, and runs it."""
    fake_flash("fa2", capability=(8, 0))
    with attention_backend("flash"):
        assert resolve_backend(qkv(torch.bfloat16)[0]) == "fa2"


def test_a_backend_block_left_by_an_exception_restores_the_setting():
    """attention_backend restores the previous setting when its block raises."""
    with pytest.raises(RuntimeError), attention_backend("math"):
        raise RuntimeError("in the block")
    assert attn.get_attention_backend() == "auto"


def test_sdpa_flash_leaves_torch_its_flash_kernel_alone(monkeypatch):
    """The 'sdpa-flash' backend calls torch's SDPA with the flash kernel as its only choice."""
    enabled, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        cuda = torch.backends.cuda
        enabled.append((cuda.flash_sdp_enabled(), cuda.math_sdp_enabled(), cuda.mem_efficient_sdp_enabled()))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v = qkv()
    with attention_backend("sdpa-flash"):
        attention(q, k, v, causal=False)
    assert enabled == [(True, False, False)]


def test_the_sdpa_backend_applies_the_attention_dropout():
    """attention(..., dropout_p) on the sdpa backend drops attention weights."""
    q, k, v = qkv()
    torch.manual_seed(0)
    with attention_backend("sdpa"):
        assert not torch.allclose(attention(q, k, v, False, dropout_p=0.5), attention(q, k, v, False))


def test_self_attention_drops_its_output_in_training(monkeypatch):
    """SelfAttention applies its dropout to the projected output in train mode (each entry 0 or scaled)."""
    monkeypatch.setattr(attn, "attention", lambda q, k, v, causal, dropout_p=0.0: explicit_attention(q, k, v, causal))
    torch.manual_seed(0)
    layer = SelfAttention(32, 4, L, causal=False, dropout=0.5)
    x = torch.randn(B, L, 32)
    kept = layer.eval()(x)
    dropped = layer.train()(x)
    assert (dropped == 0).any()
    torch.testing.assert_close(torch.where(dropped == 0, 0.0, 2 * kept), dropped)


def test_a_forced_sdpa_flash_on_cuda_takes_dropout(monkeypatch):
    """Only torch's CPU flash kernel lacks dropout: on a GPU a forced `sdpa-flash` trains with it.
    A stand-in for a CUDA bf16 tensor on an A100 (the rule reads its device, dtype and head_dim)."""
    monkeypatch.setitem(attn._capabilities, 0, (8, 0))
    q = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, shape=(B, H, L, HEAD), device=torch.device("cuda", 0))
    with attention_backend("sdpa-flash"):
        assert resolve_backend(q, dropout_p=0.1) == "sdpa-flash"


def test_sdpa_flash_hands_torch_the_dropout_and_the_mask(monkeypatch):
    """A forced 'sdpa-flash' on a GPU trains with dropout: dropout_p and causal reach torch's
    SDPA. The resolved backend is patched in (torch's CPU flash kernel has no dropout)."""
    seen = []

    def spy(q, k, v, dropout_p=0.0, is_causal=False):
        seen.append((dropout_p, is_causal))
        return explicit_attention(q, k, v, is_causal)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(attn, "resolve_backend", lambda q, dropout_p=0.0: "sdpa-flash")
    q, k, v = qkv()
    attention(q, k, v, causal=True, dropout_p=0.1)
    attention(q, k, v, causal=False)
    assert seen == [(0.1, True), (0.0, False)]


def test_forcing_flash_where_no_installed_generation_runs_is_refused(fake_flash):
    """'flash' forced with only the Hopper build (fa3) installed, on an A100: no kernel fits, so
    the call is refused in one line rather than handed to a backend named None."""
    calls = fake_flash("fa3", capability=(8, 0))
    q, k, v = qkv(torch.bfloat16)
    with attention_backend("flash"), pytest.raises(ValueError, match=r"'flash' is forced but no installed "
                                                                     r"flash-attn kernel.*capability \(8, 0\)"):
        attention(q, k, v, causal=False)
    assert calls == []


def test_explicit_attention_masks_the_future_whatever_the_scores():
    """Causal: the future gets no weight even when every allowed score is far below zero
    (a finite fill value would then win the softmax); torch's SDPA agrees."""
    q = torch.full((1, 1, 4, HEAD), 100.0)
    k, v = -q, torch.randn(1, 1, 4, HEAD, generator=torch.Generator().manual_seed(0))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(explicit_attention(q, k, v, causal=True), expected)
    torch.testing.assert_close(explicit_attention(q, k, v, causal=True)[..., 0, :], v[..., 0, :])


def test_explicit_attention_returns_the_dtype_of_its_values():
    """The reference computes in float32 and casts back to the dtype of v, as documented."""
    q, k, _ = qkv()
    v = qkv(torch.bfloat16, seed=1)[2]
    out = explicit_attention(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, explicit_attention(q, k, v.float(), causal=True).to(torch.bfloat16),
                               rtol=0, atol=0)


@pytest.mark.parametrize("installed, forced, module", [(("fa3",), "fa2", "flash_attn"),
                                                       (("fa2",), "fa4", "flash_attn.cute")])
def test_forcing_each_absent_generation_names_its_module(fake_flash, installed, forced, module):
    """Forcing a generation that is not installed is refused when set, naming the module looked for."""
    fake_flash(*installed)
    with pytest.raises(ValueError, match=rf"name='{forced}' but {re.escape(module)} is not importable"):
        set_attention_backend(forced)
    assert attn.get_attention_backend() == "auto"


def test_warm_dispatch_fills_the_caches_for_the_current_gpu(fake_flash, monkeypatch):
    """warm_dispatch looks up every flash-attn generation and the capability of the model's GPU:
    the current one for a plain "cuda" device. A stand-in torch.cuda answers on the CPU."""
    fake_flash()  # none installed: each generation is looked up
    monkeypatch.setattr(attn, "_capabilities", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: {0: (8, 0), 1: (9, 0)}[index])
    attn.warm_dispatch(torch.device("cpu"))
    assert attn._flash_functions == dict.fromkeys(FLASH_KERNELS) and attn._capabilities == {}
    attn.warm_dispatch(torch.device("cuda"))
    assert attn._capabilities == {1: (9, 0)}
    attn.warm_dispatch(torch.device("cuda", 0))
    assert attn._capabilities == {0: (8, 0), 1: (9, 0)}


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_attends_over_rotated_queries_and_keys(causal):
    """SelfAttention is the projected attention of its heads, with queries and keys (not values)
    rotated by the default rotary table of its head size, rebuilt here step by step."""
    torch.manual_seed(0)
    layer = SelfAttention(32, 4, L, causal=causal).eval()
    x = torch.randn(B, L, 32)
    q, k, v = (part.view(B, L, 4, 8).transpose(1, 2) for part in layer.qkv(x).chunk(3, dim=-1))
    table = RotaryEmbedding(8, L)
    out = explicit_attention(table(q), table(k), v, causal).transpose(1, 2).reshape(B, L, 32)
    with attention_backend("math"):
        torch.testing.assert_close(layer(x), layer.proj(out), rtol=1e-5, atol=1e-6)


def test_a_skeleton_loaded_with_assign_computes_its_rotary_tables_beside_the_weights():
    """load_state_dict(assign=True) into a meta skeleton: the rotary tables (in no state dict)
    are computed on the device of the assigned weights. A fake CUDA device stands in for a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        with torch.device("meta"):
            layer = SelfAttention(32, 4, L, causal=False)
        state = {"qkv.weight": torch.empty(96, 32, device="cuda"), "proj.weight": torch.empty(32, 32, device="cuda")}
        layer.load_state_dict(state, assign=True)
    assert layer.rotary.cos.device.type == layer.rotary.sin.device.type == "cuda"
    assert layer.rotary.cos.dtype == torch.float32 and layer.rotary.cos.shape == (L, 4)


def test_a_forced_flash_backend_names_what_it_got(monkeypatch):
    """The refusal of a forced flash backend states the device, dtype and head size it was given:
    here a bf16 stand-in for a CUDA tensor on an A100 whose head size (12) is no multiple of 8."""
    monkeypatch.setitem(attn._capabilities, 0, (8, 0))
    q = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, shape=(B, H, L, 12), device=torch.device("cuda", 0))
    got = "got device=cuda:0, dtype=torch.bfloat16, head_dim=12"
    with attention_backend("sdpa-flash"), pytest.raises(ValueError, match=re.escape(got)):
        resolve_backend(q)
