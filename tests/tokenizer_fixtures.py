"""Small Hugging Face-style tokenizer directories, built offline for tests.

  write_qwen2_tokenizer(dir)   byte-level BPE tokenizer.json laid out like Qwen2.5-Instruct's:
                               specials <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos) after
                               the learned vocabulary, no BOS, Qwen2's chat template.
  write_llama3_tokenizer(dir)  byte-level BPE tokenizer.json like Llama 3.1-Instruct's: a
                               post-processor that adds <|begin_of_text|>, no pad token, EOS
                               <|eot_id|>, generation_config.json with two EOS ids.
  write_llama2_spm_tokenizer(dir)  a SentencePiece tokenizer.model only (Llama 2 / Mistral):
                               <unk>=0, <s>=1, </s>=2, byte fallback, Llama 2's chat template.
"""
import io
import json
import os

CORPUS = [
    'Natalia sold clips to 48 of her friends in April, and then she sold half as many clips '
    'in May. How many clips did Natalia sell altogether in April and May?',
    'Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether.\n#### 72',
    'Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. '
    'How much did she earn?',
    'Please reason step by step, and put your final answer within \\boxed{}.',
    'The answer is \\boxed{1,234}. So the total is -3.50 dollars, or 0.5 of it.',
    'You are a helpful assistant. Be brief. System user assistant',
]

QWEN2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant') %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")

LLAMA3_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- if strftime_now is defined %}{%- set date_string = strftime_now('%d %b %Y') %}\n"
    "    {%- else %}{%- set date_string = '26 Jul 2024' %}{%- endif %}\n"
    "{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = '' %}\n"
    "{%- endif %}\n"
    "{%- if tools is not none %}{{- raise_exception('no tools in this test') }}{%- endif %}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}\n"
    "{{- 'Today Date: ' + date_string + '\\n\\n' }}\n"
    "{{- system_message }}\n"
    "{{- '<|eot_id|>' }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n")

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")

# Qwen2's pre-tokenizer split pattern (from its tokenizer.json).
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level_bpe(specials: list[str], vocab_size: int, bos_processor: str | None = None):
  """A byte-level BPE tokenizer trained on CORPUS, specials appended after its vocabulary."""
  from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                          pre_tokenizers, processors, trainers)
  tok = Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior='isolated', invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(CORPUS * 3, trainer)
  tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
  if bos_processor:
    bos_id = tok.token_to_id(bos_processor)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f'{bos_processor} $A',
                                      pair=f'{bos_processor} $A {bos_processor} $B',
                                      special_tokens=[(bos_processor, bos_id)])])
  else:
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
  return tok


def _added_tokens_decoder(tok, specials: list[str]) -> dict:
  return {str(tok.token_to_id(s)): {'content': s, 'lstrip': False, 'normalized': False,
                                    'rstrip': False, 'single_word': False, 'special': True}
          for s in specials}


def _write_json(directory: str, name: str, value: dict) -> None:
  with open(os.path.join(directory, name), 'w', encoding='utf-8') as f:
    json.dump(value, f, indent=2)


def write_qwen2_tokenizer(directory: str) -> str:
  """Qwen2.5-Instruct-style tokenizer files in `directory`; returns it."""
  os.makedirs(directory, exist_ok=True)
  specials = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
  tok = _byte_level_bpe(specials, vocab_size=420)
  tok.save(os.path.join(directory, 'tokenizer.json'))
  _write_json(directory, 'tokenizer_config.json', {
      'add_bos_token': False, 'add_prefix_space': False,
      'added_tokens_decoder': _added_tokens_decoder(tok, specials),
      'additional_special_tokens': ['<|im_start|>', '<|im_end|>'],
      'bos_token': None, 'chat_template': QWEN2_TEMPLATE, 'clean_up_tokenization_spaces': False,
      'eos_token': '<|im_end|>', 'errors': 'replace', 'model_max_length': 32768,
      'pad_token': '<|endoftext|>', 'split_special_tokens': False,
      'tokenizer_class': 'Qwen2Tokenizer', 'unk_token': None})
  _write_json(directory, 'generation_config.json', {
      'bos_token_id': tok.token_to_id('<|endoftext|>'),
      'eos_token_id': [tok.token_to_id('<|im_end|>'), tok.token_to_id('<|endoftext|>')],
      'pad_token_id': tok.token_to_id('<|endoftext|>')})
  return directory


def write_llama3_tokenizer(directory: str) -> str:
  """Llama 3.1-Instruct-style tokenizer files in `directory`; returns it."""
  os.makedirs(directory, exist_ok=True)
  specials = ['<|begin_of_text|>', '<|end_of_text|>', '<|start_header_id|>',
              '<|end_header_id|>', '<|eot_id|>']
  tok = _byte_level_bpe(specials, vocab_size=420, bos_processor='<|begin_of_text|>')
  tok.save(os.path.join(directory, 'tokenizer.json'))
  _write_json(directory, 'tokenizer_config.json', {
      'added_tokens_decoder': _added_tokens_decoder(tok, specials),
      'bos_token': '<|begin_of_text|>', 'chat_template': LLAMA3_TEMPLATE,
      'clean_up_tokenization_spaces': False, 'eos_token': '<|eot_id|>',
      'model_input_names': ['input_ids', 'attention_mask'], 'model_max_length': 131072,
      'tokenizer_class': 'PreTrainedTokenizerFast'})
  _write_json(directory, 'generation_config.json', {
      'bos_token_id': tok.token_to_id('<|begin_of_text|>'),
      'eos_token_id': [tok.token_to_id('<|end_of_text|>'), tok.token_to_id('<|eot_id|>')]})
  return directory


def write_llama2_spm_tokenizer(directory: str) -> str:
  """Llama 2-style SentencePiece files (no tokenizer.json) in `directory`; returns it."""
  import sentencepiece as spm
  os.makedirs(directory, exist_ok=True)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(CORPUS * 3), model_writer=model, model_type='bpe', vocab_size=420,
      byte_fallback=True, split_digits=True, pad_id=-1, unk_id=0, bos_id=1, eos_id=2,
      add_dummy_prefix=True, normalization_rule_name='identity', remove_extra_whitespaces=False,
      num_threads=1, minloglevel=2, character_coverage=1.0, hard_vocab_limit=False)
  with open(os.path.join(directory, 'tokenizer.model'), 'wb') as f:
    f.write(model.getvalue())
  _write_json(directory, 'tokenizer_config.json', {
      'add_bos_token': True, 'add_eos_token': False,
      'bos_token': {'__type': 'AddedToken', 'content': '<s>', 'lstrip': False,
                    'normalized': False, 'rstrip': False, 'single_word': False},
      'eos_token': '</s>', 'unk_token': '<unk>', 'pad_token': None, 'legacy': False,
      'clean_up_tokenization_spaces': False, 'tokenizer_class': 'LlamaTokenizer',
      'chat_template': LLAMA2_TEMPLATE, 'model_max_length': 4096})
  return directory
