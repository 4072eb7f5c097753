"""Tests of jtc.data.tasks.phrasing: the phrasings share the reasoning scaffold and have equal
lengths."""
from jtc.data import tasks


def test_phrasing_solutions_share_reasoning_scaffold_and_length():
  """The equivalent forms differ only in an equally long phrasing after identical reasoning,
  all score 1, and format_of names each; a wrong number scores 0 in any phrasing."""
  from jtc.data.tasks import phrasing  # pylint: disable=import-outside-toplevel
  task = tasks.get_task('phrasing')
  for e in task.examples('train', seed=3, num_examples=50):
    sols = e['solutions']
    assert set(sols) == set(phrasing.FORMATS)
    assert len({len(s) for s in sols.values()}) == 1
    prefixes = {s[:s.index('. ') + 2] for s in sols.values()}
    assert len(prefixes) == 1 and prefixes.pop().startswith(phrasing.SCAFFOLD)
    for f, s in sols.items():
      assert task.format_of(s) == f
      assert task.reward_fn([e['prompt']], [s], [e['answer']])[0] == 1.0
      wrong = s[:s.rindex(' ') + 1] + str(int(e['answer']) + 1) + '.'
      assert task.reward_fn([e['prompt']], [wrong], [e['answer']])[0] == 0.0
      assert task.format_of(wrong) == f
  assert task.format_of('The answer is 5.') is None
