"""Node policies for the tests, loaded by dotted path as users' would be
(``--rdzv-conf node_policy=tests.support.node_policies:AdmitListed``)."""

from __future__ import annotations

import os

from elastic_train.agent.health_checks import CommandCheck
from elastic_train.agent.health_policy import HealthPolicy
from elastic_train.agent.node_policy import (
    ADMITTED,
    STAY,
    Admission,
    Candidate,
    ChargedFailures,
    NodePolicy,
    NodeVerdict,
    leave,
    refused,
)

ADMITTED_VARIABLE = "ET_TEST_ADMITTED_NODES"  # comma-separated node names


class AdmitListed(NodePolicy):
    """Admits only the nodes named in ``$ET_TEST_ADMITTED_NODES`` (read per process, so
    that each agent of a test can hold a policy of its own)."""

    def admit(self, candidate: Candidate) -> Admission:
        listed = os.environ.get(ADMITTED_VARIABLE, "").split(",")
        return ADMITTED if candidate.name in listed else refused(
            f"{candidate.name} is not on the test's list")


class LeaveAfterTwoInARow(NodePolicy):
    """Sends a node away after two failures in a row charged to it (#26's default rule)."""

    def after_failure(self, charged: ChargedFailures) -> NodeVerdict:
        if charged.in_a_row >= 2:
            return leave(f"{charged.in_a_row} failures in a row", cool_off_s=60)
        return STAY


HEALTH_MARKER = "ET_TEST_HEALTH_MARKER"  # a path: the node is sick once the file has bytes


class SickOnceStarted(HealthPolicy):
    """The built-in health policy with one check, failing once the file named by
    ``$ET_TEST_HEALTH_MARKER`` is not empty (the test script writes it as it starts), and
    with no limit on failures in a row, so only the check can send the node away."""

    failures_in_a_row = 0

    def checks(self):
        return [CommandCheck(("sh", "-c", f'test ! -s "${HEALTH_MARKER}" || '
                              '{ echo "ECC errors: 12" >&2; exit 3; }'))]


class SickFromTheStart(HealthPolicy):
    """The built-in health policy whose devices check always fails."""

    def checks(self):
        return [CommandCheck(("sh", "-c", 'echo "GPU 3 fell off the bus" >&2; exit 1'))]


SICK_FILE = "ET_TEST_SICK_FILE"  # a path: the node's check fails while it exists
SHORT_COOL_OFF_S = 12.0


class SickWhileMarked(HealthPolicy):
    """The built-in health policy with one check, failing while the file named by
    ``$ET_TEST_SICK_FILE`` exists, no limit on failures in a row, and a cooling-off
    period short enough for a test to see it end."""

    failures_in_a_row = 0
    cool_off_s = SHORT_COOL_OFF_S

    def checks(self):
        return [CommandCheck(("sh", "-c", f'test ! -e "${SICK_FILE}" || '
                              '{ echo "marked sick" >&2; exit 1; }'))]
