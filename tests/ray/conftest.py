"""A local Ray cluster with the app from serve_config.yaml (tests.factories.quick_config), per
test module that asks for `served`. Each binds ports of its own (wattwise.local_serve), so
another run's clusters may share the machine."""

from collections.abc import Iterator

import pytest

from tests.factories import quick_config
from wattwise.local_serve import LocalServe


@pytest.fixture(scope="module")
def served() -> Iterator[LocalServe]:
    with LocalServe(edit=quick_config, dashboard=False) as local:
        yield local
