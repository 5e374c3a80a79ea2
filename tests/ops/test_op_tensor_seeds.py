"""Seeds and offsets given as int64 tensors of one element (read by the kernels, never on
the host): every sampling op draws for a tensor what it draws for the int of the same
value, on the C++ path, in the Triton kernels (interpreter) and in the references, and a
tensor advanced in place gives the draws of its new value (what a replayed CUDA graph
needs). planner_select_mask's mask offset is explicit, offset + 1 by default."""
import numpy as np
import pytest
import torch

from ddpd.ops import rng
from ddpd.ops.multinomial import multinomial, multinomial_reference
from ddpd.ops.planner_mask import planner_mask, planner_mask_reference, planner_mask_triton
from ddpd.ops.planner_select import (
    planner_select,
    planner_select_mask,
    planner_select_mask_reference,
    planner_select_reference,
    planner_select_triton,
    resolve_pair,
)
from ddpd.ops.rng import philox_uniform
from ddpd.ops.sample_categorical import (
    prepare_categorical,
    sample_categorical,
    sample_categorical_reference,
    sample_categorical_triton,
)
from ddpd.ops.sample_from_hidden import sample_from_hidden, sample_from_hidden_reference, sample_from_hidden_triton

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
SEEDS = [(5, 9), (2**64 - 3, 2**63 + 17), (0, 2**32 - 1)]
MASK_ID = 50


def as_tensor(value: int) -> torch.Tensor:
    """The int64 tensor holding the bits of the uint64 value."""
    return torch.tensor(value - 2**64 if value >= 2**63 else value)


def same(a, b):
    """Equal outputs (sum_p, a float sum, to its documented tolerance across paths)."""
    for x, y in zip(a, b):
        if x is None or y is None:  # an output not asked for
            assert x is None and y is None
        elif x.dtype == torch.float32:
            torch.testing.assert_close(x, y, rtol=1e-6, atol=0)
        else:
            assert torch.equal(x, y), (x, y)


def inputs():
    g = torch.Generator().manual_seed(0)
    return dict(planner=3 * torch.randn(4, 40, generator=g), x=torch.randint(0, MASK_ID, (4, 40), generator=g),
                logits=2 * torch.randn(4, 700, generator=g), hidden=torch.randn(4, 8, generator=g),
                weight=torch.randn(700, 8, generator=g), weights=torch.rand(4, 300, generator=g),
                rows=torch.tensor([3, 0, 2**33 + 1, 7]))


def ops(d):
    """Each op as a function of (seed, offset), with row ids that reach the derived row key."""
    rows = d["rows"]
    return {
        "planner_select": lambda s, o: planner_select(d["planner"], 3, seed=s, offset=o, row_ids=rows),
        "planner_select_reference": lambda s, o: planner_select_reference(d["planner"], 3, seed=s, offset=o,
                                                                          row_ids=rows),
        "planner_mask": lambda s, o: planner_mask(d["planner"], d["x"], None, MASK_ID, seed=s, offset=o,
                                                  row_ids=rows),
        "planner_select_mask": lambda s, o: planner_select_mask(d["planner"], d["x"], MASK_ID, 2, "softmax", seed=s,
                                                                offset=o, row_ids=rows),
        "planner_select_mask_reference": lambda s, o: planner_select_mask_reference(
            d["planner"], d["x"], MASK_ID, 2, "softmax", seed=s, offset=o, row_ids=rows),
        "sample_categorical": lambda s, o: sample_categorical(d["logits"], 0.8, seed=s, offset=o, row_ids=rows),
        "sample_categorical_reference": lambda s, o: sample_categorical_reference(d["logits"], 0.8, seed=s, offset=o,
                                                                                  row_ids=rows),
        "sample_from_hidden": lambda s, o: sample_from_hidden(d["hidden"], d["weight"], seed=s, offset=o,
                                                              row_ids=rows),
        "sample_from_hidden_reference": lambda s, o: sample_from_hidden_reference(d["hidden"], d["weight"], seed=s,
                                                                                  offset=o, row_ids=rows),
        "multinomial": lambda s, o: multinomial(d["weights"], 5, seed=s, offset=o, row_ids=rows).tokens,
        "multinomial_reference": lambda s, o: multinomial_reference(d["weights"], 5, seed=s, offset=o,
                                                                    row_ids=rows).tokens,
    }


@pytest.mark.parametrize("seed,offset", SEEDS)
@pytest.mark.parametrize("name", list(ops(inputs())))
def test_tensor_counters_draw_what_ints_draw(name, seed, offset):
    op = ops(inputs())[name]
    expected = op(seed, offset)
    same(op(as_tensor(seed), as_tensor(offset)), expected)
    same(op(seed, as_tensor(offset)), expected)
    same(op(as_tensor(seed), offset), expected)


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
@pytest.mark.parametrize("name", ["multinomial", "multinomial_reference", "sample_categorical", "philox_uniform"])
def test_counters_of_one_element_in_any_shape_draw_what_ints_draw(name, shape):
    """A seed or offset tensor holds one element whatever its shape: [5] and [[5]] are the
    seed 5, as the 0-d tensor is."""
    op = ops(inputs()).get(name, lambda s, o: philox_uniform(s, o, torch.tensor([0, 2**33 + 1]), 5))
    seed, offset = SEEDS[1]
    same(op(as_tensor(seed).reshape(shape), as_tensor(offset).reshape(shape)), op(seed, offset))


@pytest.mark.parametrize("name", list(ops(inputs())) + ["philox_uniform"])
def test_numpy_integer_counters_draw_what_ints_draw(name):
    op = ops(inputs()).get(name, lambda s, o: philox_uniform(s, o, torch.tensor([0, 2**33 + 1]), 5))
    for seed, offset in SEEDS:
        expected = op(seed, offset)
        same(op(np.uint64(seed), np.uint64(offset)), expected)
        if seed < 2**63:
            same(op(np.int64(seed), offset), expected)


@pytest.mark.parametrize("name", ["sample_categorical", "sample_categorical_reference", "philox_uniform"])
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(seed=1.0), TypeError, "seed must be an int, got float 1.0"),
    (dict(seed=np.float64(1.0)), TypeError, "seed must be an int, got float64"),
    (dict(seed=True), TypeError, "seed must be an int, got bool True"),
    (dict(seed="1"), TypeError, "seed must be an int, got str '1'"),
    (dict(seed=1, offset=2.5), TypeError, "offset must be an int, got float 2.5"),
    (dict(seed=np.int64(-1)), ValueError, r"seed must be an int in \[0, 2\*\*64\)"),
    (dict(seed=2**64), ValueError, r"seed must be an int in \[0, 2\*\*64\)"),
])
def test_counters_that_are_not_ints_in_range_are_refused(name, kwargs, error, match):
    kwargs = {"offset": 0, **kwargs}
    op = ops(inputs()).get(name, lambda s, o: philox_uniform(s, o, torch.tensor([0, 1]), 5))
    with pytest.raises(error, match=match):
        op(kwargs["seed"], kwargs["offset"])


@pytest.mark.parametrize("name", ["planner_select", "planner_select_mask", "sample_categorical", "sample_from_hidden",
                                  "multinomial"])
def test_a_tensor_advanced_in_place_draws_its_new_value(name):
    op = ops(inputs())[name]
    seed, offset = torch.tensor(11), torch.tensor(100)
    first = op(seed, offset)
    offset += 1  # in place, as a sampler advances the counter of a captured graph
    second = op(seed, offset)
    same(second, op(11, 101))
    assert any(not torch.equal(a, b) for a, b in zip(first, second) if a is not None)


@pytest.mark.parametrize("seed,offset", SEEDS)
def test_triton_kernels_read_tensor_counters(seed, offset):
    d = inputs()
    rows = d["rows"][:3]
    for s, o in ((as_tensor(seed), as_tensor(offset)), (seed, as_tensor(offset))):
        counters = rng.resolve_stream(None, (3, 40), d["planner"], s, o, None, rows, "logits")
        same(planner_select_triton(d["planner"][:3], 2, True, 0.7, 0.01, None, counters, rows),
             planner_select_reference(d["planner"][:3], 2, "softmax", 0.7, seed=seed, offset=offset, row_ids=rows))
        same(planner_mask_triton(d["planner"][:3], d["x"][:3], None, MASK_ID, None, counters, rows),
             planner_mask_reference(d["planner"][:3], d["x"][:3], None, MASK_ID, seed=seed, offset=offset,
                                    row_ids=rows))
        pair = resolve_pair(None, None, d["planner"][:3], s, o, None, None, rows)
        same(planner_select_triton(d["planner"][:3], 2, False, 1.0, 0.01, None, pair[0], rows,
                                   mask=(d["x"][:3], MASK_ID, None, pair[1])),
             planner_select_mask_reference(d["planner"][:3], d["x"][:3], MASK_ID, 2, seed=seed, offset=offset,
                                           row_ids=rows))
        call = prepare_categorical(d["logits"][:3], 0.8, None, None, None, None, None, None, False, None, s, o, None,
                                   rows, None)
        same(call.finish(*sample_categorical_triton(d["logits"][:3], *call.args())),
             sample_categorical_reference(d["logits"][:3], 0.8, seed=seed, offset=offset, row_ids=rows))
        seed_, offset_, seed_t, offset_t = call.counters
        same(sample_from_hidden_triton(d["hidden"][:3], d["weight"], None, 1.0, None, None, None, None, None, seed_,
                                       offset_, rows, seed_t, offset_t, False, 0)[:2],
             sample_from_hidden_reference(d["hidden"][:3], d["weight"], seed=seed, offset=offset, row_ids=rows))


def test_philox_uniform_takes_tensor_counters():
    rows = torch.tensor([0, 2**40, -1])
    for seed, offset in SEEDS:
        assert torch.equal(philox_uniform(as_tensor(seed), as_tensor(offset), rows, 9),
                           philox_uniform(seed, offset, rows, 9))


def test_mask_offset_is_explicit_and_defaults_to_offset_plus_one():
    d = inputs()
    planner, x, rows = d["planner"], d["x"], d["rows"]
    positions = planner_select(planner, 2, seed=4, offset=20, row_ids=rows)[0]
    for mask_offset in (21, 1000, 2**64 - 1):
        expected = planner_mask(planner, x, positions, MASK_ID, seed=4, offset=mask_offset, row_ids=rows)
        for out in (planner_select_mask(planner, x, MASK_ID, 2, seed=4, offset=20, mask_offset=mask_offset,
                                        row_ids=rows),
                    planner_select_mask(planner, x, MASK_ID, 2, seed=4, offset=as_tensor(20),
                                        mask_offset=as_tensor(mask_offset), row_ids=rows),
                    planner_select_mask_reference(planner, x, MASK_ID, 2, seed=4, offset=20, mask_offset=mask_offset,
                                                  row_ids=rows)):
            assert torch.equal(out[0], positions)
            same(out[3:], expected)
    # the default: offset + 1, wrapping at 2**64, for ints and for tensors
    for offset in (20, 2**64 - 1):
        expected = planner_select_mask(planner, x, MASK_ID, 2, seed=4, offset=offset,
                                       mask_offset=(offset + 1) % 2**64, row_ids=rows)
        same(planner_select_mask(planner, x, MASK_ID, 2, seed=4, offset=offset, row_ids=rows), expected)
        same(planner_select_mask(planner, x, MASK_ID, 2, seed=4, offset=as_tensor(offset), row_ids=rows), expected)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(seed=torch.tensor(1.0)), TypeError, "seed must be an int or an int64 tensor of one element"),
    (dict(seed=1, offset=torch.tensor([1, 2])), TypeError, "offset must be an int or an int64 tensor of one element"),
    (dict(seed=1, offset=torch.tensor(1, device="meta")), ValueError,
     r"^offset must be on the device of logits \(cpu\), got meta$"),
    (dict(seed=-1), ValueError, r"seed must be an int in \[0, 2\*\*64\)"),
    (dict(noise=torch.rand(2, 3), offset=torch.tensor(0)), ValueError, "pass either noise or seed"),
])
def test_bad_counters_raise_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        planner_select(torch.randn(2, 3), **kwargs)


def test_mask_offset_with_explicit_noise_is_refused():
    logits, x = torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="either mask_noise or mask_offset"):
        planner_select_mask(logits, x, 5, noise=torch.rand(2, 3), mask_noise=torch.rand(2, 3), mask_offset=3)


def test_compiled_calls_read_the_current_tensor_values():
    """Under torch.compile a tensor offset is a graph input: advancing it gives the new draws
    without a recompilation."""
    d = inputs()
    logits = d["logits"]

    def step(logits, seed, offset):
        tokens, _, _, _ = sample_categorical(logits, 0.9, seed=seed, offset=offset)
        positions = planner_select(d["planner"], 2, seed=seed, offset=offset + 1)[0]
        return tokens, positions

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    seed, offset = torch.tensor(3), torch.tensor(40)
    for _ in range(3):
        same(compiled(logits, seed, offset), step(logits, seed, offset))
        same(compiled(logits, seed, offset)[:1], sample_categorical(logits, 0.9, seed=3, offset=int(offset))[:1])
        offset += 2
