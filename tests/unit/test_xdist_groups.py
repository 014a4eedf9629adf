"""`make test` (-n 3 --dist loadgroup) runs each xdist_group on one worker: the Ray group on
one local Ray, the embedded model's two answering tests on one server. pytest-xdist writes
the group as a suffix of the test's id (`test_x@ray`), which pytest 9.2 stopped reading
(pytest-xdist issue 1386): tests/conftest.py writes it where pytest reads it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import _group_suffix_read


@pytest.mark.xdist_group("probe")
def test_a_grouped_test_runs_under_its_group_on_a_loadgroup_worker(request):
    """BUG: under `make test` every group was spread over the three workers, each starting
    its own local Ray (about 10 core-s a start)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("run alone or without --dist loadgroup: no worker, no group")
    assert request.node.nodeid.endswith("@probe"), request.node.nodeid


def test_the_suffix_xdist_wrote_becomes_the_id_pytest_reads():
    item = SimpleNamespace(nodeid="tests/x.py::test_a[1]", _id=None, _nodeid="tests/x.py::test_a[1]@ray")
    _group_suffix_read([item])
    assert str(item._id) == "tests/x.py::test_a[1]@ray"
    alone = SimpleNamespace(nodeid="tests/x.py::test_b", _id="kept")  # no group: untouched
    _group_suffix_read([alone])
    assert alone._id == "kept"
