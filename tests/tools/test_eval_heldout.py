"""Held-out chunks for evaluation (ddpd.eval.heldout)."""
import pytest
import torch

from ddpd.eval.heldout import heldout_sequences, pick_chunks
from ddpd.training.data import SPLITS, Text8Tokenizer, chunk, load_splits


def test_pick_chunks_spreads_its_picks_over_the_stream():
    tokens = torch.arange(100)
    assert pick_chunks(tokens, 10, 3)[:, 0].tolist() == [0, 40, 90]  # chunks 0, 4 (4.5 to even) and 9
    assert torch.equal(pick_chunks(tokens, 10, 10), tokens.reshape(10, 10))  # every chunk, when all are asked
    assert torch.equal(pick_chunks(tokens, 10), tokens.reshape(10, 10))


@pytest.mark.parametrize("num_sequences, match", [(0, "num_sequences must be >= 1, got 0"),
                                                  (11, "holds 10 sequences of 10 tokens, got num_sequences=11")])
def test_pick_chunks_refuses_none_or_more_chunks_than_the_stream_holds(num_sequences, match):
    with pytest.raises(ValueError, match=match):
        pick_chunks(torch.arange(100), 10, num_sequences)


@pytest.mark.parametrize("tokens, error, match", [
    (list(range(100)), TypeError, "tokens must be a torch.Tensor, got list"),  # was an AttributeError on .numel
    (torch.tensor(5), ValueError, r"tokens must be 1-D, got shape \(\)"),  # was slice()'s IndexError
    (torch.arange(100).reshape(2, 50), ValueError, r"tokens must be 1-D, got shape \(2, 50\)"),  # reshape's error
    (torch.arange(100).float(), TypeError, r"tokens must have dtype in \(torch.int64\), got torch.float32"),
])
def test_pick_chunks_names_a_stream_that_is_no_long_1d_tensor(tokens, error, match):
    """A float stream was cut into float chunks (NaN ids passed through), a [B, D] batch cut by rows
    (reshape's RuntimeError where its rows did not make whole chunks)."""
    with pytest.raises(error, match=match):
        pick_chunks(tokens, 30, 3)


def test_heldout_sequences_refuse_an_unknown_split(tmp_path):
    corpus = tmp_path / "text.txt"
    corpus.write_text("the quick brown fox " * 200)
    with pytest.raises(ValueError, match="split must be one of"):
        heldout_sequences(str(corpus), Text8Tokenizer(), 8, split="tests")


def test_heldout_sequences_are_the_chunks_of_the_split_asked_for(tmp_path):
    """Each split's chunks are its own (the test split by default), cut from `text` when given."""
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(chr(ord("a") + i % 26) + " " * (i % 3) for i in range(2000)))
    splits = load_splits(str(corpus), Text8Tokenizer())
    for split in SPLITS:
        got = heldout_sequences(str(corpus), Text8Tokenizer(), 8, split=split)
        assert torch.equal(got, chunk(splits[split], 8)), split
    assert torch.equal(heldout_sequences(str(corpus), Text8Tokenizer(), 8), chunk(splits["test"], 8))
    unread = heldout_sequences(str(tmp_path / "absent.txt"), Text8Tokenizer(), 8, text=corpus.read_text())
    assert torch.equal(unread, chunk(splits["test"], 8))


def test_heldout_sequences_name_a_split_too_short_for_one_sequence(tmp_path):
    """The message names the split, the corpus, its token count and seq_len; seq_len is checked
    before the corpus is read."""
    corpus = tmp_path / "text.txt"
    corpus.write_text("abcd " * 20)  # 100 tokens: 5 in the test split
    with pytest.raises(ValueError, match=rf"^seq_len: the test split of {corpus} has 5 tokens, fewer than one "
                                         r"sequence of 8$"):
        heldout_sequences(str(corpus), Text8Tokenizer(), 8)
    with pytest.raises(ValueError, match="^seq_len must be >= 1, got 0$"):
        heldout_sequences(str(tmp_path / "absent.txt"), Text8Tokenizer(), 0)


def test_pick_chunks_names_a_stream_it_was_not_told_about_as_tokens():
    """Without `what`, both refusals name the stream "tokens"; a partial chunk does not count."""
    with pytest.raises(ValueError, match=r"^seq_len: tokens has 7 tokens, fewer than one sequence of 8$"):
        pick_chunks(torch.arange(7), 8)
    with pytest.raises(ValueError, match=r"^num_sequences: tokens holds 2 sequences of 8 tokens, got num_sequences=3$"):
        pick_chunks(torch.arange(23), 8, 3)
