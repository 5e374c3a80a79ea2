"""Class-conditional networks (TransformerConfig.num_classes): the label enters the trunk
by adaLN like t, a null label (id num_classes) serves classifier-free guidance, and
calls without labels keep working."""
import json

import numpy as np
import pytest
import torch

from ddpd.checkpoint import load_model, save_checkpoint
from ddpd.models import MODEL_KINDS, TransformerConfig, build_model, config_for, count_parameters
from ddpd.pretrained import BUNDLE_DIR

V, D, B, C = 7, 12, 4, 5
SMALL = dict(d_model=32, n_layers=2, n_heads=4)


def make(kind, num_classes=C, seed=0, randomize=True, **fields):
    torch.manual_seed(seed)
    model = build_model(kind, config_for(kind, V, D, num_classes=num_classes, **{**SMALL, **fields})).eval()
    if randomize:  # adaLN-Zero starts as the identity: give it weights so t and labels matter
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "modulation" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


def tokens(model, seed=1):
    return torch.randint(0, model.config.vocab_size, (B, D), generator=torch.Generator().manual_seed(seed))


def call(model, x, t=None, **labels):
    if model.kind in ("planner", "ar"):
        return model(x, **labels)
    return model(x, torch.full((x.shape[0],), 0.4) if t is None else t, **labels)


# ---- config -------------------------------------------------------------------------------

def test_config_field_has_a_default_for_old_checkpoints():
    old = {"vocab_size": V + 1, "out_dim": V, "d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": D,
           "time_conditioned": True, "causal": False, "dropout": 0.0, "norm": "layernorm", "mlp_ratio": 4}
    config = TransformerConfig.from_dict(old)
    assert config.num_classes == 0 and config.conditioned
    labelled = config_for("planner", V, D, num_classes=C)
    assert TransformerConfig.from_dict(labelled.to_dict()) == labelled
    assert labelled.conditioned and not labelled.time_conditioned


def test_bundled_checkpoint_config_loads_without_the_field():
    with open(BUNDLE_DIR / "denoiser" / "config.json", encoding="utf-8") as f:
        stored = json.load(f)["model"]
    assert "num_classes" not in stored
    assert TransformerConfig.from_dict(stored).num_classes == 0


@pytest.mark.parametrize("value, error", [(-1, ValueError), (2.0, TypeError), (True, TypeError)])
def test_config_rejects_bad_num_classes(value, error):
    with pytest.raises(error, match="num_classes"):
        TransformerConfig(vocab_size=V, out_dim=V, num_classes=value)


def test_label_embedding_has_a_null_row_and_counts():
    model = make("mask-denoiser")
    assert model.null_label == C and model.backbone.label_embed.num_embeddings == C + 1
    plain = make("mask-denoiser", num_classes=0)
    assert plain.null_label is None and plain.backbone.label_embed is None
    assert count_parameters(model) - count_parameters(plain) == (C + 1) * SMALL["d_model"]
    # a class-conditional planner gains adaLN (per block 6 d^2 + 6 d, final 2 d^2 + 2 d) but no time input
    planner, free = make("planner"), make("planner", num_classes=0)
    d, layers = SMALL["d_model"], SMALL["n_layers"]
    extra = (C + 1) * d + layers * (6 * d * d + 6 * d) + 2 * d * d + 2 * d
    assert count_parameters(planner) - count_parameters(free) == extra
    assert planner.backbone.time_embed is None


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_single_class_keeps_its_null_label(kind):
    # one class is still class-conditional: id 1 is the null label that guidance drops to
    model = make(kind, num_classes=1)
    assert model.null_label == 1 and model.backbone.label_embed.num_embeddings == 2


# ---- calling convention ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_labels_condition_every_kind(kind):
    model = make(kind)
    x = tokens(model)
    first, second = torch.zeros(B, dtype=torch.long), torch.full((B,), 3)
    with torch.no_grad():
        a, b = call(model, x, labels=first), call(model, x, labels=second)
        null, default = call(model, x, labels=torch.full((B,), C)), call(model, x)
        as_int = call(model, x, labels=3)
    assert (a - b).abs().amax() > 1e-3
    torch.testing.assert_close(default, null, rtol=0, atol=0)  # no labels = the null label
    torch.testing.assert_close(as_int, b, rtol=0, atol=0)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_numpy_integer_label_is_an_int_label(kind):
    """labels=np.int64(3) (a class id picked with numpy) was refused as "expected ... an int or None"."""
    model = make(kind)
    x = tokens(model)
    with torch.no_grad():
        expected = call(model, x, labels=3)
        for label in (np.int64(3), np.int32(3), np.uint8(3)):
            torch.testing.assert_close(call(model, x, labels=label), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match=rf"labels: expected class ids in \[0, {C}\]"):
        call(model, x, labels=np.int64(C + 1))
    with pytest.raises(TypeError, match="labels: expected a torch.int64 tensor"):
        call(model, x, labels=np.bool_(True))


def test_fresh_model_ignores_labels_until_trained():
    model = make("uniform-denoiser", randomize=False)
    x = tokens(model)
    with torch.no_grad():
        torch.testing.assert_close(call(model, x, labels=torch.zeros(B, dtype=torch.long)), call(model, x),
                                   rtol=0, atol=0)


def test_rows_are_conditioned_on_their_own_label():
    model = make("mask-denoiser")
    x, t = tokens(model), torch.rand(B)
    labels = torch.tensor([0, 4, C, 2])
    with torch.no_grad():
        batch = model(x, t, labels=labels)
        rows = torch.cat([model(x[i:i + 1], t[i:i + 1], labels=labels[i:i + 1]) for i in range(B)])
    torch.testing.assert_close(batch, rows, rtol=1e-5, atol=1e-6)


def test_guidance_pair_in_one_forward_pass():
    # classifier-free guidance evaluates conditional and null logits; one batched call does both
    model = make("mask-denoiser")
    x, t, labels = tokens(model), torch.rand(B), torch.tensor([1, 1, 0, 4])
    null = torch.full_like(labels, model.null_label)
    with torch.no_grad():
        both = model(torch.cat([x, x]), torch.cat([t, t]), labels=torch.cat([labels, null]))
        cond, uncond = model(x, t, labels=labels), model(x, t)
    torch.testing.assert_close(both[:B], cond, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(both[B:], uncond, rtol=1e-5, atol=1e-6)


def test_hidden_takes_labels_too():
    model = make("mask-denoiser")
    x, t, labels = tokens(model), torch.rand(B), torch.tensor([0, 1, 2, 3])
    with torch.no_grad():
        torch.testing.assert_close(model.head(model.hidden(x, t, labels=labels)), model(x, t, labels=labels))
    planner, clean = make("planner"), x % V
    with torch.no_grad():
        torch.testing.assert_close(planner.head(planner.hidden(clean, labels=labels)).squeeze(-1),
                                   planner(clean, labels=labels))


def test_models_without_classes_keep_their_calls():
    model = make("mask-denoiser", num_classes=0)
    x, t = tokens(model), torch.rand(B)
    with torch.no_grad():
        torch.testing.assert_close(model(x, t), model(x, t, labels=None), rtol=0, atol=0)
    with pytest.raises(ValueError, match="labels: this model is not class-conditional"):
        model(x, t, labels=torch.zeros(B, dtype=torch.long))


@pytest.mark.parametrize("labels, error, match", [
    (torch.zeros(B), TypeError, "int64"),
    (torch.zeros(B + 1, dtype=torch.long), ValueError, "shape"),
    (torch.full((B,), C + 1), ValueError, r"\[0, 5\]"),
    (torch.full((B,), -1), ValueError, r"\[0, 5\]"),
    (C + 1, ValueError, r"\[0, 5\]"),
    ([0, 1, 2, 3], TypeError, "labels"),
    (True, TypeError, r"^labels: .* got bool$"),  # not read as class 1
])
def test_bad_labels(labels, error, match):
    model = make("uniform")
    with pytest.raises(error, match=match):
        model(tokens(model), torch.rand(B), labels=labels)


def test_gradients_reach_the_label_embedding():
    model = make("planner").train()
    model(tokens(model), labels=torch.tensor([0, 1, 2, C])).square().mean().backward()
    grad = model.backbone.label_embed.weight.grad
    assert grad is not None and (grad[[0, 1, 2, C]].abs().sum(-1) > 0).all()
    assert (grad[[3, 4]] == 0).all()  # labels not in the batch get no gradient


def test_checkpoint_round_trip_keeps_labels(tmp_path):
    model = make("mask-denoiser")
    config = {"kind": "mask-denoiser", "model": model.config.to_dict(), "tokenizer": {"name": "text8"},
              "schedule": "linear"}
    save_checkpoint(tmp_path / "c", model, config)
    loaded, _ = load_model(tmp_path / "c")
    x, t, labels = tokens(model), torch.rand(B), torch.tensor([0, 1, 2, C])
    assert loaded.config.num_classes == C
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, t, labels=labels), model(x, t, labels=labels), rtol=0, atol=0)


def test_the_judge_scores_under_the_label_it_is_given():
    """ARModel.log_likelihood(x, labels=y) is log p(x | y): it ignored y, scoring every class
    with the null label's model. An int C is the null label, as None is."""
    model = make("ar")
    x = tokens(model) % V
    with torch.no_grad():
        for labels in (torch.tensor([0, 1, 2, 3]), None):
            log_probs = model(model.with_bos(x)[:, :-1], labels=labels).log_softmax(-1)
            expected = log_probs.gather(-1, x[..., None]).squeeze(-1).sum(-1)
            torch.testing.assert_close(model.log_likelihood(x, labels=labels), expected)
        assert (model.log_likelihood(x, labels=0) - model.log_likelihood(x, labels=1)).abs().amax() > 1e-4
        torch.testing.assert_close(model.log_likelihood(x, labels=C), model.log_likelihood(x), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["planner", "ar"])
def test_untimed_kinds_take_labels_by_keyword_only(kind):
    # a second positional argument (a time, as a denoiser takes) is refused, not read as class 1
    model = make(kind)
    x = tokens(model) % V
    with pytest.raises(TypeError, match="positional"):
        model(x, 1)
    with pytest.raises(TypeError, match="positional"):
        model.hidden(x, 0.5, 1)  # t is taken there, for a uniform signature, and ignored
    if kind == "ar":
        with pytest.raises(TypeError, match="positional"):
            model.log_likelihood(x, 1)


@pytest.mark.parametrize("kind", ["mask-denoiser", "uniform-denoiser", "uniform"])
def test_denoising_kinds_take_labels_by_keyword_only(kind):
    # a third positional argument after the time is refused, not read as a class
    model = make(kind)
    x, t = tokens(model), torch.rand(B)
    for method in (model, model.hidden):
        with pytest.raises(TypeError, match="positional"):
            method(x, t, 1)
