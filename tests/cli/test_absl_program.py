"""Tests of jtc.cli.absl_program: config paths resolve from any directory, an override key that
is not in the config is one line naming the nearest ones, and a command's flags replace the
previous command's in one process."""
import os

from absl import flags
import pytest

from jtc.cli import absl_program


def test_a_config_path_resolves_from_any_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  want = os.path.join(absl_program.REPO, 'configs', 'gspo.py')
  assert absl_program.resolve_path('configs/gspo.py:smoke') == want + ':smoke'
  assert absl_program.resolve_path('configs/nope.py') == 'configs/nope.py'  # named by the caller


def test_override_keys_are_checked_against_the_config():
  config = absl_program.load_config(os.path.join(absl_program.REPO, 'configs', 'gspo.py'))
  absl_program.check_override_keys(config, ['--config.optim.learning_rate=1e-4', '--workdir=W'])
  with pytest.raises(SystemExit, match='config.optim.lr; did you mean'):
    absl_program.check_override_keys(config, ['--config.optim.lr=1e-4'])


def test_a_commands_flags_replace_the_previous_commands():
  ran = []

  def define(*names):
    return lambda fv, argv: [flags.DEFINE_string(n, None, n, flag_values=fv).name for n in names]

  for names in (('jtc_test_alpha', 'jtc_test_shared'), ('jtc_test_shared',)):
    with pytest.raises(SystemExit):
      absl_program.run(lambda argv: ran.append(flags.FLAGS.jtc_test_shared),
                       ['--jtc_test_shared=x'], prog='p', define_flags=define(*names))
    assert names[0] in flags.FLAGS
  assert ran == ['x', 'x'] and 'jtc_test_alpha' not in flags.FLAGS
  delattr(flags.FLAGS, 'jtc_test_shared')
