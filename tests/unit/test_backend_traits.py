"""The backend table's traits, and the rule that nothing outside it branches on a name."""

from __future__ import annotations

import ast
import pathlib

from elastic_train._internal.rendezvous_backends import BACKENDS, StateHome, lookup
from elastic_train.errors import RendezvousLostError

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "elastic_train"
TABLE = PACKAGE / "_internal" / "rendezvous_backends.py"


def test_traits_say_where_state_lives_and_what_the_endpoint_is():
    assert lookup("c10d", "x").endpoint_is_node_store
    assert lookup("c10d", "x").state is StateHome.NODE_STORE
    assert lookup("etcd", "x").state is lookup("etcd-v3", "x").state is StateHome.ETCD
    assert not lookup("etcd", "x").endpoint_is_node_store
    static = lookup("static", "x")
    assert not static.elastic and not static.store_per_round


def test_a_lost_node_store_says_which_node_and_the_fix():
    lost = str(RendezvousLostError.for_backend("c10d", "node0:29400", OSError("reset"), True))
    assert "node hosting it" in lost and "--rdzv-backend etcd" in lost
    other = str(RendezvousLostError.for_backend("etcd", "etcd:2379", OSError("reset"), False))
    assert "outage_timeout" in other


def _name_comparisons(path: pathlib.Path) -> list[str]:
    names = {n for backend in BACKENDS for n in backend.names}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                if isinstance(operand, ast.Constant) and operand.value in names:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_no_module_compares_a_backend_name():
    """Code that must know how a backend behaves reads a trait of the table's entry."""
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != TABLE
             for hit in _name_comparisons(path)]
    assert found == []
