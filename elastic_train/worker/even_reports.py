"""Every rank must call ``report()`` the same number of times: what it costs to know, and
what a rank that returned early is told.

``report()`` is collective. A rank whose train function returns while another is
still in a ``report()`` would leave that one waiting for a peer that is gone (gloo's
"Connection closed by peer" some seconds later, or a hang). So a returning rank takes
part in one last round of the report's first collective (the all_reduce every
``report()`` starts with), saying that it returned and after how many calls; every
rank then learns who returned early, and all of them fail with the same message.

Example::

    uneven_reports(returned=[0.0, 1.0], calls=[1.0, 0.0])
    # ConfigError: report() must be called by every rank the same number of times;
    # rank 1 returned after 0 calls while rank 0 made call 1 ...
"""

from __future__ import annotations

from collections.abc import Sequence

from elastic_train.errors import ConfigError

_NAMED = 8  # ranks named in the message; the rest are counted


def _ranks(ranks: list[int]) -> str:
    named = ", ".join(str(r) for r in ranks[:_NAMED])
    more = f" and {len(ranks) - _NAMED} more" if len(ranks) > _NAMED else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {named}{more}"


def _calls(count: int) -> str:
    return f"{count} call{'' if count == 1 else 's'}"


def uneven_reports(returned: Sequence[float], calls: Sequence[float]) -> ConfigError | None:
    """The error of a group where some ranks returned (``returned[rank]`` 1) while the
    others were in their call number ``calls[rank]`` of ``report()``; None when every
    rank returned (their counts then agree: each report is one round for all)."""
    gone = [r for r, done in enumerate(returned) if done]
    staying = [r for r, done in enumerate(returned) if not done]
    if not staying:
        return None
    by_count: dict[int, list[int]] = {}
    for rank in gone:
        by_count.setdefault(int(calls[rank]), []).append(rank)
    said = "; ".join(f"{_ranks(ranks)} returned after {_calls(count)}"
                     for count, ranks in sorted(by_count.items()))
    return ConfigError(
        f"report() must be called by every rank the same number of times; {said} while "
        f"{_ranks(staying)} made call {int(calls[staying[0]])}. Call report() on every "
        "rank (rank 0's metrics are the ones recorded), e.g. with the same loop bounds "
        "on all ranks.")
