"""64-bit row ids in the counter-based streams (ddpd.ops.rng, csrc/rng.h,
ddpd.kernels.rng): rows r and r + 2**32 draw independently in every path, and
no row below 2**32 draws anything other than it always did (values pinned before
the high word entered the stream)."""
import numpy as np
import pytest
import torch

from ddpd.ops import rng
from ddpd.ops._dispatch import cpu_ops
from ddpd.ops.bernoulli import bernoulli, bernoulli_reference
from ddpd.ops.multinomial import draw_uniforms, multinomial, multinomial_reference
from ddpd.ops.planner_mask import planner_mask
from ddpd.ops.planner_select import planner_select, planner_select_reference
from ddpd.ops.rng import as_int64, philox_uniform, philox_uniform_reference, philox_words
from ddpd.ops.sample_categorical import noise_width, sample_categorical, sample_categorical_reference
from ddpd.ops.sample_from_hidden import sample_from_hidden, sample_from_hidden_reference
from oracles.devices import MISMATCHES, fake_tensors

LOW_ROWS = torch.tensor([0, 1, 7, 2**31 + 5, 2**32 - 1])


def top_bits(u: torch.Tensor) -> list:
    """The 24-bit integers behind float32 uniforms ((w >> 8) + 0.5) * 2**-24."""
    return (u.double() * 2**24 - 0.5).round().long().tolist()


def test_rows_below_two_to_the_32_keep_their_pinned_uniforms():
    u = philox_uniform(2**64 - 3, 2**40 + 9, LOW_ROWS, torch.tensor([0, 1, 255, 2**31]))
    assert top_bits(u) == [[8295071, 3435516, 8244011, 14325818], [13038420, 3825856, 14059882, 198231],
                           [14809300, 2653171, 13603144, 15913862], [15559918, 8859476, 12505692, 10154046],
                           [513062, 13719392, 8738382, 2262310]]
    assert top_bits(philox_uniform(0, 0, torch.tensor([0, 2**32 - 1]), 3)) == [[6694888, 16311500, 326307],
                                                                              [16135064, 1950120, 3741989]]
    d = draw_uniforms(12345, 6, LOW_ROWS, 2)
    assert (d * 2**48 - 0.5).round().long().tolist() == [
        [64715191359271, 15686838978852], [13122894301882, 171292599858808], [29146650697753, 275324219343527],
        [21814841602648, 14188968788462], [110992586303409, 246745908406445]]


def test_the_words_are_the_published_philox4x32_10_known_answers():
    """Random123's known answers for Philox4x32-10 (first output word), with the counter
    (column, row, offset low, offset high) under the key (seed low, seed high), in the
    reference and every path of the CPU kernels; the uniform is the word's top 24 bits."""
    cases = [(0, 0, 0, 0, 0x6627E8D5), (2**64 - 1, 2**64 - 1, 2**32 - 1, 2**32 - 1, 0x408F276D),
             (0x299F31D0_A4093822, 0x03707344_13198A2E, 0x85A308D3, 0x243F6A88, 0xD16CFE09)]
    for seed, offset, row, col, word in cases:
        rows = torch.tensor([row])
        assert philox_words(seed, offset, rows, torch.tensor([col])).item() == word
        assert top_bits(philox_uniform_reference(seed, offset, rows, torch.tensor([col]))) == [[word >> 8]]
        for isa in ("scalar", "best"):
            got = cpu_ops().philox_uniforms_cpu(as_int64(seed), as_int64(offset), rows, col, 1, isa, True)
            assert got.item() == word, (hex(seed), isa)


def test_high_word_of_the_row_id_enters_the_stream():
    rows = torch.tensor([0, 5, 2**32 - 1])
    for high in (1, 2**31, 2**32 - 1):
        shifted = rows + high * 2**32
        assert not torch.equal(philox_uniform(3, 4, rows, 64), philox_uniform(3, 4, shifted, 64))
    # Negative int64 ids stand for ids >= 2**63 (the same bits as uint64).
    assert not torch.equal(philox_uniform(3, 4, torch.tensor([-1]), 64), philox_uniform(3, 4, torch.tensor([2**32 - 1]),
                                                                                         64))
    # Independent, not merely different: over 1000 row pairs the uniforms are uncorrelated.
    low = torch.arange(1000)
    a, b = philox_uniform(9, 0, low, 8), philox_uniform(9, 0, low + 2**32, 8)
    assert abs(float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])) < 0.05
    assert (a == b).float().mean() < 0.01


def test_every_path_draws_differently_for_rows_two_to_the_32_apart():
    """Token draws of rows r and r + 2**32 (1000 pairs) rarely coincide; before, all did."""
    n, vocab = 1000, 300
    logits = torch.zeros(n, vocab)
    low, high = torch.arange(n), torch.arange(n) + 2**32
    same = (sample_categorical(logits, seed=1, row_ids=low)[0] == sample_categorical(logits, seed=1, row_ids=high)[0])
    assert same.float().mean() < 0.02  # 1/300 expected
    ref_low = sample_categorical_reference(logits, seed=1, row_ids=low)[0]
    assert torch.equal(ref_low, sample_categorical(logits, seed=1, row_ids=low)[0])
    assert torch.equal(sample_categorical_reference(logits, seed=1, row_ids=high)[0],
                       sample_categorical(logits, seed=1, row_ids=high)[0])
    planner = torch.zeros(n, 64)
    a, b = planner_select(planner, seed=2, row_ids=low)[0], planner_select(planner, seed=2, row_ids=high)[0]
    assert (a == b).float().mean() < 0.05
    assert torch.equal(b, planner_select_reference(planner, seed=2, row_ids=high)[0])
    weights = torch.ones(n, 64)
    a, b = multinomial(weights, 1, seed=3, row_ids=low).tokens, multinomial(weights, 1, seed=3, row_ids=high).tokens
    assert (a == b).float().mean() < 0.05
    assert torch.equal(b, multinomial_reference(weights, 1, seed=3, row_ids=high).tokens)
    hidden, weight = torch.zeros(n, 4), torch.zeros(vocab, 4)
    a = sample_from_hidden(hidden, weight, seed=4, row_ids=low)[0]
    b = sample_from_hidden(hidden, weight, seed=4, row_ids=high)[0]
    assert (a == b).float().mean() < 0.02


def test_seeded_high_rows_read_the_reference_stream():
    rows = torch.tensor([2**32, 2**40 + 3, -5])
    logits = torch.randn(3, 600, generator=torch.Generator().manual_seed(0))
    noise = philox_uniform(11, 2, rows, noise_width(600))
    expected = sample_categorical_reference(logits, noise=noise)[0]
    assert torch.equal(sample_categorical(logits, seed=11, offset=2, row_ids=rows)[0], expected)


def test_ids_that_are_not_integers_are_refused():
    """A float id was truncated: rows [1.7] drew row 1's uniforms."""
    with pytest.raises(TypeError, match="rows must be an integer tensor, got torch.float32"):
        philox_uniform(1, 2, torch.tensor([1.7]), 2)
    with pytest.raises(TypeError, match="cols must be an integer tensor, got torch.bool"):
        philox_uniform(1, 2, torch.tensor([1]), torch.tensor([True]))
    with pytest.raises(ValueError, match="cols must be >= 0"):
        philox_uniform(1, 2, torch.tensor([1]), -1)
    for rows, cols in (([1.7], 2), ([1], [0, 1.5])):  # in sequences, as in tensors
        name = "rows" if cols == 2 else "cols"
        with pytest.raises(TypeError, match=f"{name} must be an integer tensor or a sequence of ints"):
            philox_uniform(1, 2, rows, cols)
    assert philox_uniform(1, 2, [], 3).shape == (0, 3) and philox_uniform(1, 2, [4], []).shape == (1, 0)


def test_split32_gives_the_int32_words_of_the_uint64_bits():
    """A counter (an int64, or a uint64 as a Python int) reaches the kernels as its low and
    high 32-bit words, each the int32 with the word's bits."""
    from ddpd.ops.rng import split32

    def words(value):  # by the definition: the uint64 bits, cut in two, each read as int32
        bits = value % 2**64
        return tuple(w - 2**32 if w >= 2**31 else w for w in (bits % 2**32, bits // 2**32))

    edges = [0, 1, -1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -2**63, 2**63, 2**64 - 1, -5, 0x80000000_7FFFFFFF]
    drawn = torch.randint(-2**63, 2**63 - 1, (1000,), generator=torch.Generator().manual_seed(0))
    for value in edges + [int(x) for x in drawn]:
        assert split32(value) == words(value), value
        assert all(-2**31 <= w < 2**31 for w in split32(value))


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "best"])
def test_every_vector_path_of_the_cpu_kernels_computes_the_reference_uniforms(isa):
    """The C++ kernels compute a row's uniforms a run of columns at a time, 16 or 8 columns at
    once where the CPU has AVX-512 or AVX2 (csrc/cpu/uniforms.cpp): each path this CPU has
    gives the reference's bits (the uniforms, and the words multinomial's draws read), for runs
    around the vector widths starting at any column (runs shorter than a vector put 16 rows in
    the lanes, a column at a time: 39 rows, 64-bit ids among them, fill two blocks of 16 and a
    partial third), columns up to 2**32 - 1, 64-bit row ids, and seeds and offsets with both
    words set."""
    ops = cpu_ops()
    rows = torch.cat([LOW_ROWS, torch.tensor([2**32 + 3, -1]), torch.arange(100, 130), LOW_ROWS.flip(0) + 2**40])
    runs = [(0, 1), (2, 3), (0, 7), (3, 8), (5, 9), (17, 16), (0, 17), (100, 33), (2**31 - 5, 40),
            (2**32 - 20, 20), (2**32 - 3, 3)]
    for seed, offset in ((0, 0), (2**64 - 3, 2**40 + 9), (12345, 2**63 + 1)):
        for first, n in runs:
            try:
                got = ops.philox_uniforms_cpu(as_int64(seed), as_int64(offset), rows, first, n, isa)
            except ValueError as error:
                assert f"no path '{isa}'" in str(error)
                pytest.skip(f"this CPU has no {isa} path")
            assert torch.equal(got, philox_uniform_reference(seed, offset, rows, torch.arange(first, first + n))), \
                (first, n)
            words = ops.philox_uniforms_cpu(as_int64(seed), as_int64(offset), rows, first, n, isa, True)
            assert torch.equal(words, philox_words(seed, offset, rows, torch.arange(first, first + n))), (first, n)


@pytest.mark.parametrize("first,n", [(-1, 2), (2**32 - 1, 2), (0, -1)])
def test_the_cpu_kernels_refuse_columns_outside_the_32_bit_counter(first, n):
    with pytest.raises(ValueError, match=r"columns must lie in \[0, 2\*\*32\)"):
        cpu_ops().philox_uniforms_cpu(0, 0, torch.tensor([0]), first, n, "scalar")


def test_philox_uniform_on_cpu_computes_runs_of_columns_in_the_extension(monkeypatch):
    """Once ddpd._C is loaded, a CPU call whose columns are a run within [0, 2**32) computes
    its uniforms in C++ (the vector paths above), the torch reference's bits; columns out of
    order or past 2**32 (where column c + 2**32 is column c) go to the reference."""
    cpu_ops()  # loads the extension
    calls = []
    reference = rng._uniforms
    monkeypatch.setattr(rng, "_uniforms", lambda *args: calls.append(args) or reference(*args))
    rows = torch.cat([LOW_ROWS, torch.tensor([2**32 + 3, -1, -2**63])])
    columns = [(64, True), (0, True), (torch.arange(7, 40), True), (torch.arange(2**32 - 5, 2**32), True),
               (torch.tensor([3, 1, 2]), False), (torch.arange(2**32 - 2, 2**32 + 3), False),
               (torch.arange(-2, 3), False)]  # column -1 is column 2**32 - 1
    for seed, offset in ((0, 0), (2**64 - 3, 2**40 + 9), (torch.tensor(-5), torch.tensor(2**40))):
        for cols, in_extension in columns:
            calls.clear()
            got = philox_uniform(seed, offset, rows, cols)
            assert (not calls) == in_extension, cols
            assert torch.equal(got, philox_uniform_reference(seed, offset, rows, cols)), cols


def test_philox_uniform_never_loads_the_extension(monkeypatch):
    """Before ddpd._C is loaded a CPU call draws with the torch reference, never loading (or building) it."""
    monkeypatch.setattr(rng._ext, "loaded", lambda: False)
    monkeypatch.setattr(rng._dispatch, "cpu_kernel", lambda name: pytest.fail(f"{name} was looked up"))
    rows = torch.tensor([0, 7])
    assert torch.equal(philox_uniform(3, 4, rows, 5), philox_uniform_reference(3, 4, rows, 5))


def test_the_docs_give_the_probability_of_a_uniform_of_one(monkeypatch):
    """Of the 2**24 grid values ((w >> 8) + 0.5) * 2**-24 only the top one rounds to 1.0 in
    float32: probability 2**-24, which the docs once gave as 2**-25."""
    from pathlib import Path

    words = torch.arange(2**24, dtype=torch.int64) << 8
    monkeypatch.setattr(rng, "philox_words", lambda seed, offset, rows, cols: words)
    ones = (rng._uniforms(0, 0, None, None) == 1.0).nonzero().flatten().tolist()
    assert ones == [2**24 - 1]
    docs = Path(__file__).resolve().parents[2] / "docs" / "ops"
    for page in ("rng.md", "bernoulli.md"):
        text = " ".join((docs / page).read_text().split())
        assert "(probability 2\\*\\*-24)" in text and "2\\*\\*-25" not in text, page


@pytest.mark.parametrize("fn", [philox_uniform, philox_uniform_reference])
def test_row_ids_given_as_ints_at_or_above_two_to_the_63_are_their_int64_bits(fn):
    """rows [2**64 - 1] raised torch's "Overflow when unpacking long long": an int in
    [2**63, 2**64) now names the row whose int64 bits it is, as a negative id does."""
    want = fn(5, 1, torch.tensor([-1, -2**63, 3]), 4)
    assert torch.equal(fn(5, 1, [2**64 - 1, 2**63, 3], 4), want)
    assert torch.equal(fn(5, 1, (np.uint64(2**64 - 1), -2**63, np.int64(3)), 4), want)
    for bad in (2**64, -2**63 - 1):
        with pytest.raises(ValueError, match=r"rows must hold ids in \[-2\*\*63, 2\*\*64\), got"):
            fn(5, 1, [0, bad], 4)


@pytest.mark.parametrize("fn", [philox_uniform, philox_uniform_reference])
def test_a_number_of_columns_may_be_any_integer_scalar(fn):
    """cols as a numpy int or a 0-d integer tensor was refused as "not 1-D"; it counts the
    columns as an int does. A bool is refused, a 1-D tensor stays a list of columns."""
    rows = torch.tensor([0, 9])
    want = fn(3, 0, rows, 3)
    for cols in (np.int64(3), np.int32(3), np.array(3), torch.tensor(3), torch.tensor(3, dtype=torch.int32)):
        assert torch.equal(fn(3, 0, rows, cols), want), repr(cols)
    assert torch.equal(fn(3, 0, rows, torch.tensor([2])), want[:, 2:])
    with pytest.raises(TypeError, match="cols must be"):
        fn(3, 0, rows, True)
    for count in (3.0, np.float64(3), None):  # told to pass a tensor or a sequence, not an int
        with pytest.raises(TypeError, match=r"cols must be a number of columns \(an int\) or the columns"):
            fn(3, 0, rows, count)
    with pytest.raises(ValueError, match="cols must be >= 0"):
        fn(3, 0, rows, np.int64(-1))


def test_a_generator_draws_the_seed_on_its_own_device(monkeypatch):
    """seed_from_generator drew on the default device: a CUDA generator raised torch's
    "Expected a 'cpu' device type for generator". It draws on the generator's device now;
    a CPU generator draws the (seed, offset) it always did."""
    assert rng.seed_from_generator(torch.Generator().manual_seed(7)) == (1407639518939636932, 551904368352831990)
    devices = []
    randint = torch.randint
    monkeypatch.setattr(torch, "randint", lambda *a, **k: devices.append(k.get("device")) or randint(*a, **k))
    generator = torch.Generator()
    rng.seed_from_generator(generator)
    sample_categorical(torch.zeros(2, 5), generator=generator)
    assert devices == [generator.device] * 2


@pytest.mark.parametrize("fn", [philox_uniform, philox_uniform_reference])
def test_philox_uniform_traces_on_cpu(fn):
    """The key of CPU rows skipped the 64-bit id evaluation after reading whether any row
    needed it: make_fx and torch.compile(fullgraph=True) failed on that data-dependent guard.
    A traced call takes the evaluation and draws the eager values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    rows = torch.tensor([0, 3, 2**40 + 1, -5])
    for ids in (rows, rows[:2]):  # with and without ids at or above 2**32
        assert torch.equal(make_fx(lambda r: fn(1, 2, r, 5), tracing_mode="fake")(ids)(ids), fn(1, 2, ids, 5))
    small = rows[:2]  # the ids whose eager key skips the evaluation
    compiled = torch.compile(lambda r: fn(1, 2, r, 5), fullgraph=True, backend="eager")
    assert torch.equal(compiled(small), fn(1, 2, small, 5))


@pytest.mark.parametrize("fn", [philox_uniform, philox_uniform_reference])
def test_ids_given_as_lists_of_numpy_unsigned_ints_are_their_values(fn):
    """torch.as_tensor([np.uint64(5)]) raises TypeError, which _ids did not catch: such rows or
    columns failed with "an integer is required". They draw as the same ints do."""
    assert torch.equal(fn(1, 2, [np.uint64(5)], 2), fn(1, 2, [5], 2))
    assert torch.equal(fn(1, 2, [np.uint64(2**63), np.uint64(7)], 2), fn(1, 2, [2**63, 7], 2))
    assert torch.equal(fn(1, 2, [4], [np.uint64(3), np.uint64(0)]), fn(1, 2, [4], [3, 0]))
    with pytest.raises(TypeError, match="rows must be an integer tensor or a sequence of ints"):
        fn(1, 2, [np.uint64(5), "a"], 2)


@pytest.mark.parametrize("fn", [philox_uniform, philox_uniform_reference])
def test_seed_tensors_of_another_kind_and_ids_not_1d_are_refused(fn):
    """A seed or offset tensor is the int64 bits of one uint64; rows and cols list ids one by one."""
    with pytest.raises(TypeError, match=r"^seed must be an int in \[0, 2\*\*64\) or an int64 tensor of one element, "
                                        r"got torch.int32 of shape \(\)$"):
        fn(torch.tensor(1, dtype=torch.int32), 2, [0], 3)
    with pytest.raises(TypeError, match=r"^offset must be .* got torch.int64 of shape \(2,\)$"):
        fn(1, torch.tensor([2, 3]), [0], 3)
    with pytest.raises(ValueError, match=r"^rows and cols must be 1-D, got shapes \(1, 2\) and \(3,\)$"):
        fn(1, 2, torch.tensor([[0, 1]]), 3)
    with pytest.raises(ValueError, match=r"^rows and cols must be 1-D, got shapes \(1,\) and \(1, 2\)$"):
        fn(1, 2, [0], torch.tensor([[0, 1]]))


def test_gumbel_is_finite_at_the_top_uniform():
    """Explicit noise may hold 1.0 (uniforms are in (0, 1]): the references' Gumbel variable
    clamps it below one as the kernels do, instead of returning +inf."""
    g = rng.gumbel(torch.tensor([1.0, rng.BELOW_ONE, 0.5]))
    assert torch.isfinite(g).all()
    assert g[0] == g[1]
    # the clamp is to the largest float32 below one, and moves no uniform under it
    below = torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))
    assert rng.BELOW_ONE == float(below)
    u = torch.tensor([float(below), 0.5, 2.0**-24])
    assert torch.equal(rng.gumbel(u), -torch.log(-torch.log(u)))


def test_explicit_noise_of_another_dtype_or_out_of_range_is_refused_naming_the_first_value():
    """check_noise_values refuses non-float32 uniforms and names the first value outside (0, 1]."""
    noise = torch.full((3, 4), 0.5)
    noise[1, 2], noise[2, 0] = 0.0, 1.5
    with pytest.raises(ValueError, match=r"^noise values must be uniforms in \(0, 1\], got 0.0 at row 1, column 2$"):
        rng.check_noise_values(noise)
    with pytest.raises(TypeError, match=r"^u must have dtype torch.float32, got torch.float64$"):
        rng.check_noise_values(torch.full((2, 2), 0.5, dtype=torch.float64), "u")


def test_explicit_noise_at_both_ends_of_the_unit_interval_is_accepted():
    """(0, 1] is closed at one: 1.0 (the top Philox uniform in float32) and the smallest
    positive float32 are uniforms; 0.0 and the float32 just above one are not."""
    rng.check_noise_values(torch.tensor([[1.0, float(torch.finfo(torch.float32).tiny) * 2**-23, 0.5]]))
    above = float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)))
    for bad in (0.0, above):
        with pytest.raises(ValueError, match=rf"^noise values must be uniforms in \(0, 1\], got {bad!r} at row 0, "
                                             r"column 1$"):
            rng.check_noise_values(torch.tensor([[0.5, bad]]))


# (the input's name, noise's shape, a call of the op on that input given its stream arguments)
STREAM_CALLS = {
    "planner_select": ("logits", (2, 4), lambda **s: planner_select(torch.randn(2, 4), **s)),
    "planner_select_reference": ("logits", (2, 4), lambda **s: planner_select_reference(torch.randn(2, 4), **s)),
    "planner_mask": ("logits", (2, 4), lambda **s: planner_mask(torch.randn(2, 4), torch.zeros(2, 4, dtype=torch.long),
                                                                None, 5, **s)),
    "sample_categorical": ("logits", (2, noise_width(4)), lambda **s: sample_categorical(torch.randn(2, 4), **s)),
    "sample_categorical_reference": ("logits", (2, noise_width(4)),
                                     lambda **s: sample_categorical_reference(torch.randn(2, 4), **s)),
    "sample_from_hidden": ("hidden", (2, noise_width(4)),
                           lambda **s: sample_from_hidden(torch.randn(2, 3), torch.randn(4, 3), **s)),
    "sample_from_hidden_reference": ("hidden", (2, noise_width(4)), lambda **s: sample_from_hidden_reference(
        torch.randn(2, 3), torch.randn(4, 3), **s)),
    "bernoulli": ("p", (2, 4), lambda **s: bernoulli(torch.rand(2, 4), **s)),
    "bernoulli_reference": ("p", (2, 4), lambda **s: bernoulli_reference(torch.rand(2, 4), **s)),
    "multinomial": ("weights", (2, 2), lambda **s: multinomial(torch.ones(2, 4), 2, True, **s)),
    "multinomial_reference": ("weights", (2, 2), lambda **s: multinomial_reference(torch.ones(2, 4), 2, True, **s)),
}


def stream_arguments(name: str, noise_shape: tuple, device: str) -> dict:
    """The stream arguments that put `name` (noise, row_ids, seed or offset) on `device`."""
    counter = torch.zeros((), dtype=torch.int64, device=device)
    return {"noise": dict(noise=torch.rand(noise_shape, device=device)),
            "row_ids": dict(seed=1, row_ids=torch.arange(noise_shape[0], device=device)),
            "seed": dict(seed=counter), "offset": dict(seed=1, offset=counter)}[name]


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("name", ["noise", "row_ids", "seed", "offset"])
@pytest.mark.parametrize("op", STREAM_CALLS)
def test_stream_arguments_on_another_device_name_the_input(op, name, like, other):
    """noise, row_ids or a seed or offset tensor beside an input on another device: the op's own
    ValueError, naming the argument, the input it must sit beside (logits, hidden, p or weights;
    it said "the input", or for multinomial's noise "like the weights") and both devices. Fake
    tensors give a CUDA tensor without a GPU (a meta tensor is refused earlier, as on neither cpu
    nor cuda)."""
    input_name, noise_shape, call = STREAM_CALLS[op]
    with fake_tensors(like):
        given = stream_arguments(name, noise_shape, other)
        with pytest.raises(ValueError,
                           match=rf"^{name} must be on the device of {input_name} \({like}\), got {other}$"):
            call(**given)


@pytest.mark.parametrize("given", ["row_ids", "generator"])
@pytest.mark.parametrize("op", STREAM_CALLS)
def test_noise_beside_row_ids_or_a_generator_is_refused(op, given):
    """Explicit noise replaces the whole stream: row_ids or a generator beside it is refused, not ignored."""
    _, noise_shape, call = STREAM_CALLS[op]
    extra = {"row_ids": torch.arange(noise_shape[0]), "generator": torch.Generator()}[given]
    with pytest.raises(ValueError, match=r"^pass either noise or seed/offset/generator/row_ids, not both$"):
        call(noise=torch.rand(noise_shape), **{given: extra})
