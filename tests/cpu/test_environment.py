"""engine/environment.py reads a variable as os.environ.get does, whatever wrote it last: a set,
a change, an unset (os.environ's own writes and pytest's monkeypatch), another mapping put in
os.environ's place, a name never set, values with characters beyond ASCII, many values in turn;
and it costs fewer Python calls than os.environ.get."""
import cProfile
import os
import pstats
from unittest import mock

import pytest

from sok1x.engine import environment

NAME = "SOK1X_TEST_ENVIRONMENT_SWITCH"


def _both(name, default=None):
    return environment.get(name, default), os.environ.get(name, default)


def test_a_name_never_set_gives_the_default():
    assert _both("SOK1X_TEST_NEVER_SET_ANYWHERE") == (None, None)
    assert _both("SOK1X_TEST_NEVER_SET_ANYWHERE", "1") == ("1", "1")


def test_every_write_is_seen_at_the_next_read(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert _both(NAME, "d") == ("d", "d")
    monkeypatch.setenv(NAME, "1")
    assert _both(NAME, "d") == ("1", "1")
    os.environ[NAME] = "0"
    assert _both(NAME, "d") == ("0", "0")
    del os.environ[NAME]
    assert _both(NAME, "d") == ("d", "d")
    os.environ.update({NAME: "true"})
    assert _both(NAME) == ("true", "true")
    assert os.environ.pop(NAME) == "true"
    assert _both(NAME, "x") == ("x", "x")


def test_a_mapping_put_in_os_environs_place_is_read():
    with mock.patch("os.environ", {NAME: "patched"}):
        assert _both(NAME) == ("patched", "patched")
        assert _both("SOK1X_TEST_NEVER_SET_ANYWHERE", "d") == ("d", "d")
    assert _both(NAME) == (os.environ.get(NAME), os.environ.get(NAME))


@pytest.mark.parametrize("value", ["", " 1 ", "Grüße", "0" * 300, "a=b;c"])
def test_any_value_reads_back_as_it_was_written(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    assert _both(NAME) == (value, value)


def test_many_values_in_turn_keep_reading_right(monkeypatch):
    for count in range(600):  # past the decoded values it keeps
        monkeypatch.setenv(NAME, str(count))
        assert _both(NAME) == (str(count), str(count))


def test_a_read_costs_fewer_python_calls_than_os_environ_get(monkeypatch):
    monkeypatch.setenv(NAME, "1")
    environment.get(NAME)  # (its key and value are known after a first read)

    def calls(read):
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(100):
            read(NAME, "0")
        profile.disable()
        return sum(row[1] for row in pstats.Stats(profile).stats.values()) / 100

    ours, theirs = calls(environment.get), calls(os.environ.get)
    assert ours < theirs
    assert ours < 4.5  # get itself and its three dict lookups (the profiler adds 0.01)
