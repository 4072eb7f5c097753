r"""`jtc data` / `python -m jtc.data`: how jtc reads a dataset (`jtc.data.formats`).

  python -m jtc.data PATH [--show 3] [--question-field F --answer-field F]
  jtc data PATH --config configs/real/qwen3_0_6b_gsm8k_dfpo.py --config.policy.checkpoint=DIR

With --config (and its --config.<section>.<key>=value overrides) it also shows, for the first N
rows, the prompt exactly as the model reads it (chat template and suffix), its token count
against data.prompt_width and the configured verifier's score of the reference solution, and
warns of the traps before a run (`jtc.data.preview`).

PATH is what `config.data.dataset` would name: a JSONL or parquet file (or a comma-separated
list and glob patterns of them: 'a.parquet,b.parquet', 'part-*.parquet'), a directory of
<split>.jsonl / <split>.parquet files, or a Hugging Face dataset saved with save_to_disk. It
prints the detected format and row schema, every split's row count, and the first N parsed
(prompt, reference answer) pairs of each split. Every row is read and checked as a training run
would, so a malformed row is one line naming the file, the row and the field (exit status 2).
"""

from jtc.cli import eval as eval_cli
from jtc.data import examples
from jtc.data import formats

FORMATS = {
    'jsonl': 'JSONL (one JSON object a line)',
    'parquet': 'parquet',
    'arrow': 'a Hugging Face dataset saved with save_to_disk (Arrow files)',
}


def make_parser(prog='python -m jtc.data'):
  parser = eval_cli.OverridesParser(prog=prog, description=__doc__.split('\n\n')[0])
  parser.add_argument('path', help='a dataset file or directory (config.data.dataset)')
  parser.add_argument('--show', type=int, default=3, help='parsed pairs to print per split')
  parser.add_argument('--question-field', default='', help='as config.data.question_field')
  parser.add_argument('--answer-field', default='', help='as config.data.answer_field')
  parser.add_argument(
      '--config', default=None,
      help="a run config: the prompts as its model reads them, its verifier's "
      'scores of the reference solutions, the traps')
  return parser


def config_lines(args):
  """The --config part: `jtc.data.preview` of the first --show rows of the train split."""
  from jtc.data import preview  # pylint: disable=import-outside-toplevel
  from jtc.data import selection  # pylint: disable=import-outside-toplevel
  from jtc.data import verifiers  # pylint: disable=import-outside-toplevel
  from jtc.models import bundles  # pylint: disable=import-outside-toplevel
  from jtc.models import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  c = eval_cli.load_with_overrides(args.config, args.overrides)
  with c.unlocked():
    c.data.dataset, c.data.task = args.path, ''
    c.data.question_field = args.question_field or c.data.question_field
    c.data.answer_field = args.answer_field or c.data.answer_field
  tokenizer = (tokenizer_lib.HFTokenizer.from_dir(c.policy.checkpoint)
               if c.policy.checkpoint else bundles.load_policy_bundle(c.policy.init).tokenizer)
  verifiers.check_config(c.data)
  source = formats.detect(args.path)
  split = selection.train_split(args.path, c.data.train_split)
  rows = formats.read_files(source.format, source.splits[split],
                            question_field=c.data.question_field,
                            answer_field=c.data.answer_field)[:max(args.show, 1)]
  reward_fn = verifiers.from_config(c.data, None)
  try:
    return [f'as {args.config} reads split {split}:'] + preview.preview(
        c.data, [examples.as_example(r) for r in rows], tokenizer=tokenizer, reward_fn=reward_fn)
  finally:
    close = getattr(reward_fn, 'close', None)
    if close is not None:
      close()


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
    if args.config:
      lines += config_lines(args)
  except ValueError as e:
    parser.error(str(e))
  print('\n'.join(lines))
  return 0
