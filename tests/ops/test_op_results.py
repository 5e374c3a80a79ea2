"""The ops' API: fixed-arity results whatever the flags, the draw controls as one object
(the same draws as the flat keywords), the references by law in ddpd.ops.reference, and the
former `<op>_reference` names kept one release with a DeprecationWarning."""
import dataclasses
import inspect

import pytest
import torch

from ddpd import ops
from ddpd.ops import DrawControls, reference

FLAGS = [dict(), dict(return_logprob=True), dict(confidence="margin"), dict(return_logprob=True, confidence="prob")]


@pytest.mark.parametrize("flags", FLAGS)
def test_draws_return_four_fields_whatever_the_flags(flags):
    logits = torch.randn(2, 3, 300, generator=torch.Generator().manual_seed(0))
    hidden, weight = torch.randn(2, 3, 8), torch.randn(300, 8)
    for out in (ops.sample_categorical(logits, seed=1, **flags), reference.sample_categorical(logits, seed=1, **flags),
                ops.sample_from_hidden(hidden, weight, seed=1, **flags),
                reference.sample_from_hidden(hidden, weight, seed=1, **flags)):
        assert isinstance(out, ops.Draw) and len(out) == 4
        assert out.tokens.shape == out.valid.shape == (2, 3)
        assert (out.logprob is not None) == flags.get("return_logprob", False)
        assert (out.confidence is not None) == ("confidence" in flags)


def test_controls_draw_what_the_flat_keywords_draw():
    g = torch.Generator().manual_seed(1)
    logits, hidden, weight = torch.randn(6, 400, generator=g), torch.randn(6, 8, generator=g), torch.randn(400, 8)
    allowed = torch.rand(6, 400, generator=g) < 0.9
    flat = dict(temperature=0.7, top_k=50, top_p=0.9, min_p=0.01, exclude_ids=[3, 7],
                exclude_per_row=torch.arange(6), allowed=allowed)
    controls = DrawControls(**flat)
    for op in (ops.sample_categorical, reference.sample_categorical):
        want = op(logits, seed=4, return_logprob=True, **flat)
        got = op(logits, controls=controls, seed=4, return_logprob=True)
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.logprob, want.logprob)
    for op in (ops.sample_from_hidden, reference.sample_from_hidden):
        want = op(hidden, weight, None, seed=4, **flat)
        assert torch.equal(op(hidden, weight, None, controls=controls, seed=4).tokens, want.tokens)


def test_controls_beside_flat_keywords_or_of_another_type_are_refused():
    logits = torch.randn(2, 10)
    with pytest.raises(TypeError, match="not both; got controls and top_k"):
        ops.sample_categorical(logits, controls=DrawControls(temperature=0.5), top_k=3, seed=0)
    with pytest.raises(TypeError, match="not both; got controls and temperature"):
        reference.sample_categorical(logits, 0.5, controls=DrawControls(), seed=0)
    with pytest.raises(TypeError, match="not both; got controls and temperature"):  # 1.0, but not the float default
        ops.sample_categorical(logits, torch.tensor(1.0), controls=DrawControls(temperature=0.5), seed=0)
    with pytest.raises(TypeError, match="not both; got controls and temperature"):  # the int 1 is given too
        ops.sample_categorical(logits, 1, controls=DrawControls(temperature=0.5), seed=0)
    with pytest.raises(TypeError, match="not both; got controls and allowed, top_k$"):  # sorted by name
        ops.sample_categorical(logits, controls=DrawControls(), top_k=3, allowed=torch.ones(2, 10, dtype=torch.bool),
                               seed=0)
    with pytest.raises(TypeError, match="controls must be a DrawControls or None, got dict"):
        ops.sample_from_hidden(torch.randn(2, 4), torch.randn(10, 4), controls={"top_k": 3}, seed=0)


def test_planner_and_compaction_results_have_names():
    logits, x = torch.randn(3, 12), torch.zeros(3, 12, dtype=torch.long)
    selection = ops.planner_select(logits, 2, seed=1)
    plan = ops.planner_select_mask(logits, x, 9, 2, seed=1)
    mask = ops.planner_mask(logits, x, selection.positions, 9, seed=1)
    assert isinstance(selection, ops.Selection) and isinstance(plan, ops.Plan) and isinstance(mask, ops.Mask)
    assert torch.equal(plan.positions, selection.positions) and torch.equal(plan.count, plan.z.sum(1))
    compacted = ops.compact_fixed(torch.tensor([True, False, True]), 2, x)
    assert isinstance(compacted, ops.Compacted) and int(compacted.count) == 2
    assert compacted.index.tolist() == [0, 2]


def test_multinomial_returns_its_flags_and_checks_them_on_request():
    weights = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    out = ops.multinomial(weights, 1, seed=0, check_valid=False)
    assert isinstance(out, ops.Draw) and out.valid.tolist() == [False, True] and out.logprob is None
    with pytest.raises(ValueError, match=r"rows \[0\]"):
        ops.multinomial(weights, 1, seed=0)


def test_references_live_by_law_and_the_former_names_warn():
    assert not [name for name in ops.__all__ if name.endswith("_reference")]
    for law in reference.__all__:
        if law == "philox_uniform":
            continue
        with pytest.warns(DeprecationWarning, match=f"ddpd.ops.reference.{law}"):
            assert getattr(ops, f"{law}_reference") is getattr(reference, law)
    with pytest.raises(AttributeError, match="no attribute 'bogus_reference'"):
        ops.bogus_reference  # noqa: B018


def test_plan_z_leaves_a_pick_of_weight_zero_unset_as_its_docstring_says():
    """A row with fewer than k positions of weight picks one of weight 0 (logit -inf or NaN):
    it is not denoised, so z stays unset there; Plan.z said z was set at every chosen position."""
    logits = torch.tensor([[0.0, -float("inf"), -float("inf")], [5.0, float("nan"), -float("inf")]])
    x = torch.zeros(2, 3, dtype=torch.int64)
    for op in (ops.planner_select_mask, reference.planner_select_mask):
        plan = op(logits, x, 9, 2, seed=0)
        picked = plan.z.gather(1, plan.positions)
        assert picked[:, 0].all() and not picked[:, 1].any()
    assert "weight 0" in " ".join(ops.Plan.__doc__.split())


def test_a_draw_built_from_tokens_and_valid_leaves_the_other_fields_none():
    """The fields not asked for default to None, so Draw(tokens, valid) is a whole result."""
    draw = ops.Draw(torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.bool))
    assert len(draw) == 4 and draw.logprob is None and draw.confidence is None
    assert ops.Draw._fields == ("tokens", "valid", "logprob", "confidence")


def test_every_result_lists_its_fields_in_the_documented_order():
    """Results unpack by position as well as by name: the order is part of the API."""
    assert ops.Selection._fields == ("positions", "sum_p", "stop")
    assert ops.Mask._fields == ("masked", "z", "count")
    assert ops.Plan._fields == ops.Selection._fields + ops.Mask._fields
    assert ops.Compacted._fields == ("tensors", "index", "count")


def test_the_references_module_exports_every_law_it_defines():
    """`from ddpd.ops.reference import *` gives every law, norm and rotary among them, each
    name bound to the reference of the op of that name."""
    from ddpd.ops.norm import norm_reference
    from ddpd.ops.rotary import rotary_reference

    public = sorted(name for name in vars(reference) if not name.startswith("_"))
    assert sorted(reference.__all__) == public
    assert reference.norm is norm_reference and reference.rotary is rotary_reference
    assert [law for law in reference.__all__ if getattr(reference, law).__name__ != f"{law}_reference"] == []


def test_default_controls_draw_what_no_controls_draw_and_cannot_be_changed():
    """DrawControls() is temperature 1, nothing cut, nothing excluded; one object shared by
    many calls is frozen, so no call sees another's change."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    for op in (ops.sample_categorical, reference.sample_categorical):
        assert torch.equal(op(logits, controls=DrawControls(), seed=3).tokens, op(logits, seed=3).tokens)
    assert [f.name for f in dataclasses.fields(DrawControls)] == [
        "temperature", "top_k", "top_p", "min_p", "exclude_ids", "exclude_per_row", "allowed"]
    assert dataclasses.astuple(DrawControls()) == (1.0, None, None, None, None, None, None)
    assert type(DrawControls().temperature) is float  # written 1.0, not 1, where a record shows it
    with pytest.raises(dataclasses.FrozenInstanceError):
        DrawControls().top_k = 3


def test_the_former_names_warn_at_the_line_that_reads_them():
    """The DeprecationWarning points at the caller's code, not at ddpd.ops itself."""
    with pytest.warns(DeprecationWarning) as caught:
        ops.sample_categorical_reference  # noqa: B018
    assert [w.filename for w in caught] == [__file__]


def test_the_package_exports_every_public_name_it_defines():
    """`from ddpd.ops import *` gives every op, result and control, and only names that exist."""
    public = sorted(name for name, value in vars(ops).items()
                    if not name.startswith("_") and not inspect.ismodule(value))
    assert sorted(ops.__all__) == public
    assert {"noise_width", "load_extension", "Watcher", "DrawControls"} <= set(ops.__all__)


def test_load_extension_returns_the_loaded_module():
    """load_extension() gives ddpd._C, the same module at every call."""
    ext = ops.load_extension()
    assert ext.__name__ == "ddpd._C" and ops.load_extension() is ext


def test_controls_compare_and_hash_by_identity():
    """Controls holding tensors compare as objects, not field by field (a tensor's == is no
    bool), so they can key a dict or a set."""
    a, b = (DrawControls(allowed=torch.ones(2, 3, dtype=torch.bool), top_k=torch.tensor([1, 2])) for _ in range(2))
    assert a == a and a != b and len({a, b, a}) == 2
