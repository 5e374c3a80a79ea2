"""The sampling ops read strided (non-contiguous) inputs by their strides: explicit
noise, row ids, per-row exclusions, sequences and positions given as views draw what
the same values given contiguous draw, on the C++ path (the Triton launchers' own
strided inputs are tested beside each op, in the interpreter; here planner_select's x)."""
import pytest
import torch

from ddpd.ops.planner_mask import planner_mask, planner_mask_reference
from ddpd.ops.planner_select import (
    planner_select,
    planner_select_mask,
    planner_select_mask_reference,
    planner_select_reference,
    planner_select_triton,
)
from ddpd.ops.sample_categorical import noise_width, sample_categorical, sample_categorical_reference
from ddpd.ops.sample_from_hidden import sample_from_hidden, sample_from_hidden_reference

ROWS, LENGTH, VOCAB, MASK_ID = 5, 9, 300, 300


def strided(t: torch.Tensor) -> torch.Tensor:
    """The values of t in a view that is not contiguous (every other element of a wider tensor)."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype) if t.dim() > 1 \
        else torch.zeros(2 * t.shape[0], dtype=t.dtype)
    view = wide[..., ::2]
    view.copy_(t)
    assert not view.is_contiguous() and torch.equal(view, t)
    return view


def transposed(t: torch.Tensor) -> torch.Tensor:
    """The values of the 2-D t in a transposed (column-major) layout."""
    view = t.t().contiguous().t()
    assert not view.is_contiguous() and torch.equal(view, t)
    return view


def assert_same(out, ref):
    for a, b in zip(out, ref):
        if a is None or b is None:  # an output not asked for
            assert a is None and b is None
        elif a.dtype == torch.float32:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(a, b)


@pytest.fixture
def planner_inputs():
    g = torch.Generator().manual_seed(3)
    logits = 2 * torch.randn(ROWS, LENGTH, generator=g)
    noise = torch.rand(ROWS, LENGTH, generator=g)
    mask_noise = torch.rand(ROWS, LENGTH, generator=g)
    x = torch.randint(0, MASK_ID, (ROWS, LENGTH), generator=g)
    positions = torch.stack([torch.randperm(LENGTH, generator=g)[:2] for _ in range(ROWS)])
    return logits, noise, mask_noise, x, positions


@pytest.mark.parametrize("layout", [strided, transposed])
def test_planner_select_strided_noise(planner_inputs, layout):
    logits, noise, _, _, _ = planner_inputs
    expected = planner_select_reference(logits, 3, noise=noise)
    assert_same(planner_select(logits, 3, noise=layout(noise)), expected)
    assert_same(planner_select_reference(logits, 3, noise=layout(noise)), expected)


def test_planner_ops_strided_row_ids(planner_inputs):
    logits, _, _, x, positions = planner_inputs
    ids = torch.tensor([7, 3, 11, 0, 5])
    assert_same(planner_select(logits, 2, seed=9, row_ids=strided(ids)), planner_select(logits, 2, seed=9, row_ids=ids))
    assert_same(planner_mask(logits, x, positions, MASK_ID, seed=9, row_ids=strided(ids)),
                planner_mask_reference(logits, x, positions, MASK_ID, seed=9, row_ids=ids))
    assert_same(planner_select_mask(logits, x, MASK_ID, 2, seed=9, row_ids=strided(ids)),
                planner_select_mask_reference(logits, x, MASK_ID, 2, seed=9, row_ids=ids))


def test_planner_mask_strided_inputs(planner_inputs):
    logits, noise, mask_noise, x, positions = planner_inputs
    expected = planner_mask_reference(logits, x, positions, MASK_ID, noise=noise)
    assert_same(planner_mask(logits, transposed(x), transposed(positions), MASK_ID, noise=transposed(noise)),
                expected)
    expected = planner_select_mask_reference(logits, x, MASK_ID, 2, noise=noise, mask_noise=mask_noise)
    assert_same(planner_select_mask(logits, transposed(x), MASK_ID, 2, noise=strided(noise),
                                    mask_noise=transposed(mask_noise)), expected)


def test_planner_select_triton_transposed_x(planner_inputs):
    """The launcher writes the masked sequence row-major, whatever the layout of x."""
    logits, noise, mask_noise, x, _ = planner_inputs
    expected = planner_select_mask_reference(logits, x, MASK_ID, 2, noise=noise, mask_noise=mask_noise)
    out = planner_select_triton(logits, 2, False, 1.0, 0.01, noise, (0, 0, None, None), None,
                                mask=(transposed(x), MASK_ID, mask_noise, (0, None)))
    assert_same(out, expected)


@pytest.fixture
def categorical_inputs():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(ROWS, VOCAB, generator=g)
    noise = torch.rand(ROWS, noise_width(VOCAB), generator=g)
    exclude = torch.randint(0, VOCAB, (ROWS,), generator=g)
    return logits, noise, exclude


@pytest.mark.parametrize("layout", [strided, transposed])
def test_sample_categorical_strided_noise(categorical_inputs, layout):
    logits, noise, exclude = categorical_inputs
    expected = sample_categorical_reference(logits, 0.7, exclude_per_row=exclude, noise=noise)
    assert_same(sample_categorical(logits, 0.7, exclude_per_row=exclude, noise=layout(noise)), expected)
    assert_same(sample_categorical_reference(logits, 0.7, exclude_per_row=exclude, noise=layout(noise)), expected)


def test_sample_categorical_strided_row_ids_and_exclusions(categorical_inputs):
    logits, _, exclude = categorical_inputs
    ids = torch.tensor([4, 1, 9, 2, 6])
    expected = sample_categorical_reference(logits, exclude_per_row=exclude, seed=5, row_ids=ids)
    assert_same(sample_categorical(logits, exclude_per_row=strided(exclude), seed=5, row_ids=strided(ids)), expected)


def test_sample_from_hidden_strided_inputs(categorical_inputs):
    _, noise, exclude = categorical_inputs
    g = torch.Generator().manual_seed(5)
    hidden, weight = torch.randn(ROWS, 16, generator=g), torch.randn(VOCAB, 16, generator=g)
    ids = torch.tensor([4, 1, 9, 2, 6])
    expected = sample_from_hidden_reference(hidden, weight, exclude_per_row=exclude, noise=noise)
    assert_same(sample_from_hidden(hidden, weight, exclude_per_row=strided(exclude), noise=transposed(noise)),
                expected)
    expected = sample_from_hidden_reference(hidden, weight, seed=2, row_ids=ids)
    assert_same(sample_from_hidden(hidden, weight, seed=2, row_ids=strided(ids)), expected)


@pytest.mark.parametrize("layout", [strided, transposed])
def test_sample_categorical_strided_logits_masks_and_controls(categorical_inputs, layout):
    """Logits, the allowed mask and per-row controls given as views draw what their contiguous values draw."""
    logits, noise, _ = categorical_inputs
    allowed = torch.rand(ROWS, VOCAB, generator=torch.Generator().manual_seed(6)) < 0.8
    temperature, top_k = torch.tensor([0.5, 1.0, 0.0, 2.0, 0.7]), torch.tensor([0, 5, 3, 40, 1])
    kwargs = dict(return_logprob=True, confidence="margin", noise=noise)
    expected = sample_categorical_reference(logits, temperature, allowed=allowed, top_k=top_k, **kwargs)
    for op in (sample_categorical, sample_categorical_reference):
        assert_same(op(layout(logits), strided(temperature), allowed=layout(allowed), top_k=strided(top_k),
                       **kwargs), expected)
