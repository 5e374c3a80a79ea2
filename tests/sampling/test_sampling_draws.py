"""The draw helpers of ddpd.sampling.draws, called directly: what every token draw honours
(truncation, exclusions, confidences), the planner order of a commit policy, and the chunks
of explicit TOKEN uniforms."""
import pytest
import torch

from ddpd.ops.sample_categorical import noise_width
from ddpd.sampling import PhiloxNoise, draws
from ddpd.sampling.draws import FusedDraws, ReferenceDraws, make_draws, token_noise_width
from ddpd.sampling.noise import TorchNoise
from ddpd.sampling.options import Execution, Truncation

ROWS = torch.tensor([3, 0, 5])


def both(truncation=Truncation()):
    noise = PhiloxNoise(11, first_row=2)
    return [ReferenceDraws(noise, Execution(), truncation=truncation),
            FusedDraws(noise, Execution(fused=True), truncation=truncation)]


def peaked_logits(n, vocab, top):
    """Float[n, vocab] whose most probable token is top[i], the others a close second."""
    logits = torch.zeros(n, vocab)
    logits[torch.arange(n), top] = 0.5
    return logits


@pytest.mark.parametrize("per_row", [1, 4])
def test_top_k_1_reaches_every_token_draw(per_row):
    """Truncation(top_k=1) leaves the most probable token only, at temperature 1: the one-draw
    kernel path, the chunked path of several draws a row and the reference all honour it."""
    top = torch.randint(0, 7, (3 * per_row,), generator=torch.Generator().manual_seed(0))
    for d in both(Truncation(top_k=1)):
        for _ in range(3):
            assert torch.equal(d.categorical(1, ROWS, peaked_logits(3 * per_row, 7, top), per_row, 1.0), top)


class Head(torch.nn.Module):
    """A denoiser with hidden(x, t) and an nn.Linear head (the fused head path)."""

    def __init__(self, vocab):
        super().__init__()
        self.head = torch.nn.Linear(4, vocab)
        torch.nn.init.normal_(self.head.weight, std=0.1)

    def hidden(self, x, t):
        return torch.nn.functional.one_hot(x % 4, 4).float()

    def forward(self, x, t):
        return self.head(self.hidden(x, t))


def test_top_k_1_reaches_the_fused_head():
    """sample_from_hidden, the fused draw at the chosen positions of a denoiser with a head,
    draws under the run's truncation too: top_k=1 is the argmax of the head's logits."""
    torch.manual_seed(0)
    net, x = Head(9), torch.randint(0, 9, (3, 5))
    positions = torch.tensor([[0, 2], [4, 1], [3, 3]])
    d = FusedDraws(PhiloxNoise(1), Execution(fused=True), truncation=Truncation(top_k=1))
    expected = net(x, None).gather(1, positions[..., None].expand(-1, -1, 9)).argmax(-1)
    for step in range(3):
        tokens = d.tokens_at(d.batch(x), net, step, x, torch.full((3,), 0.5), positions, ROWS, 9, 1.0)
        assert torch.equal(tokens, expected)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tokens_everywhere_never_draws_the_excluded_token(temperature):
    """The exclusion of tokens_everywhere (a token never drawn at each position) reaches the
    draw: here the excluded token holds almost all of the probability."""
    logits = torch.zeros(3, 6, 4)
    exclude = torch.randint(0, 4, (3, 6), generator=torch.Generator().manual_seed(1))
    logits.scatter_(2, exclude[..., None], 20.0)
    for d in both():
        for step in range(4):
            assert not (d.tokens_everywhere(step, ROWS, logits, temperature, exclude) == exclude).any()


@pytest.mark.parametrize("noise", [PhiloxNoise(11), TorchNoise(torch.Generator().manual_seed(0))])
def test_one_draw_a_row_and_a_source_without_counters_never_draw_the_excluded_token(noise):
    """The fused draws that read no chunks (one position a row, or a noise source other than
    Philox) hand the exclusion to the kernel too."""
    for length in (1, 3):
        logits = torch.zeros(3, length, 4)
        exclude = torch.randint(0, 4, (3, length), generator=torch.Generator().manual_seed(length))
        logits.scatter_(2, exclude[..., None], 20.0)
        d = FusedDraws(noise, Execution(fused=True))
        for step in range(4):
            assert not (d.tokens_everywhere(step, ROWS, logits, 1.0, exclude) == exclude).any()


@pytest.mark.parametrize("per_row", [1, 2])
def test_tokens_from_returns_tokens_then_their_probabilities(per_row):
    """With confidence, tokens_from returns (Long tokens, Float confidences) both [B, k], the
    confidence the drawn token's probability (1 where top_k=1 leaves it alone, else below 1)."""
    logits = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(2))
    positions = torch.tensor([[0, 4], [1, 1], [3, 2]])[:, :per_row]
    for truncation, certain in ((Truncation(top_k=1), True), (Truncation(), False)):
        for d in both(truncation):
            tokens, conf = d.tokens_from(0, ROWS, logits, positions, 1.0, confidence=True)
            assert tokens.dtype == torch.long and tokens.shape == positions.shape == conf.shape
            assert conf.is_floating_point() and (conf == 1).all() == certain and (conf > 0).all()


@pytest.mark.parametrize("mask_id", [None, 6])
def test_a_plan_keeps_the_planner_order_only_beyond_k(mask_id):
    """order > k returns the planner's first `order` picks, whose first k are the positions;
    order <= k returns no order (a commit policy reads it only when it asks for more)."""
    logits = torch.randn(3, 8, generator=torch.Generator().manual_seed(3))
    x = torch.randint(0, 7, (3, 8), generator=torch.Generator().manual_seed(4))
    for d in both():
        plan = d.plan(2, logits, ROWS, 2, "softmax", 0.1, x, mask_id, order=5)
        assert plan.order.shape == (3, 5) and plan.positions.shape == (3, 2)
        if mask_id is None:
            assert torch.equal(plan.order[:, :2], plan.positions)
        assert (plan.order.sort(1).values.diff(dim=1) > 0).all()  # distinct positions
        for order in (0, 2):
            assert d.plan(2, logits, ROWS, 2, "softmax", 0.1, x, mask_id, order=order).order is None


@pytest.mark.parametrize("chunk,per_row", [(3 * 7, 3), (4 * 7, 3), (2 * 7, 5), (7, 5), (100 * 7, 5)])
def test_token_chunks_cover_the_draws_once_within_the_chunk(monkeypatch, chunk, per_row):
    """_token_chunks hands out consecutive spans of draws that cover all of them once, none
    reading more than TOKEN_CHUNK uniforms (the memory bound it exists for), each span's noise
    one row of uniforms a draw."""
    monkeypatch.setattr(draws, "TOKEN_CHUNK", chunk)
    vocab = 7
    width = token_noise_width(vocab)
    rows = torch.tensor([4, 1, 8, 0])
    d = FusedDraws(PhiloxNoise(5), Execution(fused=True))
    spans = list(d._token_chunks(0, rows, per_row, vocab))
    assert [first for first, _, _ in spans] == [0] + [last for _, last, _ in spans[:-1]]
    assert spans[-1][1] == len(rows) * per_row
    for first, last, u in spans:
        # a padded tile uniform follows the W a draw reads (ddpd.ops.sample_categorical's layout)
        assert u.shape == (last - first, noise_width(vocab)) and (last - first) * width <= chunk


def test_make_draws_builds_the_runs_batch():
    """make_draws picks the strategy from Execution.fused; its batch runs in the draws' dtype
    and a fused batch carries the execution's sync_every and compaction."""
    x0 = torch.zeros(2, 3, dtype=torch.long)
    noise = PhiloxNoise(0)
    ref = make_draws(noise, Execution(), torch.bfloat16)
    assert type(ref) is ReferenceDraws and ref.batch(x0).dtype == torch.bfloat16
    for compaction in (False, True):
        fused = make_draws(noise, Execution(fused=True, sync_every=3, compaction=compaction), torch.float16)
        batch = fused.batch(x0)
        assert type(fused) is FusedDraws and batch.dtype == torch.float16
        assert batch.sync_every == 3 and batch.compaction is compaction


@pytest.mark.parametrize("chunk,per_row", [(2 * 7, 5), (3 * 7, 3), (100 * 7, 2)])
def test_token_chunks_read_each_draws_own_uniforms_of_its_row(monkeypatch, chunk, per_row):
    """Draw j of a row reads columns j * W .. (j + 1) * W - 1 of the row's TOKEN stream, the
    uniforms the reference reads for it, then the padded tile uniform 0.5, whatever the chunk."""
    monkeypatch.setattr(draws, "TOKEN_CHUNK", chunk)
    vocab, rows, noise = 7, torch.tensor([4, 1, 8]), PhiloxNoise(5, first_row=3)
    width = token_noise_width(vocab)
    d = FusedDraws(noise, Execution(fused=True))
    got = torch.cat([u for _, _, u in d._token_chunks(2, rows, per_row, vocab)])
    expected = ReferenceDraws(noise, Execution())._token_noise(2, rows, per_row, vocab)
    assert torch.equal(got, expected)
    assert torch.equal(got[:, :width], noise.uniform(2, draws.TOKEN, rows, per_row * width).view(-1, width))
    assert (got[:, width:] == 0.5).all() and got.shape[1] == noise_width(vocab)


def test_only_the_reference_run_restricts_a_pass_to_the_rows_that_draw():
    flags = torch.tensor([False, True, False, True])
    ref, fused = both()
    assert ref.rows_with(flags).tolist() == [1, 3] and fused.rows_with(flags) is None


def test_part_slices_per_draw_tensors_and_passes_numbers_through():
    values = torch.arange(6.0)
    assert draws._part(values, 2, 5).tolist() == [2.0, 3.0, 4.0]
    assert draws._part(0.7, 2, 5) == 0.7 and draws._part(None, 0, 1) is None


def test_the_reference_and_fused_plans_mask_from_the_same_uniforms():
    """Both runs draw the mask of a mask denoiser's input from the MASK stream of the rows and
    the positions from the SELECT stream: under one Philox source they plan alike."""
    logits = torch.randn(3, 8, generator=torch.Generator().manual_seed(6))
    x = torch.randint(0, 6, (3, 8), generator=torch.Generator().manual_seed(7))
    ref, fused = (d.plan(1, logits, ROWS, 2, "sigmoid", 0.05, x, 6) for d in both())
    assert torch.equal(ref.masked, fused.masked) and torch.equal(ref.count, fused.count)
    assert torch.equal(ref.positions, fused.positions) and torch.equal(ref.stop, fused.stop)


def test_fused_draws_from_a_source_without_counters_read_its_uniforms():
    """A noise source other than Philox gives explicit uniforms to every fused draw, several a
    row included (it has no columns to chunk)."""
    top = torch.randint(0, 7, (6,), generator=torch.Generator().manual_seed(8))
    d = FusedDraws(TorchNoise(torch.Generator().manual_seed(0)), Execution(fused=True),
                   truncation=Truncation(top_k=1))
    assert torch.equal(d.categorical(0, ROWS, peaked_logits(6, 7, top), 2, 1.0), top)


def test_tokens_from_draws_each_rows_tokens_at_its_own_positions():
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(9))
    positions = torch.tensor([[0, 4], [1, 1], [3, 2]])
    expected = logits.gather(1, positions[..., None].expand(-1, -1, 7)).argmax(-1)
    for d in both(Truncation(top_k=1)):
        assert torch.equal(d.tokens_from(0, ROWS, logits, positions, 1.0), expected)


def test_chunked_draws_return_each_draws_own_confidence(monkeypatch):
    """Several draws a row read their uniforms in chunks; the confidences come back in the order
    of the draws, as the reference gives them from the same uniforms."""
    monkeypatch.setattr(draws, "TOKEN_CHUNK", 2 * 7)
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(10))
    positions = torch.tensor([[0, 4, 2], [1, 3, 0], [4, 2, 1]])
    ref, fused = (d.tokens_from(1, ROWS, logits, positions, 1.0, confidence=True) for d in both())
    assert torch.equal(ref[0], fused[0])
    torch.testing.assert_close(fused[1], ref[1])
    expected = logits.softmax(-1).gather(1, positions[..., None].expand(-1, -1, 7))
    torch.testing.assert_close(fused[1], expected.gather(2, fused[0][..., None])[..., 0])
