"""The vocabulary's words are the strings they replace: records, results and baselines on disk
stay byte-identical, and words read back from a file compare equal to the members."""

from __future__ import annotations

import json
import sqlite3


from pytest_ddtree.gates.throughput import rule, verdicts
from pytest_ddtree.measure import stats
from pytest_ddtree.baselines import dump_yaml
from pytest_ddtree.records.recorder import dumps
from pytest_ddtree.records.words import RecordKind, Status


def test_a_word_is_written_as_its_string_everywhere() -> None:
    record = {"kind": RecordKind.THROUGHPUT_REPEAT, "status": Status.METRIC_MISSING, Status.PASS: [Status.NOT_MEASURED]}
    plain = {"kind": "throughput-repeat", "status": "metric-missing", "pass": ["not measured"]}
    assert dumps(record) == dumps(plain) == json.dumps(plain, sort_keys=True)
    assert dump_yaml(record) == dump_yaml(plain)
    assert (str(Status.PASS), f"{RecordKind.HOST_ENV}", f"{Status.NEW:>5}", "-".join([Status.THIN])) == ("pass", "host-env", "  new", "thin")
    with sqlite3.connect(":memory:") as db:  # the history database stores statuses as TEXT
        db.execute("CREATE TABLE t (status TEXT)")
        db.execute("INSERT INTO t VALUES (?)", (Status.REGRESSION,))
        assert db.execute("SELECT status FROM t").fetchone() == ("regression",)


def test_a_word_read_back_from_json_is_the_member() -> None:
    back = json.loads(dumps({"kind": RecordKind.LAUNCH, "measurement_status": Status.INVALID}))
    assert back == {"kind": RecordKind.LAUNCH, "measurement_status": Status.INVALID}
    assert RecordKind(back["kind"]) is RecordKind.LAUNCH and back["kind"] in {RecordKind.LAUNCH}
    # one name per word: the gate's and the statistics' aliases of Status are gone
    assert not any(hasattr(verdicts, w.name) or hasattr(rule, w.name) or hasattr(stats, w.name) for w in Status)
    assert len({k.value for k in RecordKind}) == len(RecordKind) and len({s.value for s in Status}) == len(Status)
