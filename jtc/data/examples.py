"""What a dataset record becomes for the trainer (`as_example`): its prompt, a `Conversation`
when it has several chat messages, and its reference answer, a `Reference` that also carries the
row's ``data_source`` and fields (for users' reward functions and per-source metrics).

Both are ``str`` subclasses: everything that reads a prompt or an answer as text (the chat
template of a one-message prompt, jtc's verifiers, ledgers) sees what it always saw.
"""
from __future__ import annotations

import json
from typing import Any


class Conversation(str):
  """A chat prompt of several messages (a system message, few-shot turns).

  As a str it is its plain text, the message contents joined by a blank line: what reward
  functions, ledgers and ``data.chat_template=False`` see. ``messages`` is what the chat template
  renders. ``conversation + suffix`` appends the suffix to the last (user) message, as
  ``data.prompt_suffix`` is appended to a question.
  """

  def __new__(cls, messages):
    messages = tuple({'role': m['role'], 'content': m['content']} for m in messages)
    self = super().__new__(cls, plain_text(messages))
    self._messages = messages
    return self

  @property
  def messages(self) -> list[dict[str, str]]:
    return [dict(m) for m in self._messages]

  def __add__(self, suffix):
    if not isinstance(suffix, str):
      return NotImplemented
    *head, last = self.messages
    return Conversation([*head, {**last, 'content': last['content'] + suffix}])

  def __reduce__(self):
    return Conversation, (self.messages,)

  def __repr__(self):
    return f'Conversation({self.messages!r})'


def plain_text(messages) -> str:
  """The contents of chat messages joined by a blank line."""
  return '\n\n'.join(m['content'] for m in messages)


class Reference(str):
  """A reference answer (as a str: the answer) with its row's ``data_source`` ('' without one)
  and ``row`` (its fields other than the question: verl's ``reward_model``, ``extra_info``, ...)."""

  def __new__(cls, answer, *, data_source='', row=None):
    self = super().__new__(cls, answer)
    self.data_source, self.row = data_source, dict(row or {})
    return self

  def __reduce__(self):
    return _reference, (str(self), self.data_source, self.row)

  def __repr__(self):
    return f'Reference({str(self)!r}, data_source={self.data_source!r})'


def _reference(answer, data_source, row):
  return Reference(answer, data_source=data_source, row=row)


def as_example(record: dict[str, Any]) -> dict[str, Any]:
  """A decoded record as the trainer reads it: ``messages`` JSON -> a `Conversation` prompt, the
  answer a `Reference` when the record has a row (a dataset's; a synthetic task's has none)."""
  example = dict(record)
  messages = example.pop('messages', '')
  if messages:
    example['prompt'] = Conversation(json.loads(messages))
  row = example.pop('row', '')
  if row:
    example['answer'] = Reference(example['answer'], data_source=example.get('data_source', ''),
                                  row=json.loads(row))
  return example
