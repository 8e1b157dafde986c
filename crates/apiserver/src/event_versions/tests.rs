use serde_json::json;

use super::*;
use crate::registry::Registry;

fn meta(name: &str) -> Value {
    json!({"name": name, "namespace": "default", "uid": "u", "resourceVersion": "209",
        "creationTimestamp": "2026-11-29T05:58:16Z"})
}

/// An Event as `kubectl create` sent it through events.k8s.io/v1 to kube-apiserver v1.36.2.
fn v1_event(name: &str) -> Value {
    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta(name),
        "eventTime": "2026-11-29T06:00:00.000001Z", "reportingController": "ctl",
        "reportingInstance": "inst", "action": "Act", "reason": "Why", "type": "Normal",
        "regarding": {"kind": "Pod", "name": "p", "namespace": "default"}, "note": "hello"})
}

fn events_v1() -> Arc<ResourceType> {
    Registry::built_in("events.k8s.io", "events")
}

/// An Event created through events.k8s.io/v1 (as `kubectl create` sent it to kube-apiserver
/// v1.36.2), and as that server answered a core/v1 GET of it (managedFields left out).
#[test]
fn an_events_v1_event_is_stored_and_read_as_kube_apiserver_reads_it_through_core_v1() {
    let sent = v1_event("e1");
    let stored = stored(&events_v1(), sent.clone());
    assert_eq!(
        stored,
        json!({"apiVersion": "v1", "kind": "Event", "metadata": meta("e1"),
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": "p"},
            "reason": "Why", "message": "hello", "type": "Normal",
            "eventTime": "2026-11-29T06:00:00.000001Z", "action": "Act",
            "reportingComponent": "ctl", "reportingInstance": "inst"})
    );
    // kube-apiserver's core/v1 answer adds the zero values Go renders; ours serves the
    // stored form to core/v1 readers (their fields and values are the same otherwise).
    let kube_core_answer = json!({"kind": "Event", "apiVersion": "v1", "metadata": meta("e1"),
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "p"},
        "reason": "Why", "message": "hello", "source": {}, "firstTimestamp": null,
        "lastTimestamp": null, "type": "Normal", "eventTime": "2026-11-29T06:00:00.000001Z",
        "action": "Act", "reportingComponent": "ctl", "reportingInstance": "inst"});
    assert_eq!(with_zero_values(stored.clone(), CORE), kube_core_answer);
    // Read back through events.k8s.io/v1: kube-apiserver's answer to the create.
    let kube_v1_answer = json!({"action": "Act", "apiVersion": "events.k8s.io/v1",
        "deprecatedFirstTimestamp": null, "deprecatedLastTimestamp": null,
        "deprecatedSource": {}, "eventTime": "2026-11-29T06:00:00.000001Z", "kind": "Event",
        "metadata": meta("e1"), "note": "hello", "reason": "Why",
        "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reportingController": "ctl", "reportingInstance": "inst", "type": "Normal"});
    assert_eq!(*served(&events_v1(), Arc::new(stored)), kube_v1_answer);
}

/// An Event created through core/v1 (as client-go's recorder writes them), and as kube-apiserver
/// v1.36.2 answered an events.k8s.io/v1 GET of it.
#[test]
fn a_core_event_is_read_through_events_v1_as_kube_apiserver_reads_it() {
    let stored_core = json!({"apiVersion": "v1", "kind": "Event", "metadata": meta("e2"),
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "R", "message": "m", "count": 3, "type": "Warning",
        "firstTimestamp": "2026-11-29T06:00:00Z", "lastTimestamp": "2026-11-29T06:01:00Z",
        "source": {"component": "c"}, "reportingComponent": "", "reportingInstance": ""});
    let kube_v1_answer = json!({"kind": "Event", "apiVersion": "events.k8s.io/v1",
        "metadata": meta("e2"), "eventTime": null, "reason": "R",
        "regarding": {"kind": "Pod", "namespace": "default", "name": "p"}, "note": "m",
        "type": "Warning", "deprecatedSource": {"component": "c"},
        "deprecatedFirstTimestamp": "2026-11-29T06:00:00Z",
        "deprecatedLastTimestamp": "2026-11-29T06:01:00Z", "deprecatedCount": 3});
    assert_eq!(*served(&events_v1(), Arc::new(stored_core)), kube_v1_answer);
}

#[test]
fn a_round_trip_through_events_v1_adds_nothing_to_what_is_stored() {
    let rt = events_v1();
    let rows = [
        json!({"apiVersion": "v1", "kind": "Event", "metadata": meta("a"),
            "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "R", "message": "m"}),
        json!({"apiVersion": "v1", "kind": "Event", "metadata": meta("b"),
            "involvedObject": {"kind": "Node", "name": "n"}, "count": 2,
            "source": {"component": "kubelet", "host": "n"},
            "series": {"count": 4, "lastObservedTime": "2026-11-29T06:00:00.000001Z"},
            "related": {"kind": "Pod", "name": "q"}, "reportingComponent": "kubelet"}),
    ];
    for stored_form in rows {
        let read = served(&rt, Arc::new(stored_form.clone()));
        assert_eq!(
            stored(&rt, Arc::unwrap_or_clone(read)),
            stored_form,
            "{stored_form}"
        );
    }
}

#[test]
fn a_field_named_as_the_other_version_names_one_does_not_overwrite_it() {
    // `note` is not a core/v1 field (stored by a write that did not ask for validation).
    let core = json!({"apiVersion": "v1", "kind": "Event", "message": "real", "note": "stray",
        "involvedObject": {"name": "p"}, "regarding": {"name": "stray"}});
    let read = convert(&core, EVENTS_V1);
    assert_eq!(read["note"], "real");
    assert_eq!(read["regarding"], json!({"name": "p"}));
    let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "note": "real",
        "message": "stray", "count": 9, "deprecatedCount": 2});
    let core = convert(&v1, CORE);
    assert_eq!(core["message"], "real");
    assert_eq!(core["count"], 2);
}

#[test]
fn only_events_v1_is_converted() {
    let claims = Registry::built_in("", "persistentvolumeclaims");
    let core_events = Registry::built_in("", "events");
    let object = json!({"apiVersion": "v1", "kind": "Event", "message": "m"});
    for rt in [claims, core_events] {
        assert!(!rt.stored_as_core_events());
        assert_eq!(*served(&rt, Arc::new(object.clone())), object);
        assert_eq!(stored(&rt, object.clone()), object);
    }
    assert!(events_v1().stored_as_core_events());
    assert_eq!(events_v1().key(), "/events");
    assert_eq!(Registry::built_in("", "events").key(), "/events");
}

/// kube-apiserver v1.36.2's answer to a merge patch through events.k8s.io/v1 changing every
/// field of an Event (e1 above); a patch of the series or the metadata passes.
#[test]
fn an_update_through_events_v1_may_change_only_the_series_and_metadata() {
    let old = served(
        &events_v1(),
        Arc::new(
            json!({"apiVersion": "v1", "kind": "Event", "metadata": meta("e1"),
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": "p"},
            "reason": "Why", "message": "hello", "type": "Normal",
            "eventTime": "2026-11-29T06:00:00.000001Z", "action": "Act",
            "reportingComponent": "ctl", "reportingInstance": "inst"}),
        ),
    );
    let patched =
        |patch: Value| crate::patch::apply(crate::patch::PatchKind::Merge, &old, &patch).unwrap();
    let new = patched(
        json!({"note": "x", "reason": "y", "type": "Warning", "action": "z",
            "regarding": {"name": "q"}, "deprecatedCount": 5, "reportingController": "c2",
            "reportingInstance": "i2", "eventTime": "2026-11-29T07:00:00.000001Z",
            "related": {"name": "r"}, "deprecatedSource": {"component": "k"},
            "deprecatedFirstTimestamp": "2026-11-29T06:00:00Z",
            "deprecatedLastTimestamp": "2026-11-29T06:00:00Z"}),
    );
    let kube = [
        r#"involvedObject: Invalid value: {"Kind":"Pod","Namespace":"default","Name":"q","UID":"","APIVersion":"","ResourceVersion":"","FieldPath":""}: field is immutable"#,
        r#"reason: Invalid value: "y": field is immutable"#,
        r#"message: Invalid value: "x": field is immutable"#,
        r#"source: Invalid value: {"Component":"k","Host":""}: field is immutable"#,
        r#"firstTimestamp: Invalid value: "2026-11-29T06:00:00Z": field is immutable"#,
        r#"lastTimestamp: Invalid value: "2026-11-29T06:00:00Z": field is immutable"#,
        "count: Invalid value: 5: field is immutable",
        r#"type: Invalid value: "Warning": field is immutable"#,
        r#"eventTime: Invalid value: "2026-11-29T07:00:00.000001Z": field is immutable"#,
        r#"action: Invalid value: "z": field is immutable"#,
        r#"related: Invalid value: {"Kind":"","Namespace":"","Name":"r","UID":"","APIVersion":"","ResourceVersion":"","FieldPath":""}: field is immutable"#,
        r#"reportingController: Invalid value: "c2": field is immutable"#,
        r#"reportingInstance: Invalid value: "i2": field is immutable"#,
    ];
    assert_eq!(fixed_field_errors(&new, &old), kube);
    let new = patched(
        json!({"series": {"count": 2, "lastObservedTime": "2026-11-29T06:05:00.000000Z"},
            "metadata": {"labels": {"a": "b"}}}),
    );
    assert_eq!(fixed_field_errors(&new, &old), Vec::<String>::new());
}

/// kube-apiserver v1.36.2's answers to writes through events.k8s.io/v1 with a series: checked
/// when new or changed, before a new Event's rules or the fields an update may not change.
#[test]
fn a_series_is_checked_when_it_is_written() {
    let event = v1_event("e");
    let with =
        |patch: Value| crate::patch::apply(crate::patch::PatchKind::Merge, &event, &patch).unwrap();
    let count = r#"series.count: Invalid value: "": should be at least 2"#;
    let observed = "series.lastObservedTime: Required value";
    let no_event_time = with(json!({"eventTime": null, "series": {"count": 1}}));
    // (new, old, the causes kube-apiserver answered)
    type Row<'a> = (Value, Option<&'a Value>, Option<Vec<&'a str>>);
    let rows: [Row; 8] = [
        (event.clone(), None, None),
        (
            no_event_time,
            None,
            Some(vec![count, observed, "eventTime: Required value"]),
        ),
        (
            with(json!({"series": {"count": 3}})),
            None,
            Some(vec![observed]),
        ),
        (
            with(
                json!({"series": {"count": 3, "lastObservedTime": "2026-11-29T06:05:00.000000Z"}}),
            ),
            None,
            None,
        ),
        (
            with(json!({"series": {"count": 1}, "note": "q"})),
            Some(&event),
            Some(vec![
                count,
                observed,
                r#"message: Invalid value: "q": field is immutable"#,
            ]),
        ),
        // A series stored before (through core/v1) is not checked again.
        (
            with(json!({"series": {"count": 1}, "metadata": {"labels": {"z": "1"}}})),
            Some(&with(json!({"series": {"count": 1}}))),
            None,
        ),
        (
            with(json!({"series": null})),
            Some(&with(json!({"series": {"count": 1}}))),
            None,
        ),
        // The same series as Go reads it: a null time is an absent one, an absent count 0.
        (
            with(json!({"series": {"count": 0, "lastObservedTime": null}})),
            Some(&with(json!({"series": {}}))),
            None,
        ),
    ];
    for (new, old, expected) in rows {
        let expected = expected.map(|e| e.into_iter().map(String::from).collect::<Vec<_>>());
        assert_eq!(write_errors(&new, old), expected, "{new}");
    }
}

/// Times are compared as instants and printed as Go prints them (UTC; a `metav1.Time` to the
/// second, `eventTime` to the microsecond), not as written.
#[test]
fn times_are_compared_as_instants() {
    let old = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta("t"),
        "deprecatedFirstTimestamp": "2026-11-29T08:00:00+02:00",
        "eventTime": "2026-11-29T06:00:00.000001Z"});
    let same = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta("t"),
        "deprecatedFirstTimestamp": "2026-11-29T06:00:00Z",
        "eventTime": "2026-11-29T07:00:00.000001+01:00"});
    assert_eq!(fixed_field_errors(&same, &old), Vec::<String>::new());
    let moved = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta("t"),
        "deprecatedFirstTimestamp": "2026-11-29T09:00:00+02:00",
        "eventTime": "2026-11-29T07:00:00.000002+01:00"});
    assert_eq!(
        fixed_field_errors(&moved, &old),
        [
            r#"firstTimestamp: Invalid value: "2026-11-29T07:00:00Z": field is immutable"#,
            r#"eventTime: Invalid value: "2026-11-29T06:00:00.000002Z": field is immutable"#,
        ]
    );
}
