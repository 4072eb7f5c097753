r"""`jtc data` / `python -m jtc.data`: how jtc reads a dataset (`jtc.data.formats`).

  python -m jtc.data PATH [--show 3] [--question-field F --answer-field F]

PATH is what `config.data.dataset` would name: a JSONL or parquet file, a directory of
<split>.jsonl / <split>.parquet files, or a Hugging Face dataset saved with save_to_disk. It
prints the detected format and row schema, every split's row count, and the first N parsed
(prompt, reference answer) pairs of each split. Every row is read and checked as a training run
would, so a malformed row is one line naming the file, the row and the field (exit status 2).
"""

import argparse

from jtc.data import examples
from jtc.data import formats

FORMATS = {
    'jsonl': 'JSONL (one JSON object a line)',
    'parquet': 'parquet',
    'arrow': 'a Hugging Face dataset saved with save_to_disk (Arrow files)',
}


def make_parser(prog='python -m jtc.data'):
  parser = argparse.ArgumentParser(prog=prog, description=__doc__.split('\n\n')[0])
  parser.add_argument('path', help='a dataset file or directory (config.data.dataset)')
  parser.add_argument('--show', type=int, default=3, help='parsed pairs to print per split')
  parser.add_argument('--question-field', default='', help='as config.data.question_field')
  parser.add_argument('--answer-field', default='', help='as config.data.answer_field')
  return parser


def summary(path, *, show=3, question_field='', answer_field=''):
  """The lines `jtc data` prints for the dataset at ``path`` (ValueError for a malformed one)."""
  fields = {'question_field': question_field, 'answer_field': answer_field}
  source = formats.detect(path)
  records = formats.read_source(source, **fields)
  lines = [
      f'path: {source.path}', f'format: {FORMATS[source.format]}',
      f'rows: {formats.describe_schema(source, **fields)}'
  ]
  for split, rows in records.items():
    lines.append(f'split {split}: {len(rows)} rows')
    for i, example in enumerate(rows[:max(show, 0)]):
      prompt = examples.as_example(example)['prompt']
      lines.append(f'  [{i}] prompt: {prompt!r}')
      lines.append(f'      answer: {example["answer"]!r}')
  return lines


def main(argv=None, prog='python -m jtc.data'):
  """The command: ``argv`` without the program name (None: the process's); returns 0."""
  parser = make_parser(prog)
  args = parser.parse_args(argv)
  try:
    lines = summary(args.path, show=args.show, question_field=args.question_field,
                    answer_field=args.answer_field)
  except ValueError as e:
    parser.error(str(e))
  print('\n'.join(lines))
  return 0
