"""Host-side conversion of sampled token ids back to text."""
import numpy as np


def decode_completions(tokenizer, tokens_bt, mask_bt) -> list[str]:
  """Completion text of each row: the masked tokens, EOS (and the tokenizer's other stop ids)
  excluded, decoded by the tokenizer."""
  tokens_bt, mask_bt = np.asarray(tokens_bt), np.asarray(mask_bt)
  stops = {tokenizer.eos_id, *getattr(tokenizer, 'stop_ids', ())}
  out = []
  for row, keep in zip(tokens_bt, mask_bt):
    ids = [int(t) for t, k in zip(row, keep) if k and t not in stops]
    out.append(tokenizer.decode(ids))
  return out
