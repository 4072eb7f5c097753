"""Tests of experiments.common: a metric of the difference of two curves, logged at the same
steps."""
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
