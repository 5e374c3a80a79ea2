"""Data shipped inside the package, so the quickstart, the docs and the tests need no
file from elsewhere (sources and licences: NOTICE.md beside this file).

- `BOOKS` (`books.txt`, 197,991 characters): a text8-format corpus (space and a-z,
  one line) of public-domain prose: the openings of Jane Austen's "Sense and
  Sensibility", of the King James Bible (Genesis) and of Herman Melville's "Moby
  Dick", about 66,000 characters each. `ddpd-train --data books` trains on it.
- `GPT2_RANKS` (`gpt2.tiktoken`): the GPT-2 BPE ranks (r50k_base, 50,257 tokens),
  MIT-licensed, used by `--tokenizer gpt2` unless `--tiktoken` names another copy.
"""
from pathlib import Path

ASSETS = Path(__file__).resolve().parent
BOOKS = ASSETS / "books.txt"
GPT2_RANKS = ASSETS / "gpt2.tiktoken"
