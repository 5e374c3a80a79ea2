"""ddpd.ops.bernoulli: the C++ path, the Triton kernel (interpreter) and the torch
reference give the same coins; the coins read the counter-based stream that
philox_uniform returns; their law is Bernoulli(p); p = 0 / 1 are certain; tensor
counters, leading dimensions, opcheck and torch.compile."""
import pytest
import torch
from scipy import stats

from ddpd.kernels.bernoulli import bernoulli_kernel
from ddpd.ops import bernoulli, philox_uniform
from ddpd.ops.bernoulli import BLOCK, _prepare, bernoulli_grid, bernoulli_triton
from ddpd.ops.reference import bernoulli as bernoulli_reference


def triton_coins(p, **kw):
    p2, noise, (seed, offset, seed_t, offset_t), row_ids = _prepare(p, kw.get("seed"), kw.get("offset", 0), None,
                                                                    kw.get("row_ids"), kw.get("noise"))
    return bernoulli_triton(p2, noise, seed, offset, row_ids, seed_t, offset_t).reshape(p.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [1, 37, 2500])
def test_paths_agree_and_read_the_philox_stream(dtype, width):
    g = torch.Generator().manual_seed(width)
    p = torch.rand(4, width, generator=g).to(dtype)
    p[0, 0] = 0.0
    p[1, 0] = 1.0
    rows = torch.tensor([0, 3, 2**35, 9])
    kw = dict(seed=2**64 - 7, offset=2**33 + 1, row_ids=rows)
    expected = bernoulli_reference(p, **kw)
    assert torch.equal(bernoulli(p, **kw), expected) and torch.equal(triton_coins(p, **kw), expected)
    u = philox_uniform(2**64 - 7, 2**33 + 1, rows, width).clamp(max=1 - 2**-24)
    assert torch.equal(expected, u.double() < p.double() if dtype == torch.float64 else u < p.float())
    assert not expected[0, 0] and expected[1, 0]
    noise = torch.rand(4, width, generator=g).clamp(min=1e-7)
    assert torch.equal(bernoulli(p, noise=noise), bernoulli_reference(p, noise=noise))
    assert torch.equal(triton_coins(p, noise=noise), bernoulli_reference(p, noise=noise))


def test_the_coins_are_bernoulli_p_and_certain_at_zero_and_one():
    n = 200_000
    p = torch.tensor([0.0, 1e-3, 0.3, 0.5, 0.97, 1.0]).expand(n, 6)
    z = bernoulli(p, seed=11, row_ids=torch.arange(n))
    hits = z.sum(0).double()
    assert hits[0] == 0 and hits[-1] == n
    for j in (1, 2, 3, 4):
        q = float(p[0, j])
        assert stats.binomtest(int(hits[j]), n, q).pvalue > 1e-3
    assert bool((bernoulli(torch.tensor([[-2.0, 3.0]]), seed=1) == torch.tensor([[False, True]])).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_uniform_equal_to_p_comes_up_false(dtype):
    """z = u < p, strictly: at u == p exactly every path says False (u <= p would flip the coin)."""
    p = torch.tensor([[0.5, 0.25, 0.75]], dtype=dtype)
    noise = p.float()
    expected = torch.zeros_like(p, dtype=torch.bool)
    assert torch.equal(bernoulli_reference(p, noise=noise), expected)
    assert torch.equal(bernoulli(p, noise=noise), expected)
    assert torch.equal(triton_coins(p, noise=noise), expected)
    below = noise.nextafter(torch.zeros(()))
    assert torch.equal(bernoulli_reference(p, noise=below), ~expected)
    assert torch.equal(triton_coins(p, noise=below), ~expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_uniform_of_one_keeps_p_one_certain(dtype):
    """Noise may be 1.0 (the top uniform rounds to it): min(u, BELOW_ONE) < p keeps p = 1 True."""
    p = torch.tensor([[1.0, 0.5]], dtype=dtype)
    noise = torch.ones(1, 2)
    expected = torch.tensor([[True, False]])
    for coins in (bernoulli_reference(p, noise=noise), bernoulli(p, noise=noise), triton_coins(p, noise=noise)):
        assert torch.equal(coins, expected)


def test_a_uniform_of_one_is_clamped_to_the_largest_float32_below_one():
    """u = 1 reads as 1 - 2**-24 exactly: p just below that stays False, float64 p above it True."""
    p = torch.tensor([[1 - 2.0**-24, 1 - 2.0**-23]], dtype=torch.float32)
    noise = torch.ones(1, 2)
    for coins in (bernoulli_reference(p, noise=noise), bernoulli(p, noise=noise), triton_coins(p, noise=noise)):
        assert torch.equal(coins, torch.tensor([[False, False]]))
    p64 = torch.tensor([[1 - 2.0**-25, 1 - 2.0**-24]], dtype=torch.float64)
    for coins in (bernoulli_reference(p64, noise=noise), bernoulli(p64, noise=noise),
                  triton_coins(p64, noise=noise)):
        assert torch.equal(coins, torch.tensor([[True, False]]))


def test_float64_p_is_compared_in_float64_on_every_path():
    """p = 0.5 + 2**-40 rounds to 0.5 in float32, where u = 0.5 < p would come up False."""
    p = torch.tensor([[0.5 + 2.0**-40, 0.5 - 2.0**-40]], dtype=torch.float64)
    noise = torch.full((1, 2), 0.5)
    expected = torch.tensor([[True, False]])
    for coins in (bernoulli_reference(p, noise=noise), bernoulli(p, noise=noise), triton_coins(p, noise=noise)):
        assert torch.equal(coins, expected)


def test_the_kernel_reads_tensor_counters():
    p = torch.rand(3, 70, generator=torch.Generator().manual_seed(2))
    rows = torch.tensor([5, 2**36, 0])
    expected = bernoulli_reference(p, seed=2**64 - 3, offset=2**40 + 7, row_ids=rows)
    got = triton_coins(p, seed=torch.tensor(-3), offset=torch.tensor(2**40 + 7), row_ids=rows)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("width", [BLOCK + 37, BLOCK])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_writes_no_coin_past_the_last_column(dtype, width):
    """D = BLOCK + 37 leaves the last block of a row partial: its dead lanes write nothing,
    not even the one just past the last row, where p and z run on (p = 1 there would say True).
    D = BLOCK is one whole block a row: each program finds its own row."""
    rows = 2
    p_buf = torch.ones(rows * width + BLOCK, dtype=dtype)
    p_buf[:rows * width] = torch.rand(rows * width, generator=torch.Generator().manual_seed(3))
    z_buf = torch.zeros(rows * width + BLOCK, dtype=torch.bool)
    p, z = p_buf[:rows * width].view(rows, width), z_buf[:rows * width].view(rows, width)
    bernoulli_kernel[bernoulli_grid(rows, width)](p, width, None, None, 9, 0, 4, 0, None, None, z, BLOCK=BLOCK,
                                                  FLOAT64=dtype == torch.float64)
    assert torch.equal(z, bernoulli_reference(p, seed=9, offset=4))
    assert not z_buf[rows * width:].any()


def test_tensor_counters_leading_dimensions_and_batch_invariance():
    p = torch.rand(2, 3, 50, generator=torch.Generator().manual_seed(1))
    z = bernoulli(p, seed=4, offset=6)
    assert z.shape == p.shape and z.dtype == torch.bool
    assert torch.equal(z.reshape(6, 50), bernoulli(p.reshape(6, 50), seed=4, offset=6))
    assert torch.equal(bernoulli(p, seed=torch.tensor(4), offset=torch.tensor(6)), z)
    keep = torch.tensor([1, 4])
    assert torch.equal(bernoulli(p.reshape(6, 50)[keep], seed=4, offset=6, row_ids=keep), z.reshape(6, 50)[keep])


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(p=torch.tensor(0.5)), ValueError, r"p must have shape \[..., D\]"),
    (dict(p=torch.ones(2, 3, dtype=torch.long)), TypeError, "p must have dtype"),
    (dict(noise=torch.rand(2, 4)), ValueError, r"noise must have the shape of p \(2, 3\)"),
    (dict(noise=torch.rand(3, 2)), ValueError, r"noise must have the shape of p \(2, 3\)"),
    (dict(noise=torch.zeros(2, 3)), ValueError, r"noise values must be uniforms in \(0, 1\]"),
    (dict(noise=torch.rand(2, 4, dtype=torch.float64)), TypeError, r"noise must have dtype in \(torch.float32\)"),
    (dict(seed=1, row_ids=torch.arange(3)), ValueError, r"row_ids must have the leading shape \(2,\)"),
    (dict(p=torch.rand(2, 3, 4), seed=1, row_ids=torch.arange(6)), ValueError,
     r"row_ids must have the leading shape \(2, 3\)"),
    (dict(seed=1, offset=torch.tensor(1.0)), TypeError, "offset must be an int or an int64 tensor"),
])
def test_bad_arguments_raise_clear_errors(kwargs, error, match):
    kwargs = dict(dict(p=torch.rand(2, 3)), **kwargs)
    for op in (bernoulli, bernoulli_reference):
        with pytest.raises(error, match=match):
            op(**kwargs)


def test_opcheck_compile_and_vmap():
    p = torch.rand(3, 40)
    op = torch.ops.ddpd.bernoulli.default
    torch.library.opcheck(op, (p, None, 5, 6, None, None, None))
    torch.library.opcheck(op, (p.double(), torch.rand(3, 40) + 1e-6, 0, 0, None, None, None))
    compiled = torch.compile(lambda q, o: bernoulli(q, seed=2, offset=o), fullgraph=True, backend="aot_eager")
    offset = torch.tensor(0)
    for _ in range(2):
        assert torch.equal(compiled(p, offset), bernoulli(p, seed=2, offset=int(offset)))
        offset += 1
    with pytest.raises(ValueError, match="does not run under torch.func transforms"):
        torch.vmap(lambda q: bernoulli(q, seed=1))(p[:, None])


def test_vmap_over_the_noise_or_the_row_ids_alone_is_refused():
    """A batched noise or row_ids with a plain p is refused by name too, not run slice by slice."""
    p = torch.full((2, 3), 0.5)
    for op in (bernoulli, bernoulli_reference):
        with pytest.raises(ValueError, match="ddpd.ops.bernoulli does not run under torch.func transforms"):
            torch.vmap(lambda n: op(p, noise=n))(torch.rand(4, 2, 3).clamp(min=1e-7))
        with pytest.raises(ValueError, match="ddpd.ops.bernoulli does not run under torch.func transforms"):
            torch.vmap(lambda r: op(p, seed=1, row_ids=r))(torch.arange(8).view(4, 2))


def test_rows_wider_than_the_streams_are_refused():
    """A row's stream has 2**30 columns at most, as every op's (the C++ Philox column is 32 bits:
    column d + 2**32 would repeat column d's coin)."""
    wide = torch.zeros(1).expand(2**30)  # no memory behind it: refused before any work
    for op in (bernoulli, bernoulli_reference):
        with pytest.raises(ValueError, match=r"D \(p's last dimension\) must be in \[1, 1073741824\)"):
            op(wide, seed=0)
    assert bernoulli(torch.zeros(3, 0), seed=0).shape == (3, 0)  # an empty row is no row of coins


def test_transposed_p_and_noise_give_the_coins_of_their_copies():
    """Non-contiguous p and noise: the C++ and Triton paths read them by value, not memory order."""
    g = torch.Generator().manual_seed(7)
    p = torch.rand(5, 3, generator=g).t()
    noise = torch.rand(5, 3, generator=g).clamp(min=1e-7).t()
    expected = bernoulli_reference(p.contiguous(), noise=noise.contiguous())
    assert torch.equal(bernoulli(p, noise=noise), expected)
    assert torch.equal(triton_coins(p, noise=noise), expected)
    assert torch.equal(triton_coins(p, seed=3), bernoulli_reference(p.contiguous(), seed=3))


def test_the_cpu_kernel_refuses_a_p_that_is_not_a_contiguous_matrix():
    """torch.ops.ddpd.bernoulli_cpu reads p as [N, D] in memory order: anything else is refused."""
    for p in (torch.rand(6), torch.rand(2, 3, 1), torch.rand(3, 2).t()):
        with pytest.raises(RuntimeError, match=r"bernoulli: p must be a contiguous \[N, D\] tensor"):
            torch.ops.ddpd.bernoulli_cpu(p, None, 1, 0, None, None, None)


def test_strided_row_ids_name_the_streams_of_their_values():
    """row_ids as a view that skips memory (every other entry of a wider tensor): both paths
    read each row's stream id by value, as the reference does."""
    p = torch.rand(4, 33, generator=torch.Generator().manual_seed(9))
    ids = torch.tensor([7, 0, 2, 0, 11, 0, 5, 0])[::2]
    assert not ids.is_contiguous()
    expected = bernoulli_reference(p, seed=4, row_ids=ids.contiguous())
    assert torch.equal(bernoulli(p, seed=4, row_ids=ids), expected)
    assert torch.equal(triton_coins(p, seed=4, row_ids=ids), expected)
