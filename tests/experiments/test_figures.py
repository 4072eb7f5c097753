"""Tests of experiments.figures: the curves figure of a sweep has a panel per curve key plus
held-out accuracy, one line per run with the mean over seeds, shaded by one standard error."""
import numpy as np

from experiments import figures
from experiments import sweeps as sweeps_lib

STEPS = np.arange(0, 11)


def _summary(label, seed, lift):
  value = list(0.3 + lift * STEPS / 10 + 0.01 * seed)
  return {
      'label': label,
      'group': '',
      'seed': seed,
      'curves': {
          'reward_mean': {
              'step': list(STEPS),
              'value': value
          },
          'eval/avg@4': {
              'step': [0, 10],
              'value': [value[0], value[-1]]
          }
      }
  }


def test_the_figure_has_a_panel_per_key_and_a_mean_line_per_run(tmp_path, monkeypatch):
  sweep = sweeps_lib.Sweep(
      name='fake', description='', runs=(sweeps_lib.Run('a', 'gspo',
                                                        'A'), sweeps_lib.Run('b', 'gspo', 'B')),
      baseline='A', tables=(), num_steps=10, seeds=2, curve_keys=('reward_mean',))
  summaries = [_summary(l, s, lift) for l, lift in (('A', 0.1), ('B', 0.3)) for s in (0, 1)]
  drawn = []
  monkeypatch.setattr(figures.curve_plots.plt, 'close', drawn.append)
  out = figures.plot_curves(sweep, summaries, str(tmp_path / 'sub' / 'curves.png'))
  with open(out, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  fig, = drawn
  reward, accuracy = [ax for ax in fig.axes if ax.lines]
  assert reward.get_title() == 'Mean reward' and accuracy.get_title().startswith('Held-out')
  for line, lift in zip(reward.lines, (0.1, 0.3)):  # the mean of seeds 0 and 1 of each run
    np.testing.assert_allclose(line.get_ydata(), 0.3 + lift * STEPS / 10 + 0.005)
