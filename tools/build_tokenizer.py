r"""Rebuilds the arithmetic SentencePiece tokenizer shipped in rft_jax/assets.

  python -m tools.build_tokenizer [--out_prefix rft_jax/assets/arith_spm]

Trains on ``rft_jax.data.arith.make_corpus()`` (every distinct prompt and
answer string of the 'base' config). Deterministic: rerunning writes the same
bytes. The corpus has 18 distinct symbols (4 specials, 10 digits, ``+-*=``)
and digits are split, so no multi-character pieces exist and the vocabulary
is exactly 18, the built-in model's ``vocab_size`` (configs/common.py
``tiny_model``). Also writes a
human-readable ``<prefix>.vocab`` (``piece<TAB>id`` per line).
"""

import os

from rft_jax import tokenizer as tok_lib
from rft_jax.data import arith
from tools import cli

VOCAB_SIZE = 18
MAX_VOCAB_SIZE = 32  # An upper bound only: the built-in model has VOCAB_SIZE embedding rows.
DEFAULT_PREFIX = os.path.join(tok_lib.ASSETS_DIR, 'arith_spm')


def build(out_prefix: str = DEFAULT_PREFIX,
          vocab_size: int = VOCAB_SIZE) -> str:
  """Trains the tokenizer to ``out_prefix.model`` (+ ``.vocab``).

  Returns:
    The path of the ``.model`` file.
  """
  if vocab_size > MAX_VOCAB_SIZE:
    raise ValueError(f'vocab_size {vocab_size} > {MAX_VOCAB_SIZE}')
  path = tok_lib.train_sentencepiece(arith.make_corpus(), out_prefix,
                                     vocab_size)
  tok = tok_lib.SentencePieceTokenizer(path)
  with open(out_prefix + '.vocab', 'w', encoding='utf-8') as f:
    for i in range(tok.vocab_size):
      f.write(f'{tok.id_to_piece(i)}\t{i}\n')
  return path


def main() -> None:
  parser = cli.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out_prefix', default=DEFAULT_PREFIX)
  parser.add_argument('--vocab_size', type=int, default=VOCAB_SIZE)
  args = parser.parse_args()
  path = build(args.out_prefix, args.vocab_size)
  tok = tok_lib.SentencePieceTokenizer(path)
  pieces = [tok.id_to_piece(i) for i in range(tok.vocab_size)]
  print(f'wrote {path} (vocab_size={tok.vocab_size}): {pieces}')


if __name__ == '__main__':
  main()
