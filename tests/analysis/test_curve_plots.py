"""Tests of jtc.analysis.curve_plots: key names, smoothing, run labels, figure layout, errors
naming the keys the runs have (the command, `jtc plot`, is tests/cli/test_plot.py's).

Runs are fake `metrics.jsonl` files written the way `jtc.analysis.metric_writer` writes them (one JSON
object per line with 'step'; evaluations every 50 steps).
"""

import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np
import pytest

from jtc.analysis import metric_writer
from jtc.analysis import curves
from jtc.analysis import curve_plots

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _write_run(workdir, *, seed, num_steps=120, eval_every=50, lift=0.2):
  """A fake jtc.train workdir: dense training metrics every step, eval/avg@4 every 50."""
  rng = np.random.default_rng(seed)
  writer = metric_writer.MetricWriter(str(workdir))
  writer.write(0, {'eval/avg@4': 0.45})
  for step in range(1, num_steps + 1):
    metrics = {
        'reward_mean': 0.4 + lift * step / num_steps + rng.normal(0, 0.1),
        'entropy': 0.6 * np.exp(-step / 80),
        'loss': float('nan') if step == 3 else rng.normal(0, 1e-3)
    }
    if step % eval_every == 0:
      metrics['eval/avg@4'] = 0.45 + lift * step / num_steps
    writer.write(step, metrics)
  writer.close()
  return str(workdir)


@pytest.fixture
def two_same_name_runs(tmp_path):
  """Two workdirs both called 'dfpo' in different sweeps."""
  return [
      _write_run(tmp_path / 'sweep_a' / 'dfpo', seed=0),
      _write_run(tmp_path / 'sweep_b' / 'dfpo', seed=1, lift=0.1)
  ]


# ----------------------------------------------------------------------------- names


@pytest.mark.parametrize('key, title, ylabel', [
    ('reward_mean', 'Mean reward', 'reward'),
    ('eval/avg@4', 'Held-out accuracy (avg@4)', 'accuracy'),
    ('eval/avg@16', 'Held-out accuracy (avg@16)', 'accuracy'),
    ('format/steps', "Share of the 'steps' format", 'fraction of correct'),
    ('diag/energy_b0', 'Gradient energy in frequency bucket 0 (b0 = frequent)', 'share of energy'),
])
def test_describe_known_keys_and_patterns(key, title, ylabel):
  assert curve_plots.describe(key) == (title, ylabel)


def test_describe_fallback_is_readable_and_names_the_key():
  assert curve_plots.describe('diag/some_new_thing') == ('Diagnostic: some new thing',
                                                         'diag/some_new_thing')
  assert curve_plots.describe('my_metric') == ('My metric', 'my_metric')
  assert curve_plots.describe('x/y/z_w') == ('x y: z w', 'x/y/z_w')
  for key in curve_plots.DEFAULT_KEYS + tuple(curve_plots.KNOWN_KEYS):
    title, ylabel = curve_plots.describe(key)
    assert title and ylabel and '_' not in title  # every known key reads as words


# ----------------------------------------------------------------------------- smoothing


def test_is_sparse():
  assert curve_plots.is_sparse(np.arange(0, 201, 50))  # evaluations every 50 steps
  assert curve_plots.is_sparse(np.arange(10, 1001, 10))  # 100 points, but every 10 steps
  assert not curve_plots.is_sparse(np.arange(1, 201))  # logged every step


# ----------------------------------------------------------------------------- run labels


@pytest.mark.parametrize(
    'workdirs, want',
    [
        (['/x/a/seed0', '/x/b/seed0', '/x/seed1'], ['a/seed0', 'b/seed0', 'seed1']),
        (['/r/one', '/r/two'], ['one', 'two']),
        (['/a/b/run', '/c/b/run'], ['a/b/run', 'c/b/run']),
        (['/w/run', '/w/run/'], ['run', 'run (2)']),  # the same directory twice
        (['/a/b', '/x/a/b'], ['a/b', 'x/a/b']),  # one path a suffix of another
    ])
def test_run_labels_shortest_distinguishing_suffix(workdirs, want):
  labels = curve_plots.run_labels(workdirs)
  assert labels == want
  assert len(set(labels)) == len(labels)


# ----------------------------------------------------------------------------- the figure


def _data_axes(fig):
  return [ax for ax in fig.axes if ax.axison]


def test_figure_draws_both_same_name_runs_with_distinct_styles(two_same_name_runs):
  runs = {
      label: metric_writer.read_jsonl(os.path.join(w, 'metrics.jsonl'))
      for w, label in zip(two_same_name_runs, curve_plots.run_labels(two_same_name_runs))
  }
  assert list(runs) == ['sweep_a/dfpo', 'sweep_b/dfpo']
  fig = curve_plots.make_figure(runs, ['reward_mean', 'eval/avg@4'])
  try:
    reward_ax, eval_ax = _data_axes(fig)
    assert reward_ax.get_title() == 'Mean reward' and reward_ax.get_ylabel() == 'reward'
    assert eval_ax.get_title() == 'Held-out accuracy (avg@4)'
    for ax in (reward_ax, eval_ax):
      lines = ax.get_lines()
      assert len(lines) == 2  # one curve per run
      assert lines[0].get_color() != lines[1].get_color()
    # The eval curve (every 50 steps) has markers; the dense one has none.
    assert all(l.get_marker() == 'o' for l in eval_ax.get_lines())
    assert all(l.get_marker() in ('None', None, '') for l in reward_ax.get_lines())
    np.testing.assert_array_equal(eval_ax.get_lines()[0].get_xdata(), [0, 50, 100])
    legend_labels = [t.get_text() for lg in _legends(fig) for t in lg.get_texts()]
    assert legend_labels == ['sweep_a/dfpo', 'sweep_b/dfpo']
  finally:
    plt.close(fig)


def _legends(fig):
  return [lg for lg in fig.legends] + [ax.get_legend() for ax in fig.axes if ax.get_legend()]


@pytest.mark.parametrize('keys', [['reward_mean'], ['reward_mean', 'entropy', 'eval/avg@4'],
                                  ['reward_mean', 'entropy', 'eval/avg@4', 'loss']])
def test_legend_never_overlaps_a_data_panel(two_same_name_runs, keys):
  runs = {
      label: metric_writer.read_jsonl(os.path.join(w, 'metrics.jsonl'))
      for w, label in zip(two_same_name_runs, curve_plots.run_labels(two_same_name_runs))
  }
  fig = curve_plots.make_figure(runs, keys)
  try:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    [legend] = _legends(fig)
    box = legend.get_window_extent(renderer)
    for ax in _data_axes(fig):
      assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()
  finally:
    plt.close(fig)


def test_smoothing_draws_the_trailing_mean_over_a_faint_raw_curve(two_same_name_runs):
  recs = metric_writer.read_jsonl(os.path.join(two_same_name_runs[0], 'metrics.jsonl'))
  fig = curve_plots.make_figure({'run': recs}, ['reward_mean', 'eval/avg@4'], smooth=10)
  try:
    reward_ax, eval_ax = _data_axes(fig)
    raw, smoothed = reward_ax.get_lines()
    x, y = curve_plots.series(recs, 'reward_mean')
    np.testing.assert_array_equal(raw.get_ydata(), y)
    np.testing.assert_allclose(smoothed.get_ydata(), curves.trailing_mean(y, 10))
    assert raw.get_alpha() < 0.5 and (smoothed.get_alpha() is None or smoothed.get_alpha() == 1)
    assert np.std(np.diff(smoothed.get_ydata())) < np.std(np.diff(y))  # it is smoother
    # Sparse evaluations are not smoothed: one line through the logged values.
    [ev] = eval_ax.get_lines()
    np.testing.assert_allclose(ev.get_ydata(), curve_plots.series(recs, 'eval/avg@4')[1])
  finally:
    plt.close(fig)


def test_default_keys_skip_what_no_run_logs_and_nan_is_skipped(two_same_name_runs):
  recs = metric_writer.read_jsonl(os.path.join(two_same_name_runs[0], 'metrics.jsonl'))
  fig = curve_plots.make_figure({'run': recs})
  try:
    titles = [ax.get_title() for ax in _data_axes(fig)]
    assert titles == ['Held-out accuracy (avg@4)', 'Mean reward', 'Policy entropy']
  finally:
    plt.close(fig)
  steps, _ = curve_plots.series(recs, 'loss')  # the 'nan' string at step 3 is dropped
  assert 3 not in steps and len(steps) == 119


def test_unknown_key_names_the_valid_keys(two_same_name_runs):
  with pytest.raises(ValueError) as e:
    curve_plots.plot_runs(two_same_name_runs, 'x.png', ['reward_mean', 'rewrd_mean'])
  msg = str(e.value)
  assert "'rewrd_mean'" in msg
  for valid in ('entropy', 'eval/avg@4', 'loss', 'reward_mean'):
    assert f"'{valid}'" in msg
  assert "'step'" not in msg
  with pytest.raises(ValueError, match='smooth must be an integer >= 1'):
    curve_plots.plot_runs(two_same_name_runs, 'x.png', smooth=0)
  with pytest.raises(FileNotFoundError, match='no metrics.jsonl'):
    curve_plots.plot_runs([os.path.dirname(two_same_name_runs[0])], 'x.png')
