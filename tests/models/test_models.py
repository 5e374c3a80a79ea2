"""Networks of ddpd.models: shapes, attention backends, causality, time conditioning,
hidden states and head, validation, determinism. (Attention dispatch, precision, class
labels and adapters have their own test modules.)"""
import dataclasses
import itertools
import json
import math
import re

import numpy as np
import pytest
import torch

from ddpd.models import (
    MODEL_KINDS,
    ARModel,
    Planner,
    TransformerConfig,
    attention_backend,
    build_model,
    config_for,
    count_parameters,
    flash_available,
    get_attention_backend,
    resolve_backend,
    set_attention_backend,
)
from ddpd.models.attention import RotaryEmbedding, SelfAttention, attention, explicit_attention
from ddpd.models.backbone import LayerNorm, RMSNorm, check_labels, check_time, init_linear, timestep_embedding

V, D, B = 7, 12, 3
SMALL = dict(d_model=32, n_layers=2, n_heads=4)


def make(kind, seed=0, **fields):
    torch.manual_seed(seed)
    model = build_model(kind, config_for(kind, V, D, **{**SMALL, **fields}))
    return model.eval()


def tokens(batch=B, length=D, high=V, seed=1):
    return torch.randint(0, high, (batch, length), generator=torch.Generator().manual_seed(seed))


def call(model, x, t=None):
    if isinstance(model, (Planner, ARModel)):
        return model(x)
    return model(x, torch.full((x.shape[0],), 0.5) if t is None else t)


def randomize_modulation(model, seed=3):
    """adaLN starts at zero (identity blocks); give it weights so t and context matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "modulation" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


# ---- config -------------------------------------------------------------------------

def test_config_round_trip():
    cfg = config_for("mask-denoiser", V, D, **SMALL, norm="rmsnorm", dropout=0.1)
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.vocab_size == V + 1 and cfg.out_dim == V and cfg.time_conditioned and not cfg.causal


@pytest.mark.parametrize("fields, error", [
    (dict(n_heads=3), ValueError),            # 32 % 3 != 0
    (dict(d_model=12, n_heads=4), ValueError),  # head_dim 3 is odd: no rotary pairs
    (dict(n_layers=0), ValueError),
    (dict(dropout=1.0), ValueError),
    (dict(norm="batchnorm"), ValueError),
    (dict(causal=1), TypeError),
    (dict(time_conditioned="yes"), TypeError),
    (dict(d_model=32.0), TypeError),
])
def test_config_rejects_bad_fields(fields, error):
    base = dict(vocab_size=V, out_dim=V, d_model=32, n_layers=2, n_heads=4)
    with pytest.raises(error):
        TransformerConfig(**{**base, **fields})


@pytest.mark.parametrize("name, minimum", [("vocab_size", 1), ("out_dim", 1), ("d_model", 2), ("n_layers", 1),
                                           ("n_heads", 1), ("max_seq_len", 1), ("mlp_ratio", 1), ("num_classes", 0)])
def test_config_refuses_each_size_one_below_its_minimum(name, minimum):
    """Each size field is refused one below its minimum, in a message naming the field and the minimum."""
    base = dict(vocab_size=V, out_dim=V, d_model=2, n_layers=1, n_heads=1)
    with pytest.raises(ValueError, match=rf"^TransformerConfig.{name}: expected >= {minimum}, got {minimum - 1}$"):
        TransformerConfig(**{**base, name: minimum - 1})


def test_config_dropout_is_taken_from_zero_up_to_below_one():
    """dropout in [0, 1): both ends checked, in a message giving the range and the value."""
    for dropout in (0.0, 0.999):
        assert TransformerConfig(vocab_size=V, out_dim=V, dropout=dropout).dropout == dropout
    for dropout in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=rf"^TransformerConfig.dropout: expected in \[0, 1\), got {dropout}$"):
            TransformerConfig(vocab_size=V, out_dim=V, dropout=dropout)


def test_config_head_refusals_name_the_sizes():
    """d_model must split into n_heads heads of an even width; each refusal gives the sizes."""
    with pytest.raises(ValueError, match=r"^TransformerConfig.d_model: expected a multiple of n_heads=3, got 32$"):
        TransformerConfig(vocab_size=V, out_dim=V, d_model=32, n_heads=3)
    with pytest.raises(ValueError, match=r"^TransformerConfig: rotary embeddings need an even head dimension "
                                         r"d_model / n_heads, got 12 / 4 = 3$"):
        TransformerConfig(vocab_size=V, out_dim=V, d_model=12, n_heads=4)
    assert TransformerConfig(vocab_size=V, out_dim=V, d_model=2, n_heads=1).head_dim == 2
    head_dim = TransformerConfig(vocab_size=V, out_dim=V, d_model=48, n_heads=6).head_dim
    assert type(head_dim) is int and head_dim == 8  # an int, as a view or a kernel's size takes it


def test_config_defaults_and_their_dict():
    """The defaults of the fields after vocab_size and out_dim, as to_dict writes them in field order."""
    cfg = TransformerConfig(vocab_size=V, out_dim=1)
    assert list(cfg.to_dict().items()) == [
        ("vocab_size", V), ("out_dim", 1), ("d_model", 256), ("n_layers", 4), ("n_heads", 4), ("max_seq_len", 256),
        ("time_conditioned", False), ("causal", False), ("dropout", 0.0), ("norm", "layernorm"), ("mlp_ratio", 4),
        ("num_classes", 0)]
    assert cfg.head_dim == 64 and not cfg.conditioned
    assert TransformerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_config_head_dim_and_conditioned():
    """head_dim is d_model / n_heads; conditioned is True with a time input or one class label or more."""
    assert TransformerConfig(vocab_size=V, out_dim=V, d_model=32, n_heads=4).head_dim == 8
    assert not TransformerConfig(vocab_size=V, out_dim=V).conditioned
    assert TransformerConfig(vocab_size=V, out_dim=V, time_conditioned=True).conditioned
    assert TransformerConfig(vocab_size=V, out_dim=V, num_classes=1).conditioned


def test_config_from_dict_fills_the_fields_with_defaults():
    """An older config.json, without the fields added later, loads with their defaults."""
    assert TransformerConfig.from_dict({"vocab_size": V, "out_dim": 1}) == TransformerConfig(vocab_size=V, out_dim=1)


def test_config_takes_numpy_integers_and_keeps_ints():
    """A numpy integer field (a size computed with numpy) was refused as not an int; taken, it
    is kept as an int, so the config equals the int-built one and config.json holds it."""
    plain = config_for("mask-denoiser", V, D, **SMALL, num_classes=2)
    cfg = TransformerConfig(**{name: np.int64(value) if type(value) is int else value
                               for name, value in plain.to_dict().items()})
    assert cfg == plain and hash(cfg) == hash(plain)
    assert all(type(value) is not np.int64 for value in cfg.to_dict().values())
    assert TransformerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == plain
    assert config_for("mask-denoiser", np.int32(V), np.int64(D), **SMALL, num_classes=2) == plain
    for value in (True, 32.0, np.float64(32), torch.tensor(32)):
        with pytest.raises(TypeError, match=f"^TransformerConfig.d_model: expected int, got {type(value).__name__}"):
            TransformerConfig(vocab_size=V, out_dim=V, d_model=value)


@pytest.mark.parametrize("dropout", [np.float32(0.25), np.float64(0.25), 0.25])
def test_config_takes_a_numpy_float_dropout_and_keeps_a_float(dropout):
    """A numpy float32 dropout was refused as not a float (a float64 was kept as numpy's)."""
    cfg = TransformerConfig(vocab_size=V, out_dim=V, dropout=dropout)
    assert type(cfg.dropout) is float and cfg == TransformerConfig(vocab_size=V, out_dim=V, dropout=0.25)
    json.dumps(cfg.to_dict())


def test_config_from_dict_rejects_unknown_and_missing():
    good = TransformerConfig(vocab_size=V, out_dim=V).to_dict()
    with pytest.raises(ValueError, match="unknown"):
        TransformerConfig.from_dict({**good, "n_embd": 3})
    del good["out_dim"]
    with pytest.raises(ValueError, match="missing"):
        TransformerConfig.from_dict(good)


def test_config_from_dict_names_the_fields_it_refuses():
    """Unknown fields are listed sorted with the known ones, missing required fields sorted."""
    good = TransformerConfig(vocab_size=V, out_dim=V).to_dict()
    known = re.escape(str(sorted(good)))
    with pytest.raises(ValueError, match=rf"^TransformerConfig.from_dict: unknown fields \['n_embd', 'width'\]; "
                                         rf"known fields {known}$"):
        TransformerConfig.from_dict({**good, "width": 3, "n_embd": 3})
    with pytest.raises(ValueError, match=r"^TransformerConfig.from_dict: missing required fields "
                                         r"\['out_dim', 'vocab_size'\]$"):
        TransformerConfig.from_dict({"d_model": 32})


def test_config_for_derives_kind_layout():
    assert config_for("planner", V, D).out_dim == 1
    assert config_for("ar", V, D).max_seq_len == D + 1
    assert config_for("ar", V, D).causal
    for kind in ("planner", "ar"):  # neither has a time input: refused here, not at build_model
        with pytest.raises(ValueError, match=f"time_conditioned: a {kind} model has no time input, got True"):
            config_for(kind, V, D, time_conditioned=True)
    with pytest.raises(ValueError, match="derived"):
        config_for("uniform", V, D, out_dim=3)
    with pytest.raises(TypeError, match="time_conditioned must be a bool, got str 'yes'"):
        config_for("ar", V, D, time_conditioned="yes")
    with pytest.raises(TypeError, match="vocab_size must be an int, got bool True"):
        config_for("uniform", True, D)
    with pytest.raises(ValueError, match="seq_len must be >= 1, got 0"):
        config_for("uniform", V, 0)

    with pytest.raises(ValueError, match="^vocab_size must be >= 1, got 0$"):
        config_for("uniform", 0, D)


def test_config_for_times_the_three_denoising_kinds_by_default():
    """time_conditioned defaults to True for the denoisers and the uniform model, False for planner and ar."""
    assert {kind: config_for(kind, V, D).time_conditioned for kind in MODEL_KINDS} == {
        "planner": False, "mask-denoiser": True, "uniform-denoiser": True, "uniform": True, "ar": False}


def test_each_kind_builds_its_class_and_the_kinds_are_listed_in_order():
    """MODEL_KINDS lists the kinds as the module docstring does; build_model and build_skeleton
    give each kind's own class."""
    from ddpd.models import MaskDenoiser, UniformDenoiser, UniformModel
    from ddpd.models.factory import build_skeleton

    classes = {"planner": Planner, "mask-denoiser": MaskDenoiser, "uniform-denoiser": UniformDenoiser,
               "uniform": UniformModel, "ar": ARModel}
    assert MODEL_KINDS == tuple(classes)
    for kind, cls in classes.items():
        config = config_for(kind, V, D, **SMALL)
        assert type(build_model(kind, config)) is cls and type(build_skeleton(kind, config)) is cls


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_config_for_takes_an_explicit_time_conditioned_where_the_kind_allows_it(kind):
    """False is accepted for every kind, the planner and ar included; True for the three denoising kinds."""
    assert config_for(kind, V, D, time_conditioned=False).time_conditioned is False
    if kind not in ("planner", "ar"):
        assert config_for(kind, V, D, time_conditioned=True).time_conditioned is True


@pytest.mark.parametrize("field", ["out_dim", "causal", "max_seq_len"])
def test_config_for_refuses_each_derived_field_by_name(field):
    """A derived field in fields is a ValueError naming it, not a duplicate-keyword TypeError."""
    with pytest.raises(ValueError, match=rf"^config_for: fields \['{field}'\] are derived"):
        config_for("uniform", V, D, **{field: 3})
    with pytest.raises(ValueError, match=r"fields \['causal', 'max_seq_len', 'out_dim'\] are derived"):
        config_for("uniform", V, D, out_dim=3, max_seq_len=5, causal=True)


@pytest.mark.parametrize("kind", [["planner"], {"planner": 1}, None, 3])
def test_a_kind_that_is_not_a_name_is_refused_in_one_line(kind):
    from ddpd.models.factory import build_skeleton

    expected = rf"kind: expected one of \({MODEL_KINDS[0]!r}.*got {re.escape(repr(kind))}"
    for build in (lambda: config_for(kind, 27, 16), lambda: build_model(kind, config_for("planner", 27, 16)),
                  lambda: build_skeleton(kind, config_for("planner", 27, 16))):
        with pytest.raises(ValueError, match=expected):
            build()


def test_build_model_rejects_config_of_another_kind():
    with pytest.raises(ValueError, match="kind"):
        build_model("gpt", config_for("uniform", V, D))
    with pytest.raises(ValueError, match="vocab_size"):
        build_model("mask-denoiser", config_for("uniform", V, D, **SMALL))
    with pytest.raises(ValueError, match="time_conditioned"):
        Planner(config_for("uniform-denoiser", V, D, **SMALL).__class__(
            vocab_size=V, out_dim=1, time_conditioned=True, **SMALL))
    with pytest.raises(ValueError, match="causal"):
        build_model("ar", TransformerConfig(vocab_size=V + 1, out_dim=V, **SMALL))


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_each_kind_builds_with_a_vocabulary_of_a_tokenizer_size(kind):
    # sizes past the small integers Python caches: the layout checks compare values, not objects
    vocab = 50257
    config = TransformerConfig.from_dict(json.loads(json.dumps(config_for(kind, vocab, 4, d_model=8, n_layers=1,
                                                                          n_heads=1).to_dict())))
    model = build_model(kind, config)
    assert model.config.out_dim == (1 if kind == "planner" else vocab)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_config_dict_is_refused_as_not_a_config(kind):
    """config.json's "model" dict passed as the config: four kinds read its out_dim before the
    type check and raised AttributeError."""
    with pytest.raises(TypeError, match="^config: expected TransformerConfig, got dict$"):
        build_model(kind, config_for(kind, V, D).to_dict())


def test_the_backbone_and_the_config_name_what_they_take():
    from ddpd.models import Backbone

    with pytest.raises(TypeError, match="^config: expected TransformerConfig, got dict$"):
        Backbone(config_for("planner", V, D).to_dict())
    with pytest.raises(TypeError, match="^TransformerConfig.from_dict: expected dict, got TransformerConfig$"):
        TransformerConfig.from_dict(config_for("planner", V, D))
    for dropout in ("0.1", True, None):
        expected = f"^TransformerConfig.dropout: expected float, got {type(dropout).__name__}$"
        with pytest.raises(TypeError, match=expected):
            TransformerConfig(vocab_size=V, out_dim=V, dropout=dropout)


# ---- shapes and parameter count ------------------------------------------------------

@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_output_shapes(kind):
    model = make(kind)
    x = tokens(high=model.config.vocab_size)
    out = call(model, x)
    expected = (B, D) if kind == "planner" else (B, D, V)
    assert out.shape == expected and out.dtype == torch.float32
    assert model.hidden(x, torch.full((B,), 0.5)).shape == (B, D, SMALL["d_model"])


def test_the_planner_keeps_a_single_row_and_a_single_position():
    # one logit per position: only the head's width-1 axis is dropped, never the batch or D
    model = make("planner")
    with torch.no_grad():
        assert model(tokens(batch=1)).shape == (1, D)
        assert model(tokens(length=1)).shape == (B, 1)
        assert model(tokens(batch=1, length=1)).shape == (1, 1)


def test_count_parameters_counts_a_shared_tensor_once():
    """Weights tied between two modules (an embedding and a head) are one tensor, counted once."""
    embedding, head = torch.nn.Embedding(V, 4), torch.nn.Linear(4, V, bias=False)
    head.weight = embedding.weight
    tied = torch.nn.ModuleDict({"embedding": embedding, "head": head})
    assert count_parameters(tied) == count_parameters(tied, trainable_only=True) == V * 4


def test_count_parameters_matches_hand_count():
    d, L, out = 32, 2, V
    model = make("uniform", time_conditioned=False)
    per_block = 2 * (2 * d) + 3 * d * d + d * d + 2 * (4 * d * d)  # 2 LayerNorms, qkv, proj, MLP
    expected = V * d + L * per_block + 2 * d + (d * out + out)
    assert count_parameters(model) == expected
    model.head.weight.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == expected - d * out
    assert count_parameters(model) == expected  # frozen parameters count by default
    with pytest.raises(TypeError, match="^model: expected torch.nn.Module, got dict$"):
        count_parameters(dict(model.named_parameters()))


# ---- attention -----------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_matches_explicit_attention(causal):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 8, generator=gen) for _ in range(3))
    with attention_backend("sdpa"):
        fast = attention(q, k, v, causal)
    slow = explicit_attention(q, k, v, causal)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)


def test_explicit_attention_by_hand():
    # one head, two positions, d = 1: scores q_i k_j / 1
    q = torch.tensor([0.0, math.log(3.0)]).view(1, 1, 2, 1)
    k = torch.tensor([0.0, 1.0]).view(1, 1, 2, 1)
    v = torch.tensor([2.0, 6.0]).view(1, 1, 2, 1)
    out = explicit_attention(q, k, v, causal=False).flatten()
    # row 0: equal weights -> 4; row 1: weights 1 : 3 -> (2 + 18) / 4 = 5
    torch.testing.assert_close(out, torch.tensor([4.0, 5.0]))
    causal = explicit_attention(q, k, v, causal=True).flatten()
    torch.testing.assert_close(causal, torch.tensor([2.0, 5.0]))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_module_sdpa_equals_math(causal):
    torch.manual_seed(0)
    layer = SelfAttention(32, 4, 16, causal)
    x = torch.randn(2, 16, 32)
    with attention_backend("sdpa"):
        fast = layer(x)
    with attention_backend("math"):
        slow = layer(x)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)


def test_backend_selection_on_cpu():
    q = torch.randn(1, 1, 4, 8)
    assert get_attention_backend() == "auto"
    assert resolve_backend(q) == "sdpa"
    with attention_backend("math"):
        assert resolve_backend(q) == "math"
    assert get_attention_backend() == "auto"
    with pytest.raises(ValueError):
        set_attention_backend("xformers")
    if not flash_available():
        with pytest.raises(ValueError, match="flash"):
            set_attention_backend("flash")


def test_rotary_scores_depend_on_relative_position_only():
    rotary = RotaryEmbedding(head_dim=8, max_seq_len=10)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(8, generator=gen).expand(1, 1, 10, 8)
    k = torch.randn(8, generator=gen).expand(1, 1, 10, 8)
    scores = (rotary(q) @ rotary(k).transpose(-1, -2))[0, 0]
    torch.testing.assert_close(scores[1:, 1:], scores[:-1, :-1], rtol=1e-5, atol=1e-5)
    # and the position does enter: offsets 0 and 3 give different scores
    assert not torch.allclose(scores[0, 0], scores[0, 3])


def test_rotary_tables_are_float64_angles_rounded_once():
    """cos/sin of pos * 10000^(-2i/d) computed in float64, rounded to float32 once (long positions too)."""
    rotary = RotaryEmbedding(head_dim=8, max_seq_len=4096)
    inv_freq = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = torch.arange(4096, dtype=torch.float64)[:, None] * inv_freq
    assert torch.equal(rotary.cos, angles.cos().float()) and torch.equal(rotary.sin, angles.sin().float())


def test_rotary_tables_follow_the_default_device():
    """Built under `with torch.device(...)` the tables are computed on the CPU in float64 and
    land on that device, with the network's parameters. A fake CUDA device (shapes, dtypes and
    devices without memory) stands in for a GPU: the CPU has no other device that computes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.device("cuda"):
        rotary = RotaryEmbedding(head_dim=8, max_seq_len=10)
    assert rotary.cos.device.type == rotary.sin.device.type == "cuda"
    assert rotary.cos.dtype == torch.float32 and rotary.cos.shape == (10, 4)


def test_rotary_tables_follow_the_network_to_another_device_in_float32():
    """Moving or casting the network moves the tables with it and keeps them float32 (a bf16
    table would round the angles). The meta device stands in for an accelerator."""
    rotary = RotaryEmbedding(head_dim=8, max_seq_len=10).to("meta", torch.bfloat16)
    assert rotary.cos.device.type == rotary.sin.device.type == "meta"
    assert rotary.cos.dtype == rotary.sin.dtype == torch.float32 and rotary.cos.shape == (10, 4)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_skeleton_to_empty_then_load_computes_what_the_network_does(kind):
    from ddpd.models.factory import build_skeleton

    model = make(kind)
    skeleton = build_skeleton(kind, model.config).to_empty(device="cpu")  # rotary tables recomputed, not copied
    skeleton.load_state_dict(model.state_dict())
    for built, filled in zip(model.buffers(), skeleton.buffers()):
        assert torch.equal(built, filled)
    x = tokens(high=model.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(call(skeleton.eval(), x), call(model, x), rtol=0, atol=0)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_skeleton_loaded_with_assign_computes_what_the_network_does(kind):
    """load_state_dict(assign=True) does not touch the rotary tables (not in a state dict):
    they stayed on the meta device, and the first call failed deep in the rotation."""
    from ddpd.models.factory import build_skeleton

    model = make(kind)
    skeleton = build_skeleton(kind, model.config)
    skeleton.load_state_dict(model.state_dict(), assign=True)
    for built, filled in zip(model.buffers(), skeleton.buffers()):
        assert torch.equal(built, filled)
    x = tokens(high=model.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(call(skeleton.to("cpu").eval(), x), call(model, x), rtol=0, atol=0)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_skeleton_has_the_names_shapes_and_dtypes_of_the_network(kind):
    """build_skeleton's promise, for the rotary tables too, which it makes without computing them."""
    from ddpd.models.factory import build_skeleton

    def layout(network):
        tensors = itertools.chain(network.named_parameters(), network.named_buffers())
        return {name: (tuple(tensor.shape), tensor.dtype) for name, tensor in tensors}

    model = make(kind)
    skeleton = build_skeleton(kind, model.config)
    assert layout(skeleton) == layout(model)
    assert {t.device.type for t in itertools.chain(skeleton.parameters(), skeleton.buffers())} == {"meta"}


@pytest.mark.parametrize("kind", ["planner", "mask-denoiser"])
def test_a_skeleton_runs_no_initialiser_and_no_random_fill(kind):
    """build_skeleton swallows torch.nn.init's functions and tensors' random fills before they run."""
    from torch.overrides import TorchFunctionMode

    from ddpd.models.factory import build_skeleton

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            called.append(f"{getattr(func, '__module__', None)}.{getattr(func, '__name__', None)}")
            return func(*args, **(kwargs or {}))

    called = []
    with Record():
        build_skeleton(kind, config_for(kind, V, D, **SMALL))
    fills = ("normal_", "uniform_", "zeros_", "trunc_normal_")
    assert called and not [name for name in called if name.startswith("torch.nn.init.") or name.endswith(fills)]


@pytest.mark.parametrize("fill, args", [("normal_", ()), ("uniform_", ()), ("random_", ()), ("bernoulli_", ()),
                                        ("exponential_", ()), ("geometric_", (0.5,)), ("log_normal_", ()),
                                        ("cauchy_", ())])
def test_the_skeleton_mode_skips_each_random_fill_of_a_tensor(fill, args):
    """A fill called on the tensor itself, not through torch.nn.init, is skipped too: the tensor
    comes back as it was, and anything else runs."""
    from ddpd.models.factory import _NoInitialisers

    tensor = torch.zeros(8)
    with _NoInitialisers():
        assert getattr(tensor, fill)(*args) is tensor
        assert torch.equal(tensor + 1, torch.ones(8))
    assert torch.equal(tensor, torch.zeros(8))


@pytest.mark.parametrize("norm, cls", [("rmsnorm", RMSNorm), ("layernorm", LayerNorm)])
def test_the_config_norm_is_every_norm_of_the_trunk(norm, cls):
    """config.norm picks the two norms of each block and the final one."""
    model = make("mask-denoiser", norm=norm)
    norms = [m for m in model.modules() if isinstance(m, (RMSNorm, torch.nn.LayerNorm))]
    assert len(norms) == 2 * SMALL["n_layers"] + 1 and all(type(m) is cls for m in norms)


def test_model_sees_positions():
    # without positions a bidirectional transformer is permutation-equivariant
    model = make("planner")
    x = tokens()
    perm = torch.randperm(D, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        permuted_input, permuted_output = model(x[:, perm]), model(x)[:, perm]
    assert (permuted_input - permuted_output).abs().amax() > 1e-4


@pytest.mark.gpu
def test_denoiser_bf16_autocast_on_cuda():
    model = make("mask-denoiser").cuda()
    randomize_modulation(model)
    x, t = tokens(high=V + 1).cuda(), torch.rand(B, device="cuda")
    with torch.no_grad():
        full = model(x, t)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            half = model(x, t)
    torch.testing.assert_close(half.float(), full, rtol=1e-2, atol=1e-2)


# ---- causality and context -----------------------------------------------------------

def test_causal_model_does_not_look_ahead():
    model = make("ar")
    x = tokens(high=V + 1)
    cut = 5
    y = x.clone()
    y[:, cut + 1:] = (y[:, cut + 1:] + 1) % V
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :cut + 1], b[:, :cut + 1], rtol=1e-5, atol=1e-6)
    assert (a[:, cut + 1:] - b[:, cut + 1:]).abs().amax() > 1e-4


@pytest.mark.parametrize("kind", ["planner", "mask-denoiser", "uniform-denoiser", "uniform"])
def test_bidirectional_model_looks_ahead(kind):
    model = randomize_modulation(make(kind))
    x = tokens()
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % V
    with torch.no_grad():
        a, b = call(model, x), call(model, y)
    assert (a[:, 0] - b[:, 0]).abs().amax() > 1e-4


# ---- time conditioning ---------------------------------------------------------------

def test_fresh_time_conditioned_blocks_are_identity():
    # adaLN-Zero: with zero gates every block returns its input, so hidden = norm(embed(x))
    model = make("uniform-denoiser")
    x = tokens()
    with torch.no_grad():
        h = model.hidden(x, torch.rand(B))
        expected = model.backbone.final_norm(model.backbone.embed(x))
    torch.testing.assert_close(h, expected)


def test_the_final_modulation_gives_the_shift_first_then_the_scale():
    # only the final adaLN is non-zero, so hidden = norm(embed(x)) * (1 + scale) + shift
    model = make("uniform-denoiser")
    backbone = model.backbone
    shift, scale = torch.linspace(-1, 1, SMALL["d_model"]), torch.linspace(0.5, 2, SMALL["d_model"])
    with torch.no_grad():
        backbone.final_modulation.bias.copy_(torch.cat([shift, scale]))
        x = tokens()
        h = model.hidden(x, torch.rand(B))
        expected = backbone.final_norm(backbone.embed(x)) * (1 + scale) + shift
    torch.testing.assert_close(h, expected)


def test_time_conditioning_changes_outputs():
    model = randomize_modulation(make("uniform-denoiser"))
    x = tokens()
    with torch.no_grad():
        early, late = model(x, torch.full((B,), 0.1)), model(x, torch.full((B,), 0.9))
        scalar = model(x, 0.9)
    assert (early - late).abs().amax() > 1e-3
    torch.testing.assert_close(scalar, late)
    for number in (np.float32(0.9), np.float64(0.9), np.int64(1)):  # a numpy scalar t, as a float
        with torch.no_grad():
            torch.testing.assert_close(model(x, number), model(x, float(number)))
    with pytest.raises(ValueError, match=r"t: expected times in \[0, 1\]"):
        model(x, np.float32(1.5))


@pytest.mark.parametrize("kind", ["mask-denoiser", "uniform-denoiser", "uniform"])
def test_untimed_denoiser_ignores_t(kind):
    # config_for takes time_conditioned=False for each denoising kind, and each class builds it
    model = make(kind, time_conditioned=False)
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(x, torch.zeros(B)), model(x, torch.ones(B)), rtol=0, atol=0)


def test_planner_has_no_time_input():
    model = make("planner")
    assert model.backbone.time_embed is None
    assert not any("modulation" in name or "time" in name for name, _ in model.named_parameters())
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model.hidden(x, torch.ones(B)), model.hidden(x), rtol=0, atol=0)
    with pytest.raises(TypeError):
        model(x, torch.ones(B))


def test_time_conditioned_model_requires_t():
    model = make("mask-denoiser")
    with pytest.raises(ValueError, match="t:"):
        model(tokens())
    with pytest.raises(ValueError, match="t:"):
        model(tokens(), torch.rand(B + 1))
    with pytest.raises(TypeError, match="t:"):
        model(tokens(), torch.ones(B, dtype=torch.long))
    # a NaN or a time outside [0, 1] gave NaN or extrapolated logits without a word
    for bad in (float("nan"), 1.5, -0.1, torch.tensor(2.0), torch.rand(B).index_fill(0, torch.tensor([1]), math.nan)):
        with pytest.raises(ValueError, match=r"t: expected times in \[0, 1\]"):
            model(tokens(), bad)
    assert model(tokens(), torch.tensor([0.0, 1.0]).repeat(B // 2 + 1)[:B]).isfinite().all()
    with pytest.raises(TypeError, match=r"^t: expected a float tensor of shape \[B\] or a number, got list$"):
        model(tokens(), [0.5] * B)


# ---- hidden states and head -----------------------------------------------------------

@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_forward_is_head_of_hidden(kind):
    # the fused sampler applies `head` to `hidden` at the chosen positions only
    model = randomize_modulation(make(kind))
    x, t = tokens(high=model.config.vocab_size), torch.rand(B)
    with torch.no_grad():
        full = call(model, x, t)
        picked = model.head(model.hidden(x, t)[:, [0, 5, 11]])
    expected = full[:, [0, 5, 11]]
    torch.testing.assert_close(picked.squeeze(-1) if kind == "planner" else picked, expected, rtol=1e-5, atol=1e-6)


# ---- mask denoiser and input vocabularies --------------------------------------------

def test_mask_token_has_its_own_embedding():
    model = randomize_modulation(make("mask-denoiser"))
    assert model.mask_id == V
    assert model.backbone.embed.num_embeddings == V + 1
    x = tokens()
    x[:, ::2] = model.mask_id
    t = torch.rand(B)
    with torch.no_grad():
        before = model(x, t)
        # a random direction: a constant shift would be undone by the LayerNorm
        model.backbone.embed.weight[V] += torch.randn(SMALL["d_model"], generator=torch.Generator().manual_seed(5))
        after = model(x, t)
    assert before.shape == (B, D, V)  # no logit for the mask
    assert (before[:, ::2] - after[:, ::2]).abs().amax() > 1e-3


def test_token_validation():
    model = make("uniform-denoiser")
    t = torch.rand(B)
    with pytest.raises(ValueError, match=r"\[0, 7\)"):
        model(tokens(high=V + 1, seed=4).clamp(min=V - 1), t)  # the mask id is not a uniform token
    with pytest.raises(TypeError, match="int64"):
        model(tokens().float(), t)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(tokens(length=D + 1), t)
    with pytest.raises(ValueError, match="shape"):
        model(tokens()[0], t)


def test_a_negative_token_id_is_refused_by_name():
    # an id of -1 would otherwise reach nn.Embedding and fail there with an IndexError
    x = tokens()
    x[1, 4] = -1
    with pytest.raises(ValueError, match=r"^x: expected token ids in \[0, 7\), got range \[-1, "):
        make("uniform-denoiser")(x, torch.rand(B))


def test_a_bool_time_is_refused_rather_than_read_as_one():
    with pytest.raises(TypeError, match=r"^t: expected a float tensor of shape \[B\] or a number, got bool$"):
        make("mask-denoiser")(tokens(), True)


@pytest.mark.parametrize("t", [0.5, torch.tensor(0.5), torch.full((B,), 0.5)], ids=["number", "0-d", "per-row"])
def test_times_are_returned_on_the_device_the_network_runs_on(t):
    # the meta device stands in for an accelerator: the times must follow the tokens there
    times = check_time(t, B, torch.device("meta"))
    assert times.device.type == "meta" and times.shape == (B,) and times.dtype == torch.float32


@pytest.mark.parametrize("labels", [None, 2, torch.full((B,), 2)], ids=["null", "int", "per-row"])
def test_labels_are_returned_on_the_device_the_network_runs_on(labels):
    checked = check_labels(labels, B, 4, torch.device("meta"))
    assert checked.device.type == "meta" and checked.shape == (B,) and checked.dtype == torch.long


def test_the_ar_judge_scores_sequences_of_one_token():
    # the shortest sequence check_tokens lets through when no length limit is given
    with torch.no_grad():
        assert make("ar").log_likelihood(tokens(length=1)).isfinite().all()


def test_the_ar_judge_gives_one_score_per_row_for_one_row_or_one_token():
    # a single row or a single token keeps the [B] shape: no axis is summed over the batch
    model = make("ar")
    with torch.no_grad():
        one_token = model.log_likelihood(tokens(length=1))
        first = model(model.with_bos(tokens(length=1))[:, :1])[:, 0].log_softmax(-1)
        assert one_token.shape == (B,) and model.log_likelihood(tokens(batch=1)).shape == (1,)
        torch.testing.assert_close(one_token, first.gather(1, tokens(length=1)).squeeze(1))


# ---- AR judge ------------------------------------------------------------------------

def test_ar_log_likelihood_matches_prefix_by_prefix():
    model = make("ar")
    x = tokens()
    with torch.no_grad():
        total = model.log_likelihood(x)
        xb = model.with_bos(x)
        manual = torch.zeros(B)
        for d in range(D):
            logits = model(xb[:, :d + 1])[:, -1]  # prefix BOS, x_0..x_{d-1}
            manual += logits.log_softmax(-1).gather(1, x[:, d:d + 1]).squeeze(1)
    torch.testing.assert_close(total, manual, rtol=1e-5, atol=1e-5)


def test_ar_log_likelihood_refuses_lengths_it_was_not_trained_to_score():
    model = make("ar")  # max_seq_len D + 1: trained on with_bos(x) for x of length D
    with torch.no_grad():
        assert model.log_likelihood(tokens()).shape == (B,)
        with pytest.raises(ValueError, match=rf"^x: expected sequence length in \[1, max_seq_len - 1 = {D}\] "
                                             rf"\(one position holds BOS\), got {D + 1}$"):
            model.log_likelihood(tokens(length=D + 1))


def test_an_empty_sequence_is_refused_without_naming_a_missing_limit():
    """Callers without a length limit (the AR judge's likelihood, the adapters) say so plainly."""
    with pytest.raises(ValueError, match=r"^x: expected sequence length >= 1, got 0$"):
        make("ar").log_likelihood(tokens(length=0))


def test_ar_log_likelihood_checks_the_tokens_before_their_length():
    """A list or a vector is refused by name before the length is read (an AttributeError or an
    IndexError otherwise), and an id out of range is reported even in a sequence that is too long."""
    model = make("ar")
    with pytest.raises(TypeError, match="^x: expected a torch.Tensor"):
        model.log_likelihood([[0, 1, 2]])
    with pytest.raises(ValueError, match=r"^x: expected shape \[B, D\], got \(12,\)$"):
        model.log_likelihood(tokens()[0])
    too_long = tokens(length=D + 1)
    too_long[0, 0] = V
    with pytest.raises(ValueError, match=rf"^x: expected token ids in \[0, {V}\)"):
        model.log_likelihood(too_long)


def test_ar_with_bos_validates_the_clean_tokens():
    """A list is a wrong type, and the BOS id (or beyond) among the clean tokens is refused
    rather than prefixed and read as a second start of sequence."""
    model = make("ar")
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        model.with_bos([[0, 1, 2]])
    with pytest.raises(ValueError, match=rf"x: expected token ids in \[0, {V}\)"):
        model.with_bos(tokens().clamp(min=V - 1) + 1)
    assert torch.equal(model.with_bos(tokens())[:, 1:], tokens())


def test_ar_with_bos_puts_the_bos_column_on_the_tokens_device():
    # the meta default device stands in for an accelerator: BOS follows x, not the default device
    model = make("ar")
    x = tokens()
    with torch.device("meta"):
        with_bos = model.with_bos(x)
    assert with_bos.device == x.device and torch.equal(with_bos[:, 0], torch.full((B,), V))


def test_ar_likelihood_is_a_distribution():
    torch.manual_seed(0)
    model = ARModel(config_for("ar", 3, 3, **SMALL)).eval()
    every = torch.tensor(list(itertools.product(range(3), repeat=3)))
    with torch.no_grad():
        total = model.log_likelihood(every).exp().sum()
    torch.testing.assert_close(total, torch.tensor(1.0), rtol=1e-5, atol=1e-6)


# ---- determinism, gradients, variants -------------------------------------------------

@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_same_seed_same_model_same_output(kind):
    a, b = make(kind, seed=7), make(kind, seed=7)
    x = tokens(high=a.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(call(a, x), call(b, x), rtol=0, atol=0)
    c = make(kind, seed=8)
    assert not torch.equal(a.head.weight, c.head.weight)


def test_dropout_only_in_training():
    model = make("planner", dropout=0.5)
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(x), rtol=0, atol=0)
        model.train()
        assert not torch.equal(model(x), model(x))


def test_training_drops_token_embeddings_before_the_first_block():
    model = make("planner", dropout=0.5).train()
    x = tokens()
    seen = []
    model.backbone.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        model(x)
        embedded = model.backbone.embed(x)
    dropped = seen[0] == 0
    assert dropped.any() and not dropped.all()
    torch.testing.assert_close(seen[0][~dropped], 2 * embedded[~dropped])


def test_gradients_reach_every_parameter():
    model = make("planner", norm="rmsnorm").train()
    model(tokens()).square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_gradients_reach_modulation_at_init():
    model = make("mask-denoiser").train()
    model(tokens(high=V + 1), torch.rand(B)).square().mean().backward()
    gates = model.backbone.blocks[0].modulation.weight.grad
    assert gates is not None and gates.abs().sum() > 0


def test_cpu_bf16_autocast_close_to_float32():
    model = randomize_modulation(make("uniform"))
    x, t = tokens(), torch.rand(B)
    with torch.no_grad():
        full = model(x, t)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(x, t)
    torch.testing.assert_close(half.float(), full, rtol=1e-2, atol=1e-2)


def test_rmsnorm_and_the_residual_projections_start_as_stated():
    """RMSNorm is x / sqrt(mean(x^2) + 1e-6) * weight; the projections closing each residual
    branch start with std 0.02 / sqrt(2 * n_layers) (GPT-2), the other weights with 0.02."""
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0)) * 1e-3
    torch.testing.assert_close(RMSNorm(8)(x), x / (x.square().mean(-1, keepdim=True) + 1e-6).sqrt())
    torch.manual_seed(0)
    model = build_model("planner", config_for("planner", 27, 16, d_model=64, n_layers=8, n_heads=4))
    block = model.backbone.blocks[0]
    assert float(block.attn.proj.weight.detach().std()) == pytest.approx(0.02 / 4, rel=0.05)
    assert float(block.mlp.proj.weight.detach().std()) == pytest.approx(0.02 / 4, rel=0.05)
    assert float(block.attn.qkv.weight.detach().std()) == pytest.approx(0.02, rel=0.05)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_fresh_network_starts_with_zero_biases(kind):
    # GPT-2 initialisation: nn.Linear's default uniform bias would shift every logit at step 0
    model = make(kind)
    biases = {name: p for name, p in model.named_parameters() if name.endswith(".bias") and "norm" not in name}
    assert "head.bias" in biases
    for name, bias in biases.items():
        assert torch.count_nonzero(bias) == 0, name


@pytest.mark.parametrize("kind, field, value", [("planner", "time_conditioned", True), ("planner", "causal", True),
                                                ("ar", "time_conditioned", True), ("ar", "causal", False)])
def test_a_planner_or_ar_config_with_the_wrong_layout_is_refused_by_the_class(kind, field, value):
    # config_for refuses these itself; a TransformerConfig built by hand reaches the class's check.
    config = dataclasses.replace(config_for(kind, V, D, **SMALL), **{field: value})
    with pytest.raises(ValueError, match=rf"config\.{field}: a {kind} model expects {not value}, got {value}"):
        build_model(kind, config)


@pytest.mark.parametrize("kind", ["mask-denoiser", "uniform-denoiser", "uniform"])
def test_a_causal_config_is_refused_by_each_bidirectional_denoising_class(kind):
    # a denoiser reads the whole noisy sequence: a causal mask would hide the later positions
    config = dataclasses.replace(config_for(kind, V, D, **SMALL), causal=True)
    with pytest.raises(ValueError, match=rf"^config\.causal: a {kind} model expects False, got True$"):
        build_model(kind, config)


@pytest.mark.parametrize("kind, extra_rows", [("mask-denoiser", 1), ("uniform-denoiser", 0), ("uniform", 0),
                                              ("ar", 1)])
def test_each_kind_refuses_an_input_vocabulary_of_another_size_than_its_layout(kind, extra_rows):
    # the mask and BOS ids are one input row past the V outputs; the uniform kinds see the V symbols only
    config = config_for(kind, V, D, **SMALL)
    assert config.vocab_size == V + extra_rows
    for vocab in (V + extra_rows - 1, V + extra_rows + 1):
        with pytest.raises(ValueError, match=rf"^config\.vocab_size: a {kind} model expects {V + extra_rows}, "
                                             rf"got {vocab}$"):
            build_model(kind, dataclasses.replace(config, vocab_size=vocab))


def test_a_config_of_another_kind_is_refused_by_the_first_field_of_the_layout_it_misses():
    # a denoiser's config differs from a planner's in out_dim and time_conditioned, from the judge's
    # in vocab_size, causal and time_conditioned: the message names the field the class checks first
    with pytest.raises(ValueError, match=r"^config\.out_dim: a planner model expects 1, got 7$"):
        build_model("planner", config_for("mask-denoiser", V, D, **SMALL))
    with pytest.raises(ValueError, match=r"^config\.vocab_size: a ar model expects 8, got 7$"):
        build_model("ar", config_for("uniform", V, D, **SMALL))


def test_a_planner_config_with_more_than_one_output_is_refused():
    # the planner gives one logit per position: a wider head would not squeeze to [B, D]
    config = dataclasses.replace(config_for("planner", V, D, **SMALL), out_dim=2)
    with pytest.raises(ValueError, match=r"^config\.out_dim: a planner model expects 1, got 2$"):
        build_model("planner", config)


def test_training_drops_inside_both_sub_layers_of_a_block():
    # besides the token embeddings, attention and the MLP each take the config's dropout
    model = make("planner", dropout=0.5).train()
    block = model.backbone.blocks[0]
    h = torch.randn(B, D, SMALL["d_model"], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for sub_layer in (block.attn, block.mlp):
            assert not torch.equal(sub_layer(h), sub_layer(h))
            sub_layer.eval()
            torch.testing.assert_close(sub_layer(h), sub_layer(h), rtol=0, atol=0)


def test_a_conditioned_block_is_two_gated_residuals_in_order():
    # shift, scale, gate for attention then for the MLP; on the CPU x + gate * branch, rounded twice
    model = randomize_modulation(make("uniform-denoiser"))
    block = model.backbone.blocks[0]
    gen = torch.Generator().manual_seed(0)
    x, c = torch.randn(B, D, SMALL["d_model"], generator=gen), torch.randn(B, SMALL["d_model"], generator=gen)
    with torch.no_grad():
        shift1, scale1, gate1, shift2, scale2, gate2 = block.modulation(c)[:, None, :].chunk(6, dim=-1)
        mid = x + gate1 * block.attn(block.norm1(x, shift1, scale1))
        expected = mid + gate2 * block.mlp(block.norm2(mid, shift2, scale2))
        assert torch.equal(block(x, c), expected)


def test_the_conditioning_vector_is_the_silu_of_time_plus_label():
    model = randomize_modulation(make("mask-denoiser", num_classes=4))
    backbone = model.backbone
    x, t, labels = tokens(), torch.rand(B), torch.tensor([0, 3, 4])
    with torch.no_grad():
        c = backbone.condition(x, t, labels)
        expected = torch.nn.functional.silu(backbone.time_embed(t) + backbone.label_embed(labels))
    torch.testing.assert_close(c, expected, rtol=0, atol=0)


def test_init_linear_draws_weights_with_the_std_it_is_given():
    torch.manual_seed(0)
    for module in (torch.nn.Linear(128, 128), torch.nn.Embedding(128, 128)):
        init_linear(module, std=0.1)
        assert float(module.weight.detach().std()) == pytest.approx(0.1, rel=0.05)


def test_time_features_are_float32_for_a_float64_time():
    t = torch.rand(B, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    features = timestep_embedding(t)
    assert features.dtype == torch.float32 and features.shape == (B, 256)
    torch.testing.assert_close(features, timestep_embedding(t.float()), rtol=0, atol=0)


def test_a_token_vector_and_int32_labels_are_refused_by_name():
    # int32 labels would index the label table silently; the shape is reported as a tuple
    with pytest.raises(ValueError, match=r"^x: expected shape \[B, D\], got \(12,\)$"):
        make("uniform-denoiser")(tokens()[0], torch.rand(B))
    with pytest.raises(TypeError, match=r"^labels: expected dtype torch.int64, got torch.int32$"):
        check_labels(torch.full((B,), 2, dtype=torch.int32), B, 4, torch.device("cpu"))


def test_time_features_are_cosines_then_sines_of_a_thousand_t_at_geometric_frequencies():
    # dim 4: frequencies 1 and 10000 ** (-1 / 2); t = 0.25 is spread to 1000 * t = 250
    features = timestep_embedding(torch.tensor([0.0, 0.25]), dim=4)
    args = [250.0, 2.5]
    expected = torch.tensor([[1.0, 1.0, 0.0, 0.0],
                             [math.cos(args[0]), math.cos(args[1]), math.sin(args[0]), math.sin(args[1])]])
    torch.testing.assert_close(features, expected, rtol=0, atol=1e-5)


def test_the_time_embedding_is_the_mlp_of_the_default_time_features():
    model = make("uniform-denoiser")
    t = torch.rand(B, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model.backbone.time_embed.mlp(timestep_embedding(t, dim=256, max_period=10000.0))
        torch.testing.assert_close(model.backbone.time_embed(t), expected, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["planner", "mask-denoiser"])
def test_the_trunk_drops_the_token_embeddings_once_and_nothing_else(kind):
    # the trunk's own dropout acts on the embeddings only, not again before the final norm
    model = make(kind, dropout=0.5).train()
    seen = []
    model.backbone.dropout.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    x = tokens()
    with torch.no_grad():
        call(model, x)
        torch.testing.assert_close(seen, [model.backbone.embed(x)], rtol=0, atol=0)


def test_layernorm_normalises_with_its_own_eps():
    # eps matters for small activations: the trunk's LayerNorm keeps torch's 1e-5, or the one it is given
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0)) * 1e-3
    for eps in (1e-5, 0.5):
        norm = LayerNorm(8) if eps == 1e-5 else LayerNorm(8, eps=eps)
        torch.testing.assert_close(norm(x), torch.nn.functional.layer_norm(x, (8,), eps=eps))


def test_int32_token_ids_are_refused_by_dtype():
    # nn.Embedding takes int32 ids as well: the trunk takes int64 only, as every sampler hands it
    with pytest.raises(TypeError, match=r"^x: expected dtype torch.int64, got torch.int32$"):
        make("uniform-denoiser")(tokens().int(), torch.rand(B))


def test_the_conditioning_vector_of_time_alone_or_labels_alone_is_its_silu():
    timed = randomize_modulation(make("uniform-denoiser")).backbone
    labelled = randomize_modulation(make("planner", num_classes=4)).backbone
    x, t, labels = tokens(), torch.rand(B), torch.tensor([0, 3, 4])
    with torch.no_grad():
        silu = torch.nn.functional.silu
        torch.testing.assert_close(timed.condition(x, t, None), silu(timed.time_embed(t)), rtol=0, atol=0)
        torch.testing.assert_close(labelled.condition(x, None, labels), silu(labelled.label_embed(labels)),
                                   rtol=0, atol=0)


def test_the_residual_projections_of_a_one_layer_trunk_start_with_std_over_root_two():
    # 2 * n_layers residual branches: one block gives its two projections std 0.02 / sqrt(2)
    torch.manual_seed(0)
    model = build_model("planner", config_for("planner", 27, 16, d_model=64, n_layers=1, n_heads=4))
    block = model.backbone.blocks[0]
    for projection in (block.attn.proj, block.mlp.proj):
        assert float(projection.weight.detach().std()) == pytest.approx(0.02 / math.sqrt(2), rel=0.05)
