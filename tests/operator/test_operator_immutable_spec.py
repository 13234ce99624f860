"""The immutable-spec policy (operator/immutable_spec.py): the first reconcile records the hash, a later
change to an immutable field is refused with one message, other fields change freely."""

from __future__ import annotations

import copy

from tracefleet.operator.immutable_spec import ANNOTATION_SPEC_HASH, REFUSED_MESSAGE, check_spec, immutable_hash

SPEC = {"inference": {"external": {"baseUrl": "http://e:8000"}}, "harness": {"preset": "codex", "image": "i"},
        "tasks": {"inline": [{"id": "t", "prompt": "p"}]}, "output": {"uri": "s3://b/r"}, "parallelism": 2}


def test_the_hash_is_recorded_once_and_stays_what_earlier_operators_recorded() -> None:
    # the value recorded on running jobs: a new hashing would refuse every job's spec after an upgrade
    assert immutable_hash(SPEC) == "11187c6a4fa68a8f"
    first = check_spec(SPEC, {})
    assert first.record == {ANNOTATION_SPEC_HASH: "11187c6a4fa68a8f"} and first.refused == ""
    again = check_spec(SPEC, first.record)
    assert again.record == {} and again.refused == ""


def test_a_change_to_an_immutable_field_is_refused_and_others_are_not() -> None:
    recorded = check_spec(SPEC, None).record
    scaled = {**SPEC, "parallelism": 8, "suspend": True}
    assert check_spec(scaled, recorded).refused == ""
    changed = copy.deepcopy(SPEC)
    changed["harness"]["image"] = "other"
    refused = check_spec(changed, recorded)
    assert refused.refused == REFUSED_MESSAGE and refused.record == {}
    assert REFUSED_MESSAGE.startswith("changes to spec.{inference,harness,tasks,evaluator,output} are not applied")
