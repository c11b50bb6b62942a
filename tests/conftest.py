"""Suite-wide settings.

Tests use small tensors and tiny models: on a 2-core machine extra intra-op threads cost
more than they give, so the whole suite runs torch single-threaded. Warm starts are cached
in a per-session temporary folder, never in the user's cache.

Two tiers: ``make test`` runs the fast one (``-m "not slow"``: unit and property tests and
short training runs), ``make test-slow`` the tests marked ``slow`` (long training runs,
several processes, Ray, fuzzing, TextWorld, SmolLM2). Both make targets install every
package the tests use and set ``CREDO_REQUIRE_EXTRAS=1``: then a test that would be
skipped because a package is not installed fails instead, so that the README's command
never passes by skipping. Run bare ``pytest`` to allow such skips.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator

import pytest
import torch

torch.set_num_threads(1)

#: a skip reason that says a package is missing (pytest.importorskip's own, or ours)
_NOT_INSTALLED = re.compile(r"could not import|not installed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator:
    """With ``CREDO_REQUIRE_EXTRAS=1``, a skip for a missing package is a failure."""
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and os.environ.get("CREDO_REQUIRE_EXTRAS") == "1"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if _NOT_INSTALLED.search(reason):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} would be skipped ({reason}), but CREDO_REQUIRE_EXTRAS=1 (set by "
            "make test and make test-slow, which install every package the tests use): "
            "install it, or run plain pytest to allow the skip"
        )


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["CREDO_CACHE"] = str(tmp_path_factory.mktemp("credo_cache"))


@pytest.fixture(scope="session")
def tw_cache(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A folder with two small TextWorld games generated once per session (see
    :mod:`tw_games`)."""
    from tw_games import generate_test_games

    return generate_test_games(tmp_path_factory.getbasetemp() / "textworld-games")
