"""The data directory of each data test module (datasets are prepared into it once)."""
import pytest


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('jtc_data'))
