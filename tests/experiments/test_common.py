"""Tests of experiments.common: a metric of the difference of two curves, logged at the same
steps."""
import os

import numpy as np
import pytest

from experiments import common


def test_a_metric_of_the_difference_of_two_curves():
  summary = {
      'curves': {
          'a': {
              'step': [0, 5, 10],
              'value': [0.0, 1.0, 3.0]
          },
          'b': {
              'step': [0, 5, 10],
              'value': [1.0, 1.0, 0.5]
          },
          'c': {
              'step': [0, 10],
              'value': [0.0, 1.0]
          }
      }
  }
  assert common.metric_value(summary, 'change:a - b') == pytest.approx(3.0 - (-0.5))
  assert np.isnan(common.metric_value(summary, 'final:a - missing'))  # a missing curve
  with pytest.raises(ValueError, match='same steps'):
    common.metric_value(summary, 'change:a - c')


def test_results_go_beside_the_code_in_a_checkout_and_to_the_working_directory_when_installed(
    tmp_path):
  checkout, installed, cwd = tmp_path / 'repo', tmp_path / 'site-packages', tmp_path / 'work'
  (checkout / 'experiments' / 'results').mkdir(parents=True)
  (installed / 'experiments').mkdir(parents=True)  # a wheel carries no results folder
  assert common.results_dir(str(checkout), str(cwd)) == str(checkout / 'experiments' / 'results')
  assert common.results_dir(str(installed), str(cwd)) == str(cwd / 'experiments' / 'results')
  assert common.results_dir() == os.path.join(common.ROOT, 'experiments', 'results')  # this one
