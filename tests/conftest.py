import os
import tempfile

import numpy as np
import pytest

# Each test session compiles into its own cache unless the caller chose one.
os.environ.setdefault("TCC_CACHE_DIR", tempfile.mkdtemp(prefix="tcc-test-cache-"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()
