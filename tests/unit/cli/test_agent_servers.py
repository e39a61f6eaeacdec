"""`gpupool agent --server`: the head's URL, or several (the active head and its standbys), each checked
before the agent starts: a URL it could never reach is refused naming it, not retried forever."""

from __future__ import annotations

import pytest

from gpupool.cli.errors import CliError
from gpupool.main import _head_urls


def test_several_heads_are_kept_in_order_once_each() -> None:
    given = "http://head-a:8470, https://head-b:8470/,http://head-a:8470/"
    assert _head_urls(given) == ("http://head-a:8470", "https://head-b:8470")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("head:8470", "'head:8470' is not a head's URL; give http://HOST:PORT"),
        ("ftp://head", "'ftp://head' is not a head's URL"),
        ("http://", "'http://' is not a head's URL"),
        ("http://bad host:1", "'http://bad host:1' is not a head's URL"),
        ("http://head:99999", "port 99999 of 'http://head:99999' must be 1 to 65535"),
        (" , ", "--server: give the head's URL, e.g. http://head:8470"),
    ],
)
def test_a_server_that_is_no_head_url_is_refused_naming_it(given: str, said: str) -> None:
    with pytest.raises(CliError) as refused:
        _head_urls(given)
    assert said in str(refused.value)
