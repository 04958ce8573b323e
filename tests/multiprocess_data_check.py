"""Run by tests/test_data.py as two jax.distributed CPU processes: each reads only its rows of
every prompt batch, GlobalBatches gathers them, and the data position saved is the
one-process position (so a checkpoint resumes on any number of processes)."""
import json
import sys


def main(process_id: int, port: int) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=f'localhost:{port}', num_processes=2,
                             process_id=process_id)
  from rft_jax import tokenizer  # pylint: disable=g-import-not-at-top
  from rft_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  from rft_jax.parallel import hostdata  # pylint: disable=g-import-not-at-top
  tok = tokenizer.load_tokenizer()
  source = [{'id': i, 'prompt': f'{i}+{i % 7}=', 'answer': 'é' * (i % 3) + str(i)}
            for i in range(40)]
  make = lambda: hostdata.GlobalBatches(pipeline.prompt_batches(
      source, tok, max_prompt_len=12, batch_size=4, seed=3, shard_index=process_id,
      shard_count=2))
  it = make()
  batches = [next(it) for _ in range(3)]
  state = it.get_state()
  resumed = make()
  resumed.set_state({'next_index': 16})   # a one-process run's position after 2 batches of 8
  after = next(resumed)
  print('RESULT ' + json.dumps({
      'ids': [b['id'].tolist() for b in batches], 'answers': [b['answer'].tolist()
                                                               for b in batches],
      'tokens': [b['prompt_tokens'].tolist() for b in batches],
      'dtypes': [str(batches[0][k].dtype) for k in ('id', 'prompt_tokens')],
      'state': state, 'after_resume': after['id'].tolist()}), flush=True)


if __name__ == '__main__':
  main(int(sys.argv[1]), int(sys.argv[2]))
