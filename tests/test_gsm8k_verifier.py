r"""The GSM8K verifiers on completions written like real model outputs, with hand-set scores."""
import pickle

import pytest

from rft_jax.rewards import gsm8k, verifiers
from rft_jax.rewards.runner import RewardRunner

NATALIA_REF = ('Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n'
               'Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72')

# (completion, reference answer, gsm8k score, gsm8k_format score)
CASES = [
    # The GSM8K solution format.
    ('Natalia sold 24 clips in May, so 48 + 24 = 72.\n#### 72', '72', 1.0, 1.0),
    ('She sold 48 + 24 = 72 clips.\n#### 72', NATALIA_REF, 1.0, 1.0),
    ('The total cost is 1,000 + 234 = 1,234 dollars.\n#### 1,234', '1234', 1.0, 1.0),
    ('#### 1234', '1,234', 1.0, 1.0),
    ('She has 5 - 8 = -3 apples left.\n#### -3', '-3', 1.0, 1.0),
    ('#### 3', '-3', 0.0, 1.0),                                # sign matters
    ('#### $42.', '42', 1.0, 1.0),                              # dollar sign, trailing period
    ('#### 0.50', '.5', 1.0, 1.0),                              # decimals compare as numbers
    ('#### .5', '0.5', 1.0, 1.0),
    ('#### 72.00', '72', 1.0, 1.0),
    ('#### 71.9', '72', 0.0, 1.0),
    ('####72', '72', 1.0, 1.0),                                 # no space after ####
    ('#### 72 clips\n\nI hope this helps! Let me know if you have 3 more questions.', '72', 1.0,
     1.0),                                                      # text after the answer
    ('First guess: #### 70. Wait, 48 + 24 = 72.\n#### 72', '72', 1.0, 1.0),   # last #### wins
    ('#### 50%', '50', 1.0, 1.0),                               # percent sign dropped
    # \boxed{} answers (what Qwen2.5-Instruct writes when asked to box its answer).
    ('48 + 24 = 72, so the answer is $\\boxed{72}$.', '72', 1.0, 1.0),
    ('The answer is \\boxed{1,234}.', '1234', 1.0, 1.0),        # commas inside \boxed
    ('The answer is \\boxed{\\$18}.', '18', 1.0, 1.0),          # LaTeX dollar
    ('So she earned \\boxed{18 \\text{ dollars}}.', '18', 1.0, 1.0),
    ('\\boxed{\\frac{1}{2}}', '0.5', 1.0, 1.0),                 # \frac evaluates exactly
    ('\\boxed{\\dfrac{3}{4}} of the pie', '.75', 1.0, 1.0),
    ('\\boxed{\\frac{1}{2}}', '2', 0.0, 1.0),
    ('\\boxed{-3}', '-3', 1.0, 1.0),
    ('Maybe \\boxed{70}. Rechecking: 48 + 24 = 72, so \\boxed{72}.', '72', 1.0, 1.0),
    ('\\boxed{\\boxed{72}}', '72', 1.0, 1.0),                   # nested braces balance
    ('\\boxed{50\\%}', '50', 1.0, 1.0),
    ('#### Step 1: May sales\n48 / 2 = 24\n#### Step 2: total\n\\boxed{72}', '72', 1.0, 1.0),
    ('\\boxed{72}\n#### 70', '72', 0.0, 1.0),                   # whichever marker is last
    # No explicit marker: the last number in the text.
    ('Natalia sold 48 clips in April and 24 in May, so 72 in total.', '72', 1.0, 0.0),
    ('In April she sold 72 clips... no wait, 48 in April and 24 in May.', '72', 0.0, 0.0),
    ('The answer is $42.', '42', 1.0, 0.0),
    ('It costs $1,234.50 in total.', '1234.5', 1.0, 0.0),
    ('The temperature drops to −3 degrees.', '-3', 1.0, 0.0),   # Unicode minus
    ('From 2015-2020 it grew.', '-2020', 0.0, 0.0),             # a hyphen after digits: no sign
    ('\\boxed{x + 1}, where x = 71 so 72', '72', 0.0, 1.0),     # a box is read by its 1st number
    ('\\boxed{y}, so 72 it is', '72', 1.0, 0.0),                # a box without one: last number
    ('3,4', '34', 0.0, 0.0),                                    # not a thousands group
    # Markdown headings are not answer markers (they read as `#### 2` and earned the format).
    ('#### Step 1: May sales\n48 / 2 = 24\n#### Step 2: total\nSo she sold 72 clips in total.',
     '72', 1.0, 0.0),
    ('I think about it.\n#### Step 1\nNo answer here.', '1', 1.0, 0.0),  # last number, no format
    ('#### **72**', '72', 1.0, 1.0),
    ('#### $\\boxed{72}$', '72', 1.0, 1.0),
    # LaTeX spellings of a number.
    ('\\boxed{\\text{72}} (from 48+24)', '72', 1.0, 1.0),     # \text{} is its content
    ('\\boxed{\\textbf{72}}', '72', 1.0, 1.0),
    ('\\boxed{\\text{18 dollars}} \\text{ and } 20', '18', 1.0, 1.0),
    ('\\boxed{1\\,000} dollars total over 12 months', '1000', 1.0, 1.0),   # thousands
    ('\\boxed{1{,}000}', '1000', 1.0, 1.0),
    ('#### 1{,}000', '1000', 1.0, 1.0),
    ('\\boxed{1\\ 000}', '1000', 1.0, 1.0),
    ('\\boxed{7\\!2}', '72', 1.0, 1.0),
    ('\\boxed{-\\$3}', '-3', 1.0, 1.0),                         # the sign before \$
    ('\\boxed{-\\$3}', '3', 0.0, 1.0),
    ('\\boxed{-\\frac{1}{2}}', '-0.5', 1.0, 1.0),               # and before \frac
    ('\\boxed{-\\frac{1}{2}}', '0.5', 0.0, 1.0),
    # A calculation after the marker: its result (after the last `=`), unless the left side
    # is the lone answer.
    ('#### 48+24=72', '72', 1.0, 1.0),
    ('#### 48 + 24 = 72 clips', '48', 0.0, 1.0),
    ('#### $18 \\times 2 = \\$36', '36', 1.0, 1.0),
    ('#### 1,000 + 200 = 1,200', '1200', 1.0, 1.0),
    ('#### 5 = 2+3', '5', 1.0, 1.0),
    ('#### 72\n5 = 3 + 2', '72', 1.0, 1.0),                   # only the marker's own line
    # Mixed numbers in a box; a spaced minus that starts the answer is its sign.
    ('\\boxed{2\\frac{1}{2}}', '2.5', 1.0, 1.0),
    ('\\boxed{2 \\frac{1}{2}}', '0.5', 0.0, 1.0),
    ('\\boxed{-2\\frac{1}{2}}', '-2.5', 1.0, 1.0),
    ('\\boxed{x = \\frac{1}{2}}', '0.5', 1.0, 1.0),          # not a mixed number
    ('#### - 5', '-5', 1.0, 1.0),
    ('\\boxed{- 5}', '-5', 1.0, 1.0),
    ('She had 10 - 5', '5', 1.0, 0.0),                          # running text: subtraction
    # A number too long for fractions.Fraction (> 4300 digits) is a wrong answer, not an error.
    ('#### ' + '1' * 4301, '72', 0.0, 1.0),
    ('#### 72 ' + '1' * 4301, '72', 1.0, 1.0),
    # Missing answers.
    ('I am not sure how to solve this problem.', '72', 0.0, 0.0),
    ('', '72', 0.0, 0.0),
    ('#### ', '72', 0.0, 0.0),
    ('\\boxed{}', '72', 0.0, 0.0),
    ('The answer is seventy-two.', '72', 0.0, 0.0),
]


@pytest.mark.parametrize('completion,answer,want,want_format', CASES)
def test_table(completion, answer, want, want_format):
  assert gsm8k.gsm8k_correct(completion, answer) == want
  assert gsm8k.gsm8k_format(completion, answer) == want_format


def test_table_is_large_enough():
  assert len(CASES) >= 30


def test_registered_and_picklable():
  assert verifiers.get_verifier('gsm8k') is gsm8k.gsm8k_correct
  assert verifiers.get_verifier('gsm8k_format') is gsm8k.gsm8k_format
  assert pickle.loads(pickle.dumps(gsm8k.gsm8k_correct)) is gsm8k.gsm8k_correct


def test_reference_without_number_raises():
  with pytest.raises(ValueError, match="reference answer has no number: 'seventy'"):
    gsm8k.gsm8k_correct('72', 'seventy')


def test_runner_scores_in_worker_processes():
  completions = ['#### 72', '\\boxed{70}', 'so 72 clips']
  with RewardRunner({'gsm8k': 1.0, 'gsm8k_format': 0.1}, num_workers=1) as runner:
    result = runner(completions, ['72'] * 3)
  assert result.per_verifier['gsm8k'].tolist() == [1.0, 0.0, 1.0]
  assert result.total.tolist() == pytest.approx([1.1, 0.1, 1.0])
  assert result.valid.all()


def test_unclosed_boxes_are_skipped():
  """Unclosed \\boxed{ are passed over for the last closed one, or the last number (they are
  matched in one pass: the scan to the end per box took ~2 s on 10k characters of them)."""
  assert gsm8k.extract_answer('\\boxed{' * 1500 + ' so 72') == 72
  assert gsm8k.extract_answer('\\boxed{70} \\boxed{' * 3 + ' 5') == 70
