"""The message for ranks that call report() unevenly (see elastic_train.worker.even_reports);
the real case, with workers, is tests/e2e/test_user_mistakes.py."""

from __future__ import annotations

from elastic_train.worker.even_reports import uneven_reports


def test_every_rank_returned_is_no_error():
    assert uneven_reports([1.0, 1.0], [3.0, 3.0]) is None


def test_the_ranks_that_returned_are_named_with_their_counts():
    error = uneven_reports([0.0, 1.0, 1.0, 0.0, 1.0], [4.0, 3.0, 3.0, 4.0, 1.0])
    assert ("rank 4 returned after 1 call; ranks 1, 2 returned after 3 calls while ranks "
            "0, 3 made call 4") in str(error)


def test_a_thousand_ranks_are_counted_not_listed():
    error = str(uneven_reports([float(r > 0) for r in range(1000)], [1.0] + [0.0] * 999))
    assert "ranks 1, 2, 3, 4, 5, 6, 7, 8 and 991 more returned after 0 calls" in error
    assert len(error) < 400
