"""Rows that grow in place on the cpu backend (backend/cpu/reserved_rows.py), against a plain
NumPy array written the same way: rows backed hold what is written, stay where they are when
more rows are backed, hold 0xFF bytes when first backed (as a GPU's new memory holds anything),
and go when unbacked; memory is behind the pages of backed rows only; views keep the range
alive."""
import gc

import numpy as np
import pytest

from sok1x.backend import cpu as backend

PAGE = 4096


def test_backed_rows_hold_what_is_written_and_stay_where_they_are():
    rows, dim = 1 << 24, 16  # 1 GiB of addresses, nothing behind them
    array = backend.reserved_rows((rows, dim), np.float32)
    reference = np.zeros((4096, dim), np.float32)
    assert array.shape == (rows, dim) and backend.backed_bytes(array) == 0
    address = array.__array_interface__["data"][0]
    rng = np.random.default_rng(1)
    held = 0
    for grown in (100, 1000, 4096):  # a member that doubles, three times
        backend.back_rows(array, held, grown)
        assert np.isnan(array[held:grown]).all()  # new rows: 0xFF bytes until written
        values = rng.standard_normal((grown - held, dim)).astype(np.float32)
        array[held:grown] = values
        reference[held:grown] = values
        held = grown
        np.testing.assert_array_equal(array[:held], reference[:held])
        assert array.__array_interface__["data"][0] == address
        assert held * dim * 4 <= backend.backed_bytes(array) <= held * dim * 4 + PAGE


def test_members_back_their_own_rows_and_unback_only_what_a_call_backed():
    array = backend.reserved_rows((3 * 1000, 3), np.int64)  # three members of 1000 rows
    backend.back_rows(array, 0, 10)
    backend.back_rows(array, 1000, 1010)
    array[0:10] = 7
    array[1000:1010] = 8
    before = backend.backed_bytes(array)
    pages = backend.back_rows(array, 5, 900)  # the first member grows: its first page kept
    assert backend.backed_bytes(array) > before
    array[10:900] = 9
    backend.unback_rows(array, pages)  # a growth that failed gives back what it backed
    assert backend.backed_bytes(array) == before
    assert (array[0:10] == 7).all() and (array[1000:1010] == 8).all()
    backend.back_rows(array, 0, 900)
    kept = PAGE // 24  # rows wholly in the first page, backed throughout, keep their bytes
    assert (array[0:10] == 7).all() and (array[10:kept] == 9).all()
    shared = (1000 * 24 // PAGE) * PAGE // 24  # from here on the next member's first page
    assert (array[kept + 1:shared] == -1).all()  # reopened: 0xFF (row `kept` straddles pages)
    assert (array[shared + 1:900] == 9).all()


def test_a_view_keeps_the_range_and_a_plain_array_is_refused():
    array = backend.reserved_rows((1 << 20, 2), np.float64)
    backend.back_rows(array, 0, 4)
    array[:4] = 3.0
    view = backend.row_view(array, 1, 3)
    del array
    gc.collect()
    np.testing.assert_array_equal(view, np.full((2, 2), 3.0))
    with pytest.raises(TypeError, match="reserved_rows"):
        backend.back_rows(np.zeros((4, 2)), 0, 2)
