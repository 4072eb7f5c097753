"""benchmarks/device_table.py reads device_check.sh's folder into one table: numbers where a part
ran, its reason where it did not (out of time, failed, never run); and the script itself runs on
the CPU with tiny shapes (slow)."""

import json
import os
import subprocess

import pytest

from benchmarks import device_table

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)


def test_a_full_folder_gives_numbers_and_ratios(tmp_path):
  out = str(tmp_path)
  _write(
      f'{out}/parts.txt',
      ''.join(f'{p}: exit 0 after 5 s (limit 9 s)\n' for p in ('rollout', 'train_step',
                                                               'population_1', 'population_16',
                                                               'preflight')))
  _write(
      f'{out}/rollout.json',
      json.dumps({
          'setups': {
              'qwen3_0_6b': {
                  'label': 'L',
                  'tokens_per_s': {
                      'static': 100.0,
                      'continuous slots=128': 250.0
                  },
                  'mean_length': 128,
                  'p99_length': 512,
                  'same_tokens': True,
                  'load': 1.0
              }
          }
      }))
  _write(
      f'{out}/train_step.txt', 'MFU of the update step, qwen3_0_6b shape (596M params), 64 '
      'sequences x 640 tokens (P=128, T=512), G=8:\n  init_params 1s, compile 2s, 500 ms/step '
      '(median)\n  peak 900 TFLOP/s -> MFU  41.5%\n')
  _write(f'{out}/population_ms.txt', '1 60000\n16 120000\n')
  _write(f'{out}/preflight/plan.txt', 'fits: the largest stage peaks at 12.50 GiB of 60 GiB')
  _write(f'{out}/preflight/summary.json',
         json.dumps({'steps': [{
             'peak_after_sample': 2**33,
             'peak_after_update': 3 * 2**32
         }]}))
  rows = {a: b for a, b, _ in device_table.sampler_rows(out, device_table.exit_codes(out))}
  assert rows['sampler, best continuous / static'] == '2.50x'
  text = device_table.table(out)
  assert '| RL update tokens/s (Qwen3-0.6B shape) | 81920 |' in text
  assert '| RL update MFU (Qwen3-0.6B shape) | 41.5 % |' in text
  assert '| seeds per hour, N=16 / N=1 | 8.00x |' in text  # 16 seeds in twice the time of one
  assert '| jtc plan --gpu predicted peak per chip | 12.50 GiB |' in text
  assert '| measured device peak (trainer, preflight run) | 12.00 GiB |' in text


def test_a_part_out_of_time_or_failed_is_named_not_guessed(tmp_path):
  out = str(tmp_path)
  _write(
      f'{out}/parts.txt', 'rollout: exit 124 after 110 s (limit 110 s)\n'
      'train_step: exit 1 after 3 s (limit 90 s)\n')
  _write(f'{out}/train_step.txt', '500 ms/step (median) MFU 41.5%')  # a stale file is not read
  text = device_table.table(out)
  assert 'static vs continuous | not measured (ran out of its time limit)' in text
  assert 'MFU (Qwen3-0.6B shape) | not measured (exit 1; train_step.txt)' in text
  assert '| seeds per hour, population | not run |' in text
  assert 'predicted peak per chip | not run |' in text


@pytest.mark.slow
def test_the_device_check_runs_on_the_cpu_with_tiny_shapes(tmp_path):
  out = str(tmp_path / 'out')
  proc = subprocess.run(['bash', 'benchmarks/device_check.sh', '--tiny'], cwd=REPO,
                        env=dict(os.environ, OUT=out), capture_output=True, text=True, timeout=3600,
                        check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rcs = device_table.exit_codes(out)
  assert rcs == dict.fromkeys(
      ('rollout', 'train_step', 'population_1', 'population_2', 'preflight'), 0), rcs
  text = device_table.table(out)
  assert 'continuous / static' in text and 'seeds per hour, N=2 / N=1' in text, text
