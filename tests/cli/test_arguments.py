"""The command line as a user types it: option values in any case."""

from __future__ import annotations

import pytest

from dgemma_lsp.server.cli import build_parser


@pytest.mark.parametrize("typed", ["debug", "DEBUG", "Debug"])
def test_log_level_is_accepted_in_any_case(typed):
    assert build_parser().parse_args(["--log-level", typed]).log_level == "DEBUG"
    assert build_parser().parse_args(["engine", "status", "--log-level", typed]).log_level == "DEBUG"


def test_an_unknown_log_level_is_still_refused():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--log-level", "chatty"])
