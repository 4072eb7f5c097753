"""Prompt datasets as researchers bring them, read into jtc's records and checked row by row.

File formats, detected from the path (``detect``):

- ``jsonl``: one JSON object a line (any file not starting with the parquet magic ``PAR1``);
- ``parquet``: a parquet file, as verl's and SkyRL's preprocessing scripts write them;
- ``arrow``: a Hugging Face ``datasets`` directory written by ``save_to_disk`` (``state.json``
  and ``data-*.arrow`` Arrow stream files; a ``DatasetDict``: ``dataset_dict.json`` and one such
  folder per split), read with pyarrow (``datasets`` is not needed).

A file is split ``'train'``, and so is a list of files or glob patterns of one format
(`file_lists`: ``'a.parquet,b.parquet'``, ``'part-*.parquet'``, read in that order); a directory of ``<split>.jsonl`` or ``<split>.parquet`` files and a
``DatasetDict`` have their splits; a saved ``Dataset`` is split ``'train'``.

Row schemas, detected from the first row (``schema_of``):

- ``verl``: a ``reward_model`` column (verl, SkyRL; GSM8K, MATH and DAPO-Math-17k as they are
  distributed preprocessed): ``prompt`` is a list of ``{'role', 'content'}`` chat messages (or a
  string: one user message), the reference answer is ``reward_model.ground_truth`` (stripped),
  the solution is ``extra_info.answer`` when there is one (GSM8K's worked solution), else the
  ground truth. ``data_source``, ``ability`` and the rest are not read.
- ``qa``: question/answer fields, named by ``question_field`` / ``answer_field`` or else the first
  present of ``question/problem/prompt/query`` and ``answer/solution/response``; the answer is
  ``normalize_reference_answer`` of the answer field (GSM8K ``#### 42`` -> ``42``, MATH
  ``\\boxed{x}`` -> ``x``), the solution the raw field. Naming a field reads any file this way.

A record is ``{'prompt', 'answer', 'solution', 'messages', 'data_source', 'row'}`` of str: a
prompt of one user message is its content and ``messages`` is ``''``, so it reads exactly as a
JSONL question; any other conversation keeps its messages as JSON in ``messages`` and its plain
text (the contents joined by a blank line) in ``prompt``. ``data_source`` is the row's
(``''`` without one) and ``row`` the JSON of the row's other fields (all but the question), which
users' reward functions receive (`jtc.data.custom_rewards`). `jtc.data.examples.as_example`
turns a record into what the trainer reads (a `Conversation` prompt, a `Reference` answer).

Every malformed row (missing field, wrong type, empty answer or question, text that is not
UTF-8) is a ``ValueError`` naming the file, the row (JSONL: its 1-based line; parquet/arrow: its
0-based row index) and the field.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Iterator

from jtc.data import examples
from jtc.data import file_lists
from jtc.data import rewards

QUESTION_KEYS = ('question', 'problem', 'prompt', 'query')
ANSWER_KEYS = ('answer', 'solution', 'response')
PARQUET_MAGIC = b'PAR1'
SPLIT_SUFFIXES = {'.jsonl': 'jsonl', '.parquet': 'parquet'}
ROLES = ('system', 'user', 'assistant')
# The fields of a record (all str; see the module docstring).
RECORD_FIELDS = ('prompt', 'answer', 'solution', 'messages', 'data_source', 'row')


@dataclasses.dataclass(frozen=True)
class Source:
  """A dataset on disk: its format and, per split, its files in reading order."""
  path: str
  format: str  # 'jsonl' | 'parquet' | 'arrow'
  splits: dict[str, tuple[str, ...]]


def normalize_reference_answer(text: str) -> str:
  """Final answer from a GSM8K (``#### 42``) or MATH (``\\boxed{x}``) answer field, else stripped."""
  m = re.search(r'####\s*(.+?)\s*$', text.strip(), re.DOTALL)
  if m:
    answer = m.group(1).strip()
    return answer.replace(',', '') if rewards.parse_number(answer) is not None else answer
  boxed = rewards.extract_boxed(text)
  if boxed is not None:
    return boxed
  return text.strip()


# ----------------------------------------------------------------------------- detection


def _file_format(path: str) -> str:
  with open(path, 'rb') as f:
    head = f.read(len(PARQUET_MAGIC))
  if head == PARQUET_MAGIC:
    return 'parquet'
  if path.endswith('.arrow'):
    raise ValueError(f'{path}: an Arrow file alone is not read; pass the directory that '
                     'save_to_disk wrote (with its state.json)')
  if path.endswith('.parquet'):
    raise ValueError(f'{path}: not a parquet file (it does not start with {PARQUET_MAGIC!r})')
  return 'jsonl'


def _saved_dataset_files(folder: str) -> tuple[str, ...]:
  """The Arrow files of a ``save_to_disk`` Dataset folder, in order (from its state.json)."""
  state_path = os.path.join(folder, 'state.json')
  try:
    with open(state_path, encoding='utf-8') as f:
      files = [entry['filename'] for entry in json.load(f)['_data_files']]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(
        f'{state_path}: not the state.json of a saved Hugging Face dataset '
        f'(needs "_data_files": [{{"filename": ...}}]; {type(e).__name__}: {e})') from None
  paths = tuple(os.path.join(folder, name) for name in files)
  missing = [p for p in paths if not os.path.isfile(p)]
  if not paths or missing:
    raise ValueError(f'{state_path}: its data files {missing or files} are missing')
  return paths


def _split_files(path: str) -> tuple[str, dict[str, tuple[str, ...]]]:
  """A directory of ``<split>.jsonl`` or ``<split>.parquet`` files -> (format, splits)."""
  found = {}
  for name in sorted(os.listdir(path)):
    stem, suffix = os.path.splitext(name)
    if suffix in SPLIT_SUFFIXES and os.path.isfile(os.path.join(path, name)):
      found.setdefault(SPLIT_SUFFIXES[suffix], {})[stem] = (os.path.join(path, name),)
  if len(found) != 1:
    what = 'both .jsonl and .parquet files' if found else 'no data files'
    raise ValueError(
        f'{path}: {what}; a dataset directory holds <split>.jsonl files, <split>.parquet files '
        'or a Hugging Face dataset saved with save_to_disk (state.json or dataset_dict.json)')
  (fmt, splits), = found.items()
  return fmt, splits


def detect(path: str) -> Source:
  """The `Source` at ``path`` (file or directory; see the module docstring); ValueError naming
    the path and what a dataset should be when it is none of them."""
  if file_lists.is_list(path):  # several files, one split (verl's lists of files)
    files = file_lists.expand(path)
    found = {f: _file_format(f) for f in files}
    if len(set(found.values())) > 1:
      raise ValueError(f'{path!r}: files of several formats ({found}); a list names files of one')
    return Source(','.join(files), found[files[0]], {'train': files})
  path = os.path.abspath(os.fspath(path))
  if os.path.isfile(path):
    return Source(path, _file_format(path), {'train': (path,)})
  if not os.path.isdir(path):
    raise ValueError(f'dataset not found: {path!r} (a JSONL or parquet file, or a directory)')
  if os.path.isfile(os.path.join(path, 'dataset_dict.json')):
    try:
      with open(os.path.join(path, 'dataset_dict.json'), encoding='utf-8') as f:
        names = json.load(f)['splits']
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ValueError(f'{path}/dataset_dict.json: no "splits" list ({e})') from None
    return Source(path, 'arrow', {s: _saved_dataset_files(os.path.join(path, s)) for s in names})
  if os.path.isfile(os.path.join(path, 'state.json')):
    return Source(path, 'arrow', {'train': _saved_dataset_files(path)})
  fmt, splits = _split_files(path)
  return Source(path, fmt, splits)


# ----------------------------------------------------------------------------- rows


def _jsonl_rows(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """(``'path:line'``, object) of each non-blank line."""
  with open(path, 'rb') as f:
    data = f.read()
  for lineno, raw in enumerate(data.split(b'\n'), start=1):
    where = f'{path}:{lineno}'
    text = raw.decode('utf-8', errors='surrogateescape')
    if not text.strip():
      continue
    try:
      record = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f'{where}: malformed JSON ({e.msg})') from None
    if not isinstance(record, dict):
      raise ValueError(f'{where}: expected a JSON object, got {type(record).__name__}')
    bad = [k for k, v in record.items() if _has_surrogates(k) or _has_surrogates(v)]
    if bad:
      raise ValueError(f'{where}: field {bad[0]!r} is not UTF-8 text')
    yield where, record


def _has_surrogates(value: Any) -> bool:
  """True when a str in ``value`` (nested lists/dicts too) holds undecodable bytes."""
  if isinstance(value, str):
    try:
      value.encode('utf-8')
    except UnicodeEncodeError:
      return True
    return False
  if isinstance(value, dict):
    return any(_has_surrogates(k) or _has_surrogates(v) for k, v in value.items())
  if isinstance(value, list):
    return any(_has_surrogates(v) for v in value)
  return False


def _table_rows(path: str, batches) -> Iterator[tuple[str, dict[str, Any]]]:
  """(``'path: row i'``, row) of Arrow record batches; text that is not UTF-8 names its row."""
  offset = 0
  for batch in batches:
    try:
      rows = batch.to_pylist()
    except UnicodeDecodeError:
      for name, column in zip(batch.schema.names, batch.columns):
        for i in range(len(column)):
          try:
            column[i].as_py()
          except UnicodeDecodeError:
            raise ValueError(f'{path}: row {offset + i}: field {name!r} is not UTF-8 '
                             'text') from None
      raise
    for i, row in enumerate(rows):
      yield f'{path}: row {offset + i}', row
    offset += len(rows)


def _parquet_rows(path: str):
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  try:
    batches = pq.ParquetFile(path).iter_batches(batch_size=4096)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'{path}: not a readable parquet file ({type(e).__name__}: {e})') from None
  return _table_rows(path, batches)


def _arrow_rows(path: str):
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  try:
    reader = pa.ipc.open_stream(pa.memory_map(path))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'{path}: not an Arrow stream file as save_to_disk writes '
                     f'({type(e).__name__}: {e})') from None
  return _table_rows(path, reader)


ROW_READERS = {'jsonl': _jsonl_rows, 'parquet': _parquet_rows, 'arrow': _arrow_rows}

# ----------------------------------------------------------------------------- records


def schema_of(row: dict[str, Any], *, question_field: str = '', answer_field: str = '') -> str:
  """``'verl'`` for a row with a ``reward_model`` field (unless a field is named), else ``'qa'``."""
  return 'verl' if 'reward_model' in row and not (question_field or answer_field) else 'qa'


def _text(where: str, field: str, value: Any, *, numbers: bool = True) -> str:
  """``value`` as non-empty text (a number too, when ``numbers``), else a ValueError."""
  kinds = (str, int, float) if numbers else (str,)
  if isinstance(value, bool) or not isinstance(value, kinds):
    want = 'a string or number' if numbers else 'a string'
    raise ValueError(f'{where}: field {field!r} must be {want}, got {type(value).__name__} '
                     f'{value!r:.80}')
  text = str(value)
  if not text.strip():
    raise ValueError(f'{where}: field {field!r} is empty')
  return text


def _qa_record(where, row, *, question_field, answer_field):
  keys = {}
  for role, named, options in (('question', question_field, QUESTION_KEYS), ('answer', answer_field,
                                                                             ANSWER_KEYS)):
    key = named or next((k for k in options if k in row), None)
    if key is None or key not in row:
      looked = [named] if named else list(options)
      hint = " (a verl row needs 'reward_model')" if isinstance(row.get('prompt'), list) else ''
      flag = f'config.data.{role}_field (jtc data --{role}-field)'
      what = f'{key!r} (named by {flag})' if named else f'among {looked} (name it with {flag})'
      raise ValueError(f'{where}: no {role} field {what}; the record has {sorted(row)}{hint}')
    keys[role] = key
  prompt = _text(where, keys['question'], row[keys['question']])
  raw = _text(where, keys['answer'], row[keys['answer']])
  answer = normalize_reference_answer(raw)
  if not answer:
    raise ValueError(f'{where}: field {keys["answer"]!r} has an empty final answer ({raw!r})')
  return {
      'prompt': prompt,
      'answer': answer,
      'solution': raw,
      'messages': '',
      **_provenance(row, keys['question'])
  }


def _provenance(row: dict[str, Any], question: str) -> dict[str, str]:
  """A record's ``data_source`` (the row's, '' without one) and ``row`` (its other fields, JSON)."""
  source = row.get('data_source')
  rest = {k: v for k, v in row.items() if k != question}
  return {
      'data_source': source if isinstance(source, str) else '',
      'row': json.dumps(rest, ensure_ascii=False, default=str)
  }


def _messages(where: str, prompt: Any) -> list[dict[str, str]]:
  if isinstance(prompt, str):
    return [{'role': 'user', 'content': _text(where, 'prompt', prompt, numbers=False)}]
  if not isinstance(prompt, list) or not prompt:
    raise ValueError(f"{where}: field 'prompt' must be a non-empty list of chat messages "
                     f"{{'role', 'content'}} (or a string), got {prompt!r:.80}")
  messages = []
  for i, m in enumerate(prompt):
    field = f'prompt[{i}]'
    if not isinstance(m, dict) or 'role' not in m or 'content' not in m:
      raise ValueError(f"{where}: field {field!r} must be a message {{'role', 'content'}}, got "
                       f'{m!r:.80}')
    if m['role'] not in ROLES:
      raise ValueError(f"{where}: field '{field}.role' is {m['role']!r}; valid: {list(ROLES)}")
    content = _text(where, f'{field}.content', m['content'], numbers=False)
    messages.append({'role': m['role'], 'content': content})
  if messages[-1]['role'] != 'user':
    raise ValueError(f"{where}: field 'prompt' must end with a user message (the model answers "
                     f"it), ends with {messages[-1]['role']!r}")
  return messages


def _verl_record(where, row):
  if 'prompt' not in row:
    raise ValueError(f"{where}: no field 'prompt' (the chat messages); record has {sorted(row)}")
  messages = _messages(where, row['prompt'])
  reward_model = row['reward_model']
  if not isinstance(reward_model, dict) or 'ground_truth' not in reward_model:
    raise ValueError(f"{where}: field 'reward_model' must be a struct with 'ground_truth', got "
                     f'{reward_model!r:.80}')
  answer = _text(where, 'reward_model.ground_truth', reward_model['ground_truth']).strip()
  extra = row.get('extra_info')
  worked = extra.get('answer') if isinstance(extra, dict) else None
  single = len(messages) == 1
  return {
      'prompt': messages[0]['content'] if single else examples.plain_text(messages),
      'answer': answer,
      'solution': worked if isinstance(worked, str) and worked.strip() else answer,
      'messages': '' if single else json.dumps(messages, ensure_ascii=False),
      **_provenance(row, 'prompt')
  }


def read_files(fmt: str, files, *, question_field: str = '',
               answer_field: str = '') -> list[dict[str, str]]:
  """The records of one split's files (see the module docstring), every row checked; the schema
    is the first row's. ValueError naming file, row and field for a malformed row, and for a
    split without rows."""
  if fmt not in ROW_READERS:
    raise ValueError(f'unknown dataset format {fmt!r}; valid: {sorted(ROW_READERS)}')
  out, schema = [], None
  for path in files:
    for where, row in ROW_READERS[fmt](path):
      schema = schema or schema_of(row, question_field=question_field, answer_field=answer_field)
      if schema == 'verl':
        if 'reward_model' not in row:
          raise ValueError(f"{where}: no field 'reward_model' (earlier rows have it); record has "
                           f'{sorted(row)}')
        out.append(_verl_record(where, row))
      else:
        out.append(_qa_record(where, row, question_field=question_field, answer_field=answer_field))
  if not out:
    raise ValueError(f'empty dataset: {", ".join(files)} has no records')
  return out


def read_source(source: Source, *, question_field: str = '',
                answer_field: str = '') -> dict[str, list[dict[str, str]]]:
  """Every split of ``source`` read and checked: ``{split: records}``."""
  return {
      split:
          read_files(source.format, files, question_field=question_field, answer_field=answer_field)
      for split, files in source.splits.items()
  }


def first_row(source: Source) -> dict[str, Any]:
  """The first row of the first split of ``source`` ({} when it has none)."""
  for path in next(iter(source.splits.values())):
    for _, row in ROW_READERS[source.format](path):
      return row
  return {}


def describe_schema(source: Source, *, question_field: str = '', answer_field: str = '') -> str:
  """How the rows of ``source`` are read, in words (from its first row)."""
  row = first_row(source)
  if schema_of(row, question_field=question_field, answer_field=answer_field) == 'verl':
    return "verl: chat messages in 'prompt', reference answer reward_model.ground_truth"
  q = question_field or next((k for k in QUESTION_KEYS if k in row), None)
  a = answer_field or next((k for k in ANSWER_KEYS if k in row), None)
  return f'question/answer: question field {q!r}, answer field {a!r}'
