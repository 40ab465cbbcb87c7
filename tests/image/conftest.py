"""The amd64 image, built once for every image test module."""

from __future__ import annotations

import pytest

from tests.image.imagebuild import Built, build


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(tmp_path_factory.mktemp("image-first"))
