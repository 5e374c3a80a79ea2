"""Sampling precision (ddpd.models.precision): dtype resolution, casting a network to
bf16/fp16 with its norms and rotary tables kept float32, float32 logits out, CPU
bf16/fp16 against float32, and the bundled text8 models unchanged in float32."""
import copy
import functools
import io
import os

import pytest
import torch

from ddpd.checkpoint import load_model
from ddpd.models import (
    DTYPE_CHOICES,
    MODEL_KINDS,
    SEDDAbsorbingDenoiser,
    build_model,
    compile_for_sampling,
    config_for,
    prepare_for_sampling,
    resolve_dtype,
)
from ddpd.models.attention import RotaryEmbedding
from ddpd.models.backbone import LayerNorm, RMSNorm
from ddpd.pretrained import BUNDLE_DIR

V, D, B = 7, 12, 3
SMALL = dict(d_model=32, n_layers=2, n_heads=4)
BUNDLE = str(BUNDLE_DIR)


def make(kind, seed=0, **fields):
    torch.manual_seed(seed)
    model = build_model(kind, config_for(kind, V, D, **{**SMALL, **fields})).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # adaLN starts at zero: give it weights so t matters
        for name, p in model.named_parameters():
            if "modulation" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


def call(model, x, t):
    return model(x) if model.kind in ("planner", "ar") else model(x, t)


def inputs(model, batch=B, length=D, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=gen), torch.rand(batch, generator=gen)


# ---- resolve_dtype ----------------------------------------------------------------------

def test_resolve_dtype():
    assert DTYPE_CHOICES == ("auto", "float32", "bfloat16", "float16")
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("auto", "cuda:1") == torch.bfloat16
    assert resolve_dtype("auto") == torch.float32
    assert resolve_dtype("float16", "cpu") == torch.float16
    assert resolve_dtype("float32", "cuda") == torch.float32
    assert resolve_dtype(torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("fp8", "cuda")
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype(torch.float64)
    with pytest.raises(TypeError, match="dtype must be a str"):
        resolve_dtype(16)


def test_auto_is_bfloat16_on_cuda_only():
    """An int device is an accelerator index, read by torch.device (bfloat16 under "auto" on CUDA;
    with no accelerator, torch's refusal named as a device error, not a TypeError); devices other
    than CUDA, the meta device among them, get float32 as the CPU does."""
    assert resolve_dtype("auto", "meta") == resolve_dtype("auto", torch.device("meta")) == torch.float32
    assert resolve_dtype("auto", "cpu:0") == torch.float32
    try:
        index = torch.device(0)
    except RuntimeError:
        with pytest.raises(ValueError, match="^device must name a torch device .*, got 0: "):
            resolve_dtype("auto", 0)
    else:
        assert resolve_dtype("auto", 0) == (torch.bfloat16 if index.type == "cuda" else torch.float32)


# ---- prepare_for_sampling -----------------------------------------------------------------

@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_prepare_casts_weights_but_keeps_norms_and_rotary_float32(norm):
    model = make("mask-denoiser", norm=norm).train()
    assert prepare_for_sampling(model, "bfloat16", "cpu") is model
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if isinstance(module, (LayerNorm, RMSNorm)):
            assert own and all(p.dtype == torch.float32 for p in own)
        else:
            assert all(p.dtype == torch.bfloat16 for p in own)
        if isinstance(module, RotaryEmbedding):
            assert module.cos.dtype == module.sin.dtype == torch.float32


@pytest.mark.parametrize("cast, dtype", [("half", "bfloat16"), ("bfloat16", "float32"), ("half", "float16")])
def test_prepare_brings_norms_of_a_cast_model_back_to_float32(cast, dtype):
    model = make("mask-denoiser")
    model.half() if cast == "half" else model.to(torch.bfloat16)
    prepare_for_sampling(model, dtype, "cpu")
    norms = [p for m in model.modules() if isinstance(m, (LayerNorm, RMSNorm)) for p in m.parameters(recurse=False)]
    assert norms and all(p.dtype == torch.float32 for p in norms)
    assert model.backbone.embed.weight.dtype == resolve_dtype(dtype)


def test_rotary_tables_stay_float32_under_a_plain_cast():
    model = make("uniform")
    fresh = copy.deepcopy(model.backbone.blocks[0].attn.rotary.cos)
    model.to(torch.bfloat16)
    rotary = model.backbone.blocks[0].attn.rotary
    assert rotary.cos.dtype == torch.float32 and torch.equal(rotary.cos, fresh)
    model.half()
    assert rotary.sin.dtype == torch.float32
    assert model.backbone.embed.weight.dtype == torch.float16


class RotaryNet(torch.nn.Module):
    """A network whose output depends on position only through rotary angles computed as
    SEDD's and MDLM's are (model/rotary.py): positions arange(L).type_as(inv_freq), a
    registered buffer, times inv_freq. Called as net(x, sigma), it also fits the adapters."""

    def __init__(self, vocab, width=32):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab + 1, width)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, width, 2).float() / width)))
        self.head = torch.nn.Linear(width, vocab + 1)

    def forward(self, x, sigma):
        positions = torch.arange(x.shape[1], device=x.device).type_as(self.inv_freq)
        angles = torch.einsum("i,j->ij", positions, self.inv_freq)
        cos, sin = (torch.cat((a, a), -1) for a in (angles.cos(), angles.sin()))
        h = self.embed(x)
        half = h.shape[-1] // 2
        rotated = torch.cat((-h[..., half:], h[..., :half]), -1)
        return self.head(h * cos.to(h.dtype) + rotated * sin.to(h.dtype))


@pytest.mark.parametrize("wrapped", [False, True])
def test_prepare_keeps_position_buffers_float32(wrapped):
    """bf16 positions are off by whole radians (cos off by 0.38 at position 255, 1.08 at 1000):
    buffers keep their dtype, only parameters are cast, for a bare network and an adapter's."""
    vocab, length = 16, 1024
    net = RotaryNet(vocab)
    full = SEDDAbsorbingDenoiser(net, vocab) if wrapped else net
    half = prepare_for_sampling(copy.deepcopy(full), "bfloat16", "cpu")
    gen = torch.Generator().manual_seed(0)
    x = torch.where(torch.rand(2, length, generator=gen) < 0.5, vocab, torch.randint(0, vocab, (2, length),
                                                                                     generator=gen))
    t = torch.tensor([0.5, 0.7])
    with torch.no_grad():
        p, q = full(x, t).float().softmax(-1), half(x, t).float().softmax(-1)
    tv = 0.5 * (p - q).abs().sum(-1)[x == vocab]  # measured: 0.001 mean, 0.003 max (bf16 inv_freq: 0.05, 0.19)
    assert tv.max() <= 0.02
    inner = half.network if wrapped else half
    assert inner.inv_freq.dtype == torch.float32 and inner.head.weight.dtype == torch.bfloat16


class TorchNorms(torch.nn.Module):
    """A network with torch's own norms, one registered before any cast layer (so that its
    first parameter stays float32), called as net(x, sigma) like the adapters' networks."""

    def __init__(self, vocab, width=8):
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.LayerNorm(width)
        self.embed = torch.nn.Embedding(vocab + 1, width)
        self.register_buffer("offset", torch.arange(width).float())  # a float32 buffer mixed in
        self.norms = torch.nn.ModuleList([torch.nn.GroupNorm(2, width), torch.nn.RMSNorm(width),
                                          torch.nn.BatchNorm1d(width), torch.nn.InstanceNorm1d(width, affine=True)])
        self.head = torch.nn.Linear(width, vocab + 1)

    def forward(self, x, sigma):
        h = self.first(self.embed(x) + self.offset)  # [B, D, W]
        group, rms, batch, instance = self.norms
        h = group(h.transpose(1, 2)).transpose(1, 2)
        h = batch(instance(rms(h).transpose(1, 2))).transpose(1, 2)
        return self.head(h)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_prepare_keeps_torch_norms_and_their_statistics_float32(dtype):
    """torch's norm layers stay float32 (parameters and running statistics) like ddpd's, and a
    wrapped network with them, its first parameter a norm's, runs cast in an adapter."""
    vocab = 6
    full = SEDDAbsorbingDenoiser(TorchNorms(vocab), vocab).eval()
    with torch.no_grad():  # statistics other than the defaults, so that rounding them shows
        for norm in full.network.norms[2:]:
            norm.running_mean = torch.randn(norm.num_features) / 3 if norm.running_mean is not None else None
    half = prepare_for_sampling(copy.deepcopy(full), dtype, "cpu")
    net = half.network
    for norm in (net.first, *net.norms):
        floats = [p for p in (*norm.parameters(), *norm.buffers()) if p.is_floating_point()]
        assert floats and all(p.dtype == torch.float32 for p in floats)
    assert net.head.weight.dtype == net.embed.weight.dtype == getattr(torch, dtype)
    x, t = torch.tensor([[6, 1, 6, 2], [0, 6, 6, 5]]), torch.tensor([0.3, 0.8])
    with torch.no_grad():
        want, got = full(x, t), half(x, t)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)


def test_prepare_casts_only_floating_point_parameters_and_state():
    """An integer parameter keeps its dtype and values, as does a norm's integer state (BatchNorm's
    num_batches_tracked): only floating-point tensors are cast, to `dtype` or back to float32."""
    net = TorchNorms(6)
    net.steps = torch.nn.Parameter(torch.arange(3), requires_grad=False)
    batch = net.norms[2]
    batch.num_batches_tracked.fill_(5)
    prepare_for_sampling(net, "bfloat16", "cpu")
    assert net.steps.dtype == torch.int64 and torch.equal(net.steps, torch.arange(3))
    assert batch.num_batches_tracked.dtype == torch.int64 and batch.num_batches_tracked.item() == 5
    assert batch.running_var.dtype == torch.float32 and net.head.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("dtype, rtol", [("bfloat16", 3e-2), ("float16", 5e-3)])  # 8 and 11 significant bits
def test_low_precision_on_cpu_matches_float32(kind, dtype, rtol):
    full = make(kind)
    half = prepare_for_sampling(copy.deepcopy(full), dtype, "cpu")
    x, t = inputs(full)
    with torch.no_grad():
        expected, got = call(full, x, t), call(half, x, t)
        hidden = half.hidden(x, t)
    assert got.dtype == torch.float32 and hidden.dtype == getattr(torch, dtype)
    # relative to the logit scale; measured worst case (the planner): bf16 0.010 max, 0.004 mean,
    # fp16 0.0016 max, 0.0005 mean
    scale = expected.abs().max()
    assert (got - expected).abs().max() <= rtol * scale
    assert (got - expected).abs().mean() <= rtol / 3 * scale


def test_prepare_for_sampling_rejects_bad_arguments():
    with pytest.raises(TypeError, match="model"):
        prepare_for_sampling(lambda x: x, "bfloat16")
    with pytest.raises(ValueError, match="dtype"):
        prepare_for_sampling(make("planner"), "half")


@pytest.mark.parametrize("device, error, match", [
    ("gpu", ValueError, "device must name a torch device .*, got 'gpu'"),
    ("cuda:x", ValueError, "device must name a torch device .*, got 'cuda:x'"),
    ([0], TypeError, r"device must be a str, an int or a torch.device, got list \[0\]"),
    (True, TypeError, "device must be a str, an int or a torch.device, got bool True"),
])
def test_resolve_dtype_and_prepare_name_a_device_torch_does_not_know(device, error, match):
    """device="gpu" met torch's "Expected one of cpu, cuda, ipu, ..." RuntimeError, a list or a bool
    its "received an invalid combination of arguments", naming no argument; prepare_for_sampling
    with dtype "float32" failed inside model.to."""
    with pytest.raises(error, match=match):
        resolve_dtype("auto", device)
    with pytest.raises(error, match=match):
        resolve_dtype("float32", device)
    with pytest.raises(error, match=match):  # a torch dtype needs no device, but a bad one is still named
        resolve_dtype(torch.bfloat16, device)
    model = make("planner")
    with pytest.raises(error, match=match):
        prepare_for_sampling(model, "float32", device)
    assert next(model.parameters()).requires_grad  # refused before anything changed


def test_autocast_and_cast_weights_agree():
    # training (float32 weights under autocast) and sampling (cast weights) run the same modules
    model = make("uniform-denoiser")
    x, t = inputs(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = model(x, t)
        # the residual stream starts at the float32 embedding: hidden keeps the weights' dtype
        assert model.hidden(x, t).dtype == torch.float32
    cast = prepare_for_sampling(copy.deepcopy(model), "bfloat16")
    with torch.no_grad():
        torch.testing.assert_close(cast(x, t), autocast, rtol=2e-2, atol=2e-2)


# ---- compile_for_sampling ---------------------------------------------------------------------

@pytest.fixture
def dynamo():
    """Dynamo's counters, cleared before and its caches reset after the test."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_compiled_networks_compute_what_eager_ones_do(kind, dynamo):
    """The "eager" backend runs what Dynamo traced: the same outputs, in whole graphs (no
    break, e.g. a host-side check), and a batch of another size compiles again, once."""
    model = prepare_for_sampling(make(kind, seed=2), "float32", "cpu")
    x, t = inputs(model)
    with torch.inference_mode():
        want, want_hidden = call(model, x, t), model.hidden(x, t)
        assert compile_for_sampling(model, "eager") is model
        assert torch.equal(call(model, x, t), want) and torch.equal(model.hidden(x, t), want_hidden)
        assert dynamo["stats"]["unique_graphs"] == 2 and not dynamo["graph_break"]
        for batch in (2, 1):
            x, t = inputs(model, batch=batch, seed=batch)
            call(model, x, t)
    assert dynamo["stats"]["unique_graphs"] <= 4


def test_compiled_networks_copy_pickle_and_recompile(dynamo):
    """A deep copy computes with its own weights, a pickled network compiles again after
    loading, the state_dict keeps its keys (a layer named `hidden` is not a method and
    stays as it is), and compiling again replaces the backend."""
    model = prepare_for_sampling(make("mask-denoiser", seed=3), "float32", "cpu")
    x, t = inputs(model)
    keys = list(model.state_dict())
    with torch.inference_mode():
        want = model(x, t)
        compile_for_sampling(model, "eager")
        copy_ = copy.deepcopy(model)
        for p in copy_.parameters():
            p.zero_()
        assert not torch.equal(copy_(x, t), want) and torch.equal(model(x, t), want)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        assert torch.equal(torch.load(buffer, weights_only=False)(x, t), want)
        assert list(model.state_dict()) == keys
        compile_for_sampling(model, "aot_eager")
        assert model.forward.backend == model.hidden.backend == "aot_eager" and torch.equal(model(x, t), want)

    class Layered(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.hidden(x)

    layered = compile_for_sampling(Layered(), "eager")
    assert isinstance(layered.hidden, torch.nn.Linear) and list(layered.state_dict()) == ["hidden.weight",
                                                                                          "hidden.bias"]


class _HiddenOfX(torch.nn.Module):
    """A network split as in examples/tiny_networks.py: hidden takes x alone."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(V + 1, 4), torch.nn.Linear(4, V)

    def hidden(self, x):
        return self.embed(x)

    def forward(self, x, t):
        return self.head(self.hidden(x))


def test_compiled_methods_keep_their_signatures(dynamo):
    """A compiled hidden showed (*args, **kwargs), so the fused run's check that the denoiser's
    hidden takes (x, t) passed a compiled hidden(x), which then failed inside the first step."""
    import inspect

    from ddpd.sampling.batch import check_hidden

    network, model = compile_for_sampling(_HiddenOfX(), "eager"), compile_for_sampling(make("mask-denoiser"), "eager")
    assert str(inspect.signature(network.hidden)) == "(x)" and str(inspect.signature(network.forward)) == "(x, t)"
    assert inspect.signature(model.hidden) == inspect.signature(type(model).hidden.__get__(model))
    with pytest.raises(TypeError, match=r"^denoiser \(_HiddenOfX\) has an nn.Linear head, so the fused run calls "
                                        r"its hidden\(x, t\), but its hidden\(x\) cannot be called so"):
        check_hidden("denoiser", network, labels=False)
    check_hidden("denoiser", model, labels=True)  # hidden(x, t, labels=None): taken
    assert str(inspect.signature(copy.deepcopy(network).hidden)) == "(x)"


class _Unsigned(torch.nn.Module):
    def forward(self, x):
        return 2 * x


_Unsigned.forward.__signature__ = "unreadable"  # inspect.signature raises TypeError on it


def test_a_method_whose_signature_cannot_be_read_still_compiles(dynamo):
    """A method inspect cannot read the signature of is compiled all the same, with no signature."""
    model = compile_for_sampling(_Unsigned(), "eager")
    assert model.forward.__signature__ is None
    assert torch.equal(model(torch.ones(2)), torch.full((2,), 2.0))


def test_a_signature_inspect_refuses_with_a_value_error_is_read_as_none():
    """inspect.signature raises ValueError, not TypeError, for a partial method with arguments
    its function does not take: the compiled method then has no signature either."""
    from ddpd.models.precision import _bound_signature

    def forward(self, x):
        return x

    assert _bound_signature(functools.partialmethod(forward, y=1), torch.nn.Identity()) is None


def test_compile_for_sampling_rejects_bad_arguments():
    model = make("planner")
    for backend in ("fast", "tvm", "cudagraphs", "relu_compile_error_TESTING_ONLY"):
        with pytest.raises(ValueError, match=r"backend must be one of \('inductor', 'aot_eager', 'eager'\)"):
            compile_for_sampling(model, backend)
    with pytest.raises(TypeError, match="expected torch.nn.Module"):
        compile_for_sampling(lambda x: x)
    forward = model.forward
    assert compile_for_sampling(model, None) is model and model.forward == forward  # None: left as it is


class _HiddenOfItsNetwork(torch.nn.Module):
    """A wrapper whose `hidden` is its inner network's bound method, not one of its own class."""

    def __init__(self):
        super().__init__()
        self.network = make("mask-denoiser")
        self.hidden = self.network.hidden

    def forward(self, x, t):
        return self.network(x, t)


def test_compile_for_sampling_leaves_a_method_bound_to_another_module():
    """Only the model's own methods are compiled: a `hidden` bound to the inner network stays that
    bound method (the wrapper's class has no `hidden` to compile), while `forward` is compiled."""
    wrapper = _HiddenOfItsNetwork()
    hidden = wrapper.hidden
    compile_for_sampling(wrapper, "eager")
    assert wrapper.hidden == hidden and type(wrapper.forward).__name__ == "CompiledMethod"


def test_prepare_keeps_the_norms_float32_values():
    """A float32 norm's weights come out of a bf16 prepare unrounded, not via bfloat16 and back."""
    model = make("mask-denoiser")
    norms = [m for m in model.modules() if isinstance(m, (LayerNorm, RMSNorm))]
    with torch.no_grad():
        for norm in norms:
            for p in norm.parameters():
                p.add_(torch.randn(p.shape) / 3)
    before = [p.clone() for norm in norms for p in norm.parameters()]
    prepare_for_sampling(model, "bfloat16", "cpu")
    assert all(torch.equal(a, b) for a, b in zip(before, (p for norm in norms for p in norm.parameters())))


def test_prepare_moves_the_model_to_the_device():
    """prepare_for_sampling moves the network to `device` (the meta device, on a CPU-only machine)."""
    model = prepare_for_sampling(make("planner"), "bfloat16", "meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.backbone.embed.weight.dtype == torch.bfloat16


def test_auto_resolves_for_the_device_the_model_is_on_when_none_is_given(monkeypatch):
    """Without `device`, "auto" is resolved for the device of the model's parameters (the CPU
    for a model without any): a CUDA model gets bfloat16, not the CPU's float32."""
    import ddpd.models.precision as precision

    asked = []
    resolve = precision.resolve_dtype
    monkeypatch.setattr(precision, "resolve_dtype",
                        lambda dtype, device: asked.append(device) or resolve(dtype, device))
    prepare_for_sampling(make("planner").to("meta"), "auto")
    prepare_for_sampling(torch.nn.Identity(), "auto")
    assert asked == [torch.device("meta"), torch.device("cpu")]


def test_a_copied_compiled_network_keeps_its_backend():
    """A deep copy (and so a pickle) of a compiled network compiles with the backend it was given."""
    model = compile_for_sampling(make("planner"), "aot_eager")
    assert copy.deepcopy(model).forward.backend == "aot_eager"


def test_compiling_warms_the_attention_dispatch_for_the_model_device(monkeypatch):
    """The dispatch's caches are filled for the device of the model's parameters (the CPU for a
    model without any) before anything is compiled, and not when nothing is (backend None)."""
    import ddpd.models.precision as precision

    warmed = []
    monkeypatch.setattr(precision, "warm_dispatch", warmed.append)
    compile_for_sampling(prepare_for_sampling(make("planner"), "float32", "meta"), None)
    assert warmed == []
    compile_for_sampling(prepare_for_sampling(make("planner"), "float32", "meta"), "eager")
    compile_for_sampling(_HiddenOfX().requires_grad_(False).to("meta"), "eager")
    compile_for_sampling(torch.nn.Identity(), "eager")
    assert warmed == [torch.device("meta"), torch.device("meta"), torch.device("cpu")]


# ---- the bundled text8 models ---------------------------------------------------------------

def _bundle_inputs():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 27, (2, 256), generator=gen)
    masked = x.clone()
    masked[:, ::3] = 27
    return x, masked, torch.tensor([0.3, 0.8])


def test_bundled_models_unchanged_in_float32():
    # logits of the bundled planner and mask denoiser, recorded before class labels,
    # the float32-statistics LayerNorm and the float32 return were added
    planner, _ = load_model(os.path.join(BUNDLE, "planner"))
    denoiser, _ = load_model(os.path.join(BUNDLE, "denoiser"))
    x, masked, t = _bundle_inputs()
    with torch.no_grad():
        p, d = planner(x), denoiser(masked, t)
    planner_logits = [5.544865131378174, 2.7900373935699463, 2.7455196380615234,
                      5.602589130401611, 4.281303882598877, 5.391155242919922]
    denoiser_logits = [7.280355453491211, 2.4626572132110596, -1.9829235076904297,
                       -2.3754079341888428, -1.5806503295898438, 3.763394355773926]
    torch.testing.assert_close(p[0, :6], torch.tensor(planner_logits), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d[1, 3, :6], torch.tensor(denoiser_logits), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(p.sum(), torch.tensor(1882.784912109375), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(d.sum(), torch.tensor(-10371.0703125), rtol=1e-5, atol=1e-2)


@pytest.mark.parametrize("dtype, max_tv", [("bfloat16", 1e-2), ("float16", 2e-3)])
def test_bundled_denoiser_in_low_precision_on_cpu(dtype, max_tv):
    denoiser, _ = load_model(os.path.join(BUNDLE, "denoiser"))
    half = prepare_for_sampling(copy.deepcopy(denoiser), dtype, "cpu")
    _, masked, t = _bundle_inputs()
    with torch.no_grad():
        p, q = denoiser(masked, t).softmax(-1), half(masked, t).softmax(-1)
    tv = 0.5 * (p - q).abs().sum(-1)  # measured: bf16 mean 0.006, fp16 mean 0.0007
    assert tv.mean() <= max_tv and tv.max() <= 10 * max_tv
    assert (p.argmax(-1) == q.argmax(-1)).float().mean() >= 0.97
