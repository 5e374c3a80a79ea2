"""Tokenizers, corpus loading, the 90/5/5 split and the batch samplers."""
import hashlib
import json
import os
import re
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from ddpd.assets import ASSETS, BOOKS, GPT2_RANKS
from ddpd.training.data import (
    CorpusTextError,
    GPT2Tokenizer,
    RandomCrops,
    Records,
    Text8Tokenizer,
    chunk,
    encode_corpus,
    evaluation_batches,
    evenly_spaced,
    fingerprint,
    is_labelled,
    load_labelled,
    load_splits,
    load_text,
    resolve_source,
    split_tokens,
    tokenizer_from_config,
)

WIKI = str(BOOKS)  # the shipped text8-format corpus
TIKTOKEN = str(GPT2_RANKS)
MIXED = str(ASSETS / "NOTICE.md")  # mixed case, punctuation, line breaks


@pytest.fixture(scope="module")
def wiki_text():
    with open(WIKI) as f:
        return f.read()


@pytest.fixture(scope="module")
def gpt2():
    return GPT2Tokenizer(TIKTOKEN)


def test_text8_round_trip_on_corpus(wiki_text):
    tok = Text8Tokenizer()
    text = wiki_text[:100_000]
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert min(ids) >= 0 and max(ids) < tok.vocab_size == 27
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text
    tensor = tok.encode_tensor(text)  # Long, as embeddings and the GPT-2 stream take
    assert tensor.dtype == torch.long and tensor.tolist() == ids


def test_text8_alphabet_order():
    tok = Text8Tokenizer()
    assert tok.encode(" az") == [0, 1, 26]
    assert tok.decode(list(range(27))) == " abcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize("text, char, position", [("hello World", "W", 6), ("caf\u00e9", "\u00e9", 3),
                                                   ("one\ntwo", "\n", 3), ("room 101", "1", 5)])
def test_text8_rejects_outside_alphabet(text, char, position):
    with pytest.raises(ValueError) as info:
        Text8Tokenizer().encode(text)
    message = str(info.value)
    assert repr(char) in message and f"position {position}" in message


def test_text8_counts_every_character_outside_the_alphabet():
    with pytest.raises(ValueError, match=r"got 'A' \(U\+0041\) at position 0; 3 such character\(s\) in total"):
        Text8Tokenizer().encode("A B C")


def test_text8_decode_rejects_bad_ids():
    tok = Text8Tokenizer()
    with pytest.raises(ValueError, match=r"ids\[1\] must be in \[0, 27\), got 27"):
        tok.decode([0, 27])
    with pytest.raises(TypeError, match="ids"):
        tok.decode([0, 1.5])
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got bool True"):
        tok.decode([True])
    with pytest.raises(TypeError, match="text must be str"):
        tok.encode(b"abc")


def test_decode_refuses_negative_ids(gpt2):
    """A negative id is refused, not read from the end of the vocabulary (-1 as 'z')."""
    for tok, name in ((Text8Tokenizer(), "Text8Tokenizer"), (gpt2, "GPT2Tokenizer")):
        with pytest.raises(ValueError, match=rf"{name}.decode: ids\[1\] must be in \[0, {tok.vocab_size}\), got -1"):
            tok.decode([0, -1])


def test_decode_takes_numpy_integers(gpt2):
    """ids from a numpy array (np.int64 items) were refused as "must be an int"."""
    for tok, ids in ((Text8Tokenizer(), [8, 9, 0, 20]), (gpt2, [15496, 995])):
        assert tok.decode(np.array(ids)) == tok.decode([np.int32(i) for i in ids]) == tok.decode(ids)
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got float64"):
        Text8Tokenizer().decode(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got bool"):
        gpt2.decode(np.array([True]))
    with pytest.raises(ValueError, match=r"ids\[0\] must be in \[0, 27\), got 27"):
        Text8Tokenizer().decode(np.array([27]))


def test_gpt2_known_ids_and_round_trip(gpt2):
    assert gpt2.vocab_size == 50257
    assert gpt2.encode("Hello world") == [15496, 995]
    with open(MIXED, encoding="utf-8") as f:
        text = f.read()
    ids = gpt2.encode(text)
    assert gpt2.decode(ids) == text
    assert len(ids) < len(text) / 2  # BPE merges: far fewer tokens than characters


def test_gpt2_refuses_lone_surrogates(gpt2):
    """They are not Unicode text (undecodable bytes read with surrogateescape); tiktoken
    would encode them as U+FFFD."""
    with pytest.raises(ValueError, match="lone surrogate U\\+D800 at position 1"):
        gpt2.encode("a\ud800b")
    assert gpt2.decode(gpt2.encode("a\U0001F600b")) == "a\U0001F600b"  # a surrogate pair in UTF-16 only


def test_gpt2_decodes_a_character_cut_in_two_as_a_replacement(gpt2):
    """ids that end inside a character's UTF-8 bytes (a sample cut short) decode with U+FFFD, not an error."""
    ids = gpt2.encode("a\U0001F600b")
    assert len(ids) == 4 and gpt2.decode(ids[:2]) == "a\ufffd"


def test_gpt2_special_token_text_is_ordinary(gpt2):
    ids = gpt2.encode("a <|endoftext|> b")
    assert 50256 not in ids
    assert gpt2.decode(ids) == "a <|endoftext|> b"


def test_gpt2_rejects_wrong_or_missing_file(tmp_path):
    bad = tmp_path / "gpt2.tiktoken"
    bad.write_bytes(b"IQ== 0\n")
    with pytest.raises(ValueError, match="sha256"):
        GPT2Tokenizer(str(bad))
    with pytest.raises(FileNotFoundError, match="not found"):
        GPT2Tokenizer(str(tmp_path / "missing.tiktoken"))


def test_gpt2_ranks_are_checked_here_and_never_cached(tmp_path, monkeypatch):
    """tiktoken's loader named a wrong file a "corrupted download" and kept a copy of every
    path it read in its file cache ($TMPDIR/data-gym-cache)."""
    import hashlib

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "passwd"
    bad.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    actual = hashlib.sha256(bad.read_bytes()).hexdigest()
    with pytest.raises(ValueError) as info:
        GPT2Tokenizer(str(bad))
    assert str(info.value) == (f"GPT2Tokenizer: path {bad} is not the GPT-2 ranks file: its sha256 is {actual}, "
                               "expected 306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930")
    assert GPT2Tokenizer(TIKTOKEN).encode("hello world") == [31373, 995]
    assert not (tmp_path / "cache").exists()


def test_gpt2_ranks_path_is_made_absolute_and_must_be_a_path(monkeypatch):
    monkeypatch.chdir(os.path.dirname(TIKTOKEN))
    tok = GPT2Tokenizer(os.path.basename(TIKTOKEN))
    assert tok.path == TIKTOKEN and repr(tok) == f"GPT2Tokenizer({TIKTOKEN!r})"
    with pytest.raises(TypeError, match="^GPT2Tokenizer: path must be a file path, got int$"):
        GPT2Tokenizer(3)


def test_a_recorded_gpt2_digest_is_quoted_to_64_characters():
    with pytest.raises(ValueError, match=f"records a GPT-2 ranks file of sha256 {'a' * 64}, not "):
        tokenizer_from_config({"name": "gpt2", "sha256": "a" * 100})


def test_tokenizer_config_round_trip(gpt2):
    assert isinstance(tokenizer_from_config(Text8Tokenizer().to_config()), Text8Tokenizer)
    assert gpt2.to_config() == {"name": "gpt2", "sha256": hashlib.sha256(GPT2_RANKS.read_bytes()).hexdigest()}
    again = tokenizer_from_config(gpt2.to_config())
    assert again.encode("Hello world") == gpt2.encode("Hello world")
    with pytest.raises(ValueError, match="'name' must be"):
        tokenizer_from_config({"name": "bytes"})
    assert tokenizer_from_config({"name": "gpt2"}).path == TIKTOKEN  # the shipped ranks file
    assert tokenizer_from_config({"name": "gpt2", "path": "/moved/gpt2.tiktoken"}).path == TIKTOKEN
    with pytest.raises(ValueError, match="records a GPT-2 ranks file of sha256 deadbeef"):
        tokenizer_from_config({"name": "gpt2", "sha256": "deadbeef"})


def test_load_text_reads_local_files(tmp_path, wiki_text):
    path = tmp_path / "corpus.txt"
    path.write_text("first line\nsecond line\n")
    assert load_text(str(path)) == "first line\nsecond line"  # the final line break only is dropped
    assert load_text(WIKI) == wiki_text.rstrip("\n")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_text(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="dataset name"):
        load_text("hf:")
    for empty in ("", "\n"):  # nothing left once the final line break is dropped
        path.write_text(empty)
        with pytest.raises(CorpusTextError, match=f"data file {path} is empty"):
            load_text(str(path))
    with pytest.raises(IsADirectoryError, match=f"data {tmp_path} is a directory, not a text file"):
        load_text(str(tmp_path))


class _Rows:
    """What datasets.load_dataset returns, as load_text reads it."""

    def __init__(self, column, texts):
        self.column_names, self._texts = [column], texts

    def __getitem__(self, column):
        return self._texts


def test_only_hf_and_a_colon_with_a_name_make_a_hub_source(tmp_path, monkeypatch):
    """A file named hf... is a file (its absolute path); hf: needs a name before its :CONFIG; a non-path is named."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hfcorpus.txt").write_text("abc")
    assert resolve_source("hfcorpus.txt") == str(tmp_path / "hfcorpus.txt")
    assert resolve_source("hf:owner/name:cfg") == "hf:owner/name:cfg"
    with pytest.raises(ValueError, match="needs a dataset name, got 'hf::cfg'"):
        resolve_source("hf::cfg")
    with pytest.raises(TypeError, match="^data source must be a path, a corpus name or 'hf:NAME', got int$"):
        resolve_source(3)


def test_a_path_object_is_resolved_by_its_path_not_its_str(tmp_path, monkeypatch):
    """A pathlib.Path and an os.DirEntry (whose str is no path) both name the file they point at."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.jsonl").write_text('{"text": "abc", "label": 0}\n')
    assert resolve_source(tmp_path / "c.jsonl") == str(tmp_path / "c.jsonl")
    with os.scandir(tmp_path) as entries:
        (entry,) = entries
        assert resolve_source(entry) == str(tmp_path / "c.jsonl") and is_labelled(entry)


def test_a_file_source_is_its_absolute_path_as_named(tmp_path, monkeypatch):
    """Only a leading hf: makes a hub source (a file under a folder may hold hf: in its name), and a
    link is named by its own path, not its target's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "hf:c.txt").write_text("abc")
    assert resolve_source("sub/hf:c.txt") == str(tmp_path / "sub" / "hf:c.txt")
    (tmp_path / "latest.txt").symlink_to(tmp_path / "sub" / "hf:c.txt")
    assert resolve_source("latest.txt") == str(tmp_path / "latest.txt")


def test_a_source_that_names_nothing_lists_the_corpora_that_need_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        resolve_source("missing.txt")
    assert str(info.value) == (
        "no such file: missing.txt (corpora that need no file: books: the text8-format public-domain books "
        "shipped with ddpd (198 k characters); text8: the full text8 (100 M characters), downloaded with "
        "`datasets` from afmck/text8; or hf:NAME[:CONFIG] for a Hugging Face dataset)")


def test_hub_corpora_join_their_rows_and_text8_its_splits_in_order(monkeypatch):
    """No network here: the loader is replaced by one that names what it was asked for."""
    import ddpd.training.data as data

    monkeypatch.setattr(data, "require_extra", lambda *args: None)
    monkeypatch.setattr(data, "_load_dataset_quietly", lambda repo, config, split: _Rows(
        "text", [f"{repo} {config} {split}", "second"]))
    assert load_text("hf:owner/name:cfg") == "owner/name cfg train\nsecond"
    assert load_text("text8") == "".join(f"{data.HUB_TEXT8} None {split}second"
                                         for split in ("train", "validation", "test"))
    monkeypatch.setattr(data, "_load_dataset_quietly", lambda *args, **kwargs: _Rows("content", ["x"]))
    with pytest.raises(ValueError, match=r"'owner/name' has no 'text' column \(columns: \['content'\]\)"):
        load_text("hf:owner/name")
    monkeypatch.setattr(data, "_load_dataset_quietly", lambda *args, **kwargs: _Rows("text", [""]))
    with pytest.raises(ValueError, match="'owner/name' holds no text"):
        load_text("hf:owner/name")


def test_a_hub_failure_is_reported_by_its_first_line(monkeypatch):
    import ddpd.training.data as data

    def fail(*args, **kwargs):
        raise ConnectionError("  offline\n  retry details\n")

    def fail_without_message(*args, **kwargs):
        raise KeyError()

    monkeypatch.setattr(data, "require_extra", lambda *args: None)
    monkeypatch.setattr(data, "_load_dataset_quietly", fail)
    with pytest.raises(ValueError, match=r"^could not load the Hugging Face dataset 'owner/name' \(split train; "
                                         r".*\): offline$"):
        load_text("hf:owner/name")
    monkeypatch.setattr(data, "_load_dataset_quietly", fail_without_message)
    with pytest.raises(ValueError, match=r"\): KeyError$"):  # no message: its type
        load_text("hf:owner/name")


def test_a_file_that_is_not_utf8_names_its_first_bad_byte(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"caf\xe9 au lait")
    with pytest.raises(CorpusTextError, match=re.escape(f"data file {path} is not UTF-8 text (byte 0xe9 at offset 3)")):
        load_text(str(path))


def test_text_a_tokenizer_refuses_is_named_by_its_corpus(tmp_path):
    assert Text8Tokenizer().encode_tensor("").shape == (0,)
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"the cat sat\r\non the mat\r\n")
    with pytest.raises(ValueError, match=re.escape(f"data {path}: text must contain only space and a-z (text8 "
                                                   "format), got '\\r' (U+000D) at position 11")):
        load_splits(str(path), Text8Tokenizer())


def test_without_a_corpus_name_the_tokenizer_names_itself():
    """encode_corpus(text, tokenizer) with no `where` raises the tokenizer's own message."""
    with pytest.raises(ValueError, match=re.escape("Text8Tokenizer.encode: text must contain only space and a-z "
                                                   "(text8 format), got 'T' (U+0054) at position 0")):
        encode_corpus("The cat", Text8Tokenizer())


def test_the_text8_tokenizer_repr_round_trips():
    tok = Text8Tokenizer()
    assert repr(tok) == "Text8Tokenizer()"
    assert eval(repr(tok), {"Text8Tokenizer": Text8Tokenizer}).to_config() == tok.to_config()


def test_a_fingerprint_counts_characters_and_digests_utf8():
    assert fingerprint("caf\u00e9") == {"chars": 4, "sha256": hashlib.sha256("caf\u00e9".encode()).hexdigest()}


def test_a_fingerprint_changes_with_the_last_character():
    """Two texts of one length that differ only at their end have different fingerprints."""
    text = "the cat sat on the mat " * 20
    assert fingerprint(text[:-1] + "x")["sha256"] != fingerprint(text)["sha256"]
    assert fingerprint(text[:-1] + "x")["chars"] == fingerprint(text)["chars"]


def test_a_corpus_read_once_is_split_as_read(tmp_path):
    """Given the text already read (the one fingerprinted), load_splits and load_labelled split
    that text, not the file read a second time."""
    path = tmp_path / "c.txt"
    path.write_text("a" * 40)
    splits = load_splits(str(path), Text8Tokenizer(), text="b" * 40)
    assert torch.cat([splits[name] for name in ("train", "validation", "test")]).tolist() == [2] * 40
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "a", "label": 0}\n')
    records = load_labelled(str(path), Text8Tokenizer(), text='{"text": "b", "label": 1}\n')
    assert (records.tokens.tolist(), records.labels.tolist()) == ([2], [1])


def test_split_by_position(wiki_text):
    tokens = encode_corpus(wiki_text, Text8Tokenizer())
    n = tokens.numel()
    splits = split_tokens(tokens)
    assert [splits[s].numel() for s in ("train", "validation", "test")] == [
        int(0.9 * n), int(0.95 * n) - int(0.9 * n), n - int(0.95 * n)]
    assert torch.equal(torch.cat([splits["train"], splits["validation"], splits["test"]]), tokens)
    loaded = load_splits(WIKI, Text8Tokenizer())
    assert all(torch.equal(loaded[s], splits[s]) for s in splits)


def test_a_split_takes_its_fractions_as_written():
    """Float arithmetic put a boundary one short: 90 * 0.7 is 62.99..., and 0.7 + 0.2 is 0.899..."""
    for n, fractions, sizes in ((90, (0.7, 0.15, 0.15), [63, 13, 14]), (30, (0.7, 0.2, 0.1), [21, 6, 3])):
        splits = split_tokens(torch.arange(n), fractions)
        assert [splits[name].numel() for name in ("train", "validation", "test")] == sizes
        records = Records(torch.arange(n), torch.arange(n), torch.ones(n, dtype=torch.long)).split(fractions)
        assert [records[name].lengths.numel() for name in ("train", "validation", "test")] == sizes


def test_a_split_part_without_records_is_empty_records():
    """One record of one class: 90% and 95% of 1 are 0, so train and validation hold no record
    (empty Records, not an error) and test holds it whole."""
    records = Records(torch.arange(4), torch.tensor([0]), torch.tensor([4]), torch.tensor([3]))
    splits = records.split()
    for name in ("train", "validation"):
        part = splits[name]
        assert part.tokens.shape == (0,) and part.tokens.dtype == torch.long
        assert part.lengths.tolist() == [] and part.labels.tolist() == []
    assert splits["test"].tokens.tolist() == [0, 1, 2, 3] and splits["test"].labels.tolist() == [3]


def test_a_split_takes_fractions_of_four_decimals_exactly():
    """0.9001 is 9001/10000, not a nearby fraction of a small denominator (9/10): 9001 of 10000 tokens."""
    splits = split_tokens(torch.arange(10000), (0.9001, 0.0499, 0.05))
    assert [splits[name].numel() for name in ("train", "validation", "test")] == [9001, 499, 500]


def test_fractions_a_millionth_off_a_sum_of_1_are_refused():
    with pytest.raises(ValueError, match="fractions must be three positive numbers summing to 1"):
        split_tokens(torch.arange(10), (0.9, 0.05, 0.050001))


def test_split_validation():
    for fractions in ((0.5, 0.5, 0.5), (1.0, 0.0, 0.0), (0.25, 0.25, 0.25, 0.25), (0.5, 0.5), (0.9, 0.05, 0.04)):
        with pytest.raises(ValueError, match="fractions must be three positive numbers summing to 1"):
            split_tokens(torch.arange(10), fractions)
    with pytest.raises(ValueError, match="1-D"):
        split_tokens(torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^tokens must be a 1-D tensor, got list \(\)$"):
        split_tokens([1, 2, 3])


def test_an_empty_text_encodes_as_an_empty_long_stream(gpt2):
    """torch.tensor([]) is float32; the empty stream is Long for either tokenizer."""
    for tok in (Text8Tokenizer(), gpt2):
        tokens = encode_corpus("", tok)
        assert tokens.shape == (0,) and tokens.dtype == torch.long


def test_bpe_corpus_splits(gpt2):
    splits = load_splits(WIKI, gpt2)
    total = sum(s.numel() for s in splits.values())
    assert abs(splits["validation"].numel() / total - 0.05) < 1e-3
    assert int(splits["train"].max()) < gpt2.vocab_size


def test_chunk():
    chunks = chunk(torch.arange(10), 3)
    assert torch.equal(chunks, torch.arange(9).view(3, 3))
    with pytest.raises(ValueError, match="seq_len"):
        chunk(torch.arange(10), 0)


def test_random_crops_are_contiguous_and_reproducible():
    tokens = torch.arange(1000)
    crops = RandomCrops(tokens, seq_len=16, batch_size=8, seed=3)
    batches = [next(crops) for _ in range(5)]
    for batch in batches:
        assert batch.shape == (8, 16)
        assert torch.equal(batch - batch[:, :1], torch.arange(16).expand(8, 16))
    again = RandomCrops(tokens, seq_len=16, batch_size=8, seed=3)
    assert all(torch.equal(a, next(again)) for a in batches)
    other = RandomCrops(tokens, seq_len=16, batch_size=8, seed=4)
    assert not torch.equal(next(other), batches[0])
    assert iter(crops) is crops  # a for loop over it draws the same batches


@pytest.mark.parametrize("tokens, got", [(torch.zeros(2, 50, dtype=torch.long), r"shape \(2, 50\)"),
                                         (list(range(50)), "list")])
def test_random_crops_name_what_they_refuse(tokens, got):
    """A 2-D tensor was refused as "got Tensor", which named no fault."""
    with pytest.raises(ValueError, match=f"tokens must be a 1-D tensor or Records, got {got}$"):
        RandomCrops(tokens, seq_len=8, batch_size=2, seed=0)


def test_random_crops_resume_from_state():
    tokens = torch.arange(500)
    crops = RandomCrops(tokens, seq_len=10, batch_size=4, seed=0)
    for _ in range(3):
        next(crops)
    state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in crops.state_dict().items()}
    expected = [next(crops) for _ in range(4)]
    restored = RandomCrops(tokens, seq_len=10, batch_size=4, seed=123)
    restored.load_state_dict(state)
    assert restored.batches == 3
    assert all(torch.equal(e, next(restored)) for e in expected)


def test_random_crop_offsets_are_uniform():
    """Chi-square of 40,000 crop offsets over the 41 possible starts; a correct
    sampler fails with probability 1e-4 (the threshold)."""
    tokens = torch.arange(50)
    crops = RandomCrops(tokens, seq_len=10, batch_size=4000, seed=1)
    starts = torch.cat([next(crops)[:, 0] for _ in range(10)])
    counts = torch.bincount(starts, minlength=41)
    assert counts.numel() == 41  # no start beyond N - seq_len
    assert chisquare(counts.numpy()).pvalue > 1e-4


def test_random_crops_validation():
    with pytest.raises(ValueError, match="seq_len must be <="):
        RandomCrops(torch.arange(5), seq_len=6, batch_size=1, seed=0)
    with pytest.raises(TypeError, match="batch_size"):
        RandomCrops(torch.arange(5), seq_len=2, batch_size=2.0, seed=0)


def test_random_crops_take_a_window_as_long_as_a_record():
    """seq_len equal to the corpus's length is one window, at offset 0; no record at all is refused by name."""
    crops = RandomCrops(torch.arange(5), seq_len=5, batch_size=3, seed=0)
    assert torch.equal(next(crops), torch.arange(5).expand(3, 5))
    empty = Records(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                    torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^seq_len must be <= the number of tokens of a record \(0\), got 3$"):
        RandomCrops(empty, seq_len=3, batch_size=1, seed=0)


def test_evaluation_batches_are_fixed_chunks():
    tokens = torch.arange(1000)
    batches = evaluation_batches(tokens, seq_len=10, batch_size=8, max_batches=3)
    assert len(batches) == 3 and all(b.shape == (8, 10) and b.dtype == torch.long for b in batches)
    rows = torch.cat(batches)
    assert torch.equal(rows % 10, torch.arange(10).expand(24, 10))  # aligned chunks
    assert rows[0, 0] == 0 and rows[-1, 0] == 990  # spread over the whole split
    assert all(torch.equal(a, b) for a, b in zip(batches, evaluation_batches(tokens, 10, 8, 3)))
    assert sum(b.shape[0] for b in evaluation_batches(tokens, 10, 8, 100)) == 100


def test_evaluation_batches_validation():
    """seq_len 0 was torch's 'RuntimeError: ZeroDivisionError', a negative one a bad range."""
    for seq_len in (0, -2):
        with pytest.raises(ValueError, match=f"seq_len must be >= 1, got {seq_len}"):
            evaluation_batches(torch.arange(10), seq_len, 2, 2)
    with pytest.raises(TypeError, match="seq_len must be an int"):
        evaluation_batches(torch.arange(10), 2.0, 2, 2)
    with pytest.raises(ValueError, match="max_batches must be >= 1, got 0"):  # not an empty evaluation set
        evaluation_batches(torch.arange(10), 2, 2, 0)
    with pytest.raises(ValueError, match=r"seq_len must be <= the number of evaluation tokens of a record \(10\)"):
        evaluation_batches(torch.arange(10), 11, 2, 2)


def test_batch_sizes_take_numpy_integers():
    """seq_len, batch_size and max_batches computed with numpy were refused as "not an int"."""
    tokens = torch.arange(100)
    seq_len, batch_size = np.int64(10), np.int32(4)
    assert torch.equal(chunk(tokens, seq_len), chunk(tokens, 10))
    crops = RandomCrops(tokens, seq_len, batch_size, seed=3)
    assert type(crops.seq_len) is int and type(crops.batch_size) is int
    assert torch.equal(next(crops), next(RandomCrops(tokens, 10, 4, seed=3)))
    batches = evaluation_batches(tokens, seq_len, batch_size, np.uint8(2))
    assert torch.equal(torch.cat(batches), torch.cat(evaluation_batches(tokens, 10, 4, 2)))
    for bad in (np.float64(10.0), np.bool_(True), True):
        with pytest.raises(TypeError, match="seq_len must be an int"):
            chunk(tokens, bad)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        RandomCrops(tokens, 10, np.int64(0), seed=0)


# ---------------------------------------------------------------- labelled corpora


def _labelled(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_labelled_corpus_records_and_their_split_by_class(tmp_path):
    # 20 records of class 0, then 20 of class 1: a split by position over all records would
    # leave class 0 out of validation and test
    records = [{"text": "ab" * (i + 5), "label": 0} for i in range(20)]
    records += [{"text": "xyz " * (i + 3), "label": 1} for i in range(20)]
    path = _labelled(tmp_path / "c.jsonl", records)
    assert is_labelled(path) and not is_labelled(tmp_path / "c.txt")  # a str or an os.PathLike
    corpus = load_labelled(path, Text8Tokenizer())
    assert corpus.labels.tolist() == [0] * 20 + [1] * 20
    for r in (0, 7, 39):
        piece = corpus.tokens[corpus.starts[r]:corpus.starts[r] + corpus.lengths[r]]
        assert Text8Tokenizer().decode(piece) == records[r]["text"]
    splits = corpus.split()
    assert [splits[name].labels.tolist() for name in ("train", "validation", "test")] == \
        [[0] * 18 + [1] * 18, [0, 1], [0, 1]]
    assert Text8Tokenizer().decode(splits["validation"].tokens[:splits["validation"].lengths[0]]) == \
        records[18]["text"]  # within a class, by position
    with pytest.raises(ValueError, match="labelled corpus"):
        load_splits(path, Text8Tokenizer())


def test_a_split_keeps_whole_records_in_corpus_order(tmp_path):
    """Classes interleaved: each split holds its records whole, in the corpus's order; a line
    of only whitespace is no record."""
    records = [{"text": "b" * (i + 1), "label": i % 2} for i in range(40)]
    lines = [json.dumps(r) for r in records]
    (tmp_path / "c.jsonl").write_text("\n".join(lines[:5] + [" \t "] + lines[5:]) + "\n")
    splits = load_labelled(str(tmp_path / "c.jsonl"), Text8Tokenizer()).split()
    for name, picked in (("train", range(36)), ("validation", [36, 37]), ("test", [38, 39])):
        part = splits[name]
        texts = [Text8Tokenizer().decode(part.tokens[b:b + n]) for b, n in zip(part.starts.tolist(),
                                                                               part.lengths.tolist())]
        assert texts == [records[i]["text"] for i in picked]
        assert part.labels.tolist() == [i % 2 for i in picked]


@pytest.mark.parametrize("line,message", [
    ('{"text": "ab", "label": 0', "line 2: not JSON"), ('["ab", 0]', "line 2: expected an object"),
    ('{"label": 0}', "line 2: expected an object"), ('{"text": 5, "label": 0}', "line 2: expected an object"),
    ('{"text": "ab", "label": -1}', "line 2: 'label' must be"),
    ('{"text": "ab", "label": true}', "'label' must be an int"), ('{"text": "ab"}', "'label' must be an int"),
    ('{"text": "Ab", "label": 0}', "line 2: text must contain only space and a-z"),
    ('{"text": "", "label": 0}', "line 2: 'text' is empty"),
    ('{"text": "ab", "label": 100000000000000000000}', "line 2: 'label' must be an int in [0, 2**63)"),
    ('{"text": "ab", "label": "0"}', "line 2: 'label' must be an int in [0, 2**63) (a class id), got '0'"),
    ('{"text": "ab", "label": ' + "9" * 5000 + "}", "line 2: not JSON (Exceeds the limit"),
    ("[" * 50000 + "]" * 50000, "line 2: not JSON (nested too deeply)"),
    ('{"text": "ab", "label": 0, "label": 1}', "line 2: not JSON (the key 'label' appears more than once)"),
])
def test_labelled_corpus_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine", "label": 1}\n' + line + "\n")
    with pytest.raises(CorpusTextError, match=re.escape(message)):  # a bad input, as text that is not UTF-8
        load_labelled(str(path), Text8Tokenizer())
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(CorpusTextError, match="holds no record"):
        load_labelled(str(tmp_path / "empty.jsonl"), Text8Tokenizer())


def test_a_label_reaches_the_largest_int64_and_long_values_are_cut_in_the_message(tmp_path):
    """2**63 - 1 is a class id (a Long label), 2**63 is not; a long label or line is quoted in part."""
    path = _labelled(tmp_path / "c.jsonl", [{"text": "ab", "label": 2**63 - 1}])
    assert load_labelled(path, Text8Tokenizer()).labels.tolist() == [2**63 - 1]
    for line, message in ((json.dumps({"text": "ab", "label": 2**63}), f"got {2**63}$"),
                          (json.dumps({"text": "ab", "label": "x" * 100}), "got '" + "x" * 39 + "$"),
                          (json.dumps(["y" * 100]), "got '" + re.escape('["' + "y" * 58) + "'$")):
        (tmp_path / "bad.jsonl").write_text(line + "\n")
        with pytest.raises(CorpusTextError, match="line 1: .*" + message):
            load_labelled(str(tmp_path / "bad.jsonl"), Text8Tokenizer())


def test_a_labelled_corpus_breaks_lines_at_line_feeds_only(tmp_path, gpt2):
    """A record's text may hold U+2028 (a line separator to str.splitlines) as JSON writes it raw."""
    text = "one\u2028two\x1cthree"
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": text, "label": 2}, ensure_ascii=False) + "\n",
                                      encoding="utf-8")
    records = load_labelled(str(tmp_path / "c.jsonl"), gpt2)
    assert gpt2.decode(records.tokens) == text and records.labels.tolist() == [2]


def test_a_labelled_corpus_skips_a_byte_order_mark(tmp_path):
    """A .jsonl saved with a byte-order mark (Notepad's "UTF-8 with BOM") was refused: "line 1:
    not JSON (Unexpected UTF-8 BOM (decode using utf-8-sig) ...)", a hint for Python code, not
    for a user of ddpd-train. It reads as the file without it (as ddpd-sample --prompts does)."""
    lines = '{"text": "ab cd", "label": 0}\n{"text": "ef", "label": 1}\n'
    (tmp_path / "plain.jsonl").write_text(lines)
    (tmp_path / "bom.jsonl").write_text("\ufeff" + lines)
    plain, bom = (load_labelled(str(tmp_path / name), Text8Tokenizer()) for name in ("plain.jsonl", "bom.jsonl"))
    for field in ("tokens", "starts", "lengths", "labels"):
        assert torch.equal(getattr(bom, field), getattr(plain, field)), field
    (tmp_path / "two.jsonl").write_text("\ufeff\ufeff" + lines)  # one mark only is skipped
    with pytest.raises(CorpusTextError, match="line 1: not JSON"):
        load_labelled(str(tmp_path / "two.jsonl"), Text8Tokenizer())


def test_a_stream_is_one_record_of_long_fields():
    stream = Records.stream(torch.arange(7))
    for field, value in (("starts", [0]), ("lengths", [7])):
        assert getattr(stream, field).dtype == torch.long and getattr(stream, field).tolist() == value
    assert stream.labels is None


def test_crops_of_a_stream_are_those_of_one_record():
    """A plain stream is one record: the same crops as drawing offsets in [0, N - L] directly."""
    tokens = torch.arange(300)
    crops = RandomCrops(tokens, seq_len=10, batch_size=16, seed=7)
    generator = torch.Generator().manual_seed(7)
    for _ in range(3):
        starts = torch.randint(0, 291, (16,), generator=generator)
        assert torch.equal(next(crops), starts[:, None] + torch.arange(10))


def test_crops_of_records_stay_within_one_record_uniformly_and_carry_its_label():
    """Records of 12, 5 (too short) and 20 tokens, seq_len 10: 3 + 0 + 11 windows, each drawn
    with probability 1/14 (chi-square over 28,000 draws, threshold 1e-4)."""
    lengths = torch.tensor([12, 5, 20])
    starts = torch.cumsum(lengths, 0) - lengths
    records = Records(torch.arange(37), starts, lengths, torch.tensor([4, 5, 6]))
    crops = RandomCrops(records, seq_len=10, batch_size=4000, seed=2)
    firsts, labels = [], []
    for _ in range(7):
        x, y = next(crops)
        assert torch.equal(x - x[:, :1], torch.arange(10).expand(4000, 10))
        assert x.dtype == y.dtype == torch.long
        firsts.append(x[:, 0])
        labels.append(y)
    first, label = torch.cat(firsts), torch.cat(labels)
    windows = list(range(0, 3)) + list(range(17, 28))
    assert set(first.tolist()) == set(windows)
    assert torch.equal(label, torch.where(first < 12, 4, 6))
    counts = torch.bincount(first, minlength=28)[windows]
    assert chisquare(counts.numpy()).pvalue > 1e-4
    with pytest.raises(ValueError, match="seq_len must be <= the number of tokens of a record \\(20\\)"):
        RandomCrops(records, seq_len=21, batch_size=1, seed=0)


def test_evaluation_batches_of_records_carry_their_labels():
    lengths = torch.tensor([25, 9, 30])
    starts = torch.cumsum(lengths, 0) - lengths
    records = Records(torch.arange(64), starts, lengths, torch.tensor([0, 1, 2]))
    batches = evaluation_batches(records, seq_len=10, batch_size=3, max_batches=5)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert x[:, 0].tolist() == [0, 10, 34, 44, 54] and y.tolist() == [0, 0, 2, 2, 2]
    unlabelled = Records(records.tokens, starts, lengths)
    assert torch.equal(torch.cat(evaluation_batches(unlabelled, 10, 3, 5)), x)


def test_evaluation_chunks_picked_across_records_carry_their_own_labels():
    """Records of 20, 30 and 10 tokens hold 2 + 3 + 1 chunks of 10; the 3 picked, chunks 0, 2
    and 5, carry the labels of the records they lie in."""
    lengths = torch.tensor([20, 30, 10])
    records = Records(torch.arange(60), torch.cumsum(lengths, 0) - lengths, lengths, torch.tensor([7, 8, 9]))
    (x, y), = evaluation_batches(records, seq_len=10, batch_size=3, max_batches=1)
    assert x[:, 0].tolist() == [0, 20, 50] and y.tolist() == [7, 8, 9]


def test_evenly_spaced_picks_are_exact_at_any_size():
    """round(i (n - 1) / (k - 1)), ties to even, from first to last, strictly increasing: a float32
    linspace gave index n for n = 2**24 + 4 (held-out chunks: IndexError) and repeats beyond."""
    def exact(n, k):
        return [0] if k == 1 else [round(Fraction(i * (n - 1), k - 1)) for i in range(k)]

    for n in range(1, 60):
        for k in range(1, n + 1):
            assert evenly_spaced(n, k).tolist() == exact(n, k), (n, k)
    for n, k in ((2**24 + 4, 2), (2**24 + 4, 7), (2**31 + 11, 1001)):
        picks = evenly_spaced(n, k)
        assert picks.tolist() == exact(n, k) and picks.dtype == torch.long
        assert int(picks[-1]) == n - 1 and bool((picks.diff() > 0).all())


def test_a_recorded_source_is_a_corpus_name_only_when_it_is_one(tmp_path, monkeypatch):
    """recorded=True keeps a corpus name as that corpus; any other source is still a file: its
    absolute path, or FileNotFoundError when there is none."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.txt").write_text("abc")
    assert resolve_source("c.txt", recorded=True) == str(tmp_path / "c.txt")
    with pytest.raises(FileNotFoundError, match="^no such file: missing.txt "):
        resolve_source("missing.txt", recorded=True)


def test_only_a_name_ending_in_dot_jsonl_is_a_labelled_corpus():
    assert is_labelled("c.jsonl") and not is_labelled("c_jsonl") and not is_labelled("c.json")


def test_a_bytes_source_is_refused_naming_its_type():
    with pytest.raises(TypeError, match="^data source must be a path, a corpus name or 'hf:NAME', got bytes$"):
        resolve_source(b"books")
