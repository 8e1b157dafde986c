//! The plan for each state of an attachment, as a table.

use super::*;

#[test]
fn the_plan_for_each_state_of_an_attachment() {
    use Plan as P;
    let d = driver();
    let trivial = DriverView {
        publish_unpublish: false,
        ..driver()
    };
    let no_readonly = DriverView {
        publish_readonly: false,
        ..driver()
    };
    let o = Options::default();
    let mut deleting_pv = pv();
    deleting_pv.metadata.deletion_timestamp = Some(time());
    let mut annotated = deleting_va(&[F], true);
    annotated.metadata.annotations = Some(BTreeMap::from([(ANN_NODE_ID.into(), "n-old".into())]));
    let mut both = va(&[], false);
    both.spec.source.inline_volume_spec = pv().spec;
    let mut inline = va(&[], false);
    inline.spec.source.persistent_volume_name = None;
    inline.spec.source.inline_volume_spec = pv().spec;
    let mut protected = pv();
    protected.metadata.finalizers = Some(vec![F.into()]);
    let mut done = va(&[F], false);
    done.metadata.annotations = Some(BTreeMap::from([(ANN_NODE_ID.into(), "n1".into())]));
    // (case, attachment, its PV, its node's CSINode, driver, forced, the plan in short)
    type Case<'a> = (
        &'a str,
        VolumeAttachment,
        Option<PersistentVolume>,
        Option<CSINode>,
        &'a DriverView,
        bool,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "trivial driver, not attached",
            va(&[], false),
            None,
            None,
            &trivial,
            false,
            "mark",
        ),
        (
            "trivial driver, attached",
            va(&[], true),
            None,
            None,
            &trivial,
            false,
            "nothing",
        ),
        (
            "attached",
            va(&[F], true),
            Some(pv()),
            Some(csinode(Some("n1"))),
            &d,
            false,
            "nothing",
        ),
        (
            "attached, forced by the reconcile",
            va(&[F], true),
            Some(pv()),
            Some(csinode(Some("n1"))),
            &d,
            true,
            "attach",
        ),
        (
            "protected already: publish only",
            done,
            Some(protected),
            Some(csinode(Some("n1"))),
            &d,
            false,
            "attach, no writes",
        ),
        (
            "no PV",
            va(&[], false),
            None,
            Some(csinode(Some("n1"))),
            &d,
            false,
            "attach error: persistentvolume \"pv-1\" not found",
        ),
        (
            "PV being deleted",
            va(&[], false),
            Some(deleting_pv),
            Some(csinode(Some("n1"))),
            &d,
            false,
            "attach error: PersistentVolume \"pv-1\" is marked for deletion",
        ),
        (
            "no CSINode",
            va(&[], false),
            Some(pv()),
            None,
            &d,
            false,
            "attach error, volume protected, secret ns/publish first: csinode.storage.k8s.io \"node-1\" not found",
        ),
        (
            "CSINode without the driver",
            va(&[], false),
            Some(pv()),
            Some(csinode(None)),
            &d,
            false,
            "attach error, volume protected, secret ns/publish first: CSINode node-1 does not contain driver hostpath.csi.k8s.io",
        ),
        (
            "both sources",
            both,
            Some(pv()),
            Some(csinode(Some("n1"))),
            &d,
            false,
            "attach error: both InlineCSIVolumeSource and PersistentVolumeName specified in VA source",
        ),
        (
            "inline source",
            inline,
            None,
            Some(csinode(Some("n1"))),
            &d,
            false,
            "attach",
        ),
        (
            "read-only without PUBLISH_READONLY",
            va(&[], false),
            Some(pv()),
            Some(csinode(Some("n1"))),
            &no_readonly,
            false,
            "attach read-write",
        ),
        (
            "deleting without our finalizer",
            deleting_va(&[], true),
            Some(pv()),
            Some(csinode(Some("n1"))),
            &d,
            false,
            "nothing",
        ),
        (
            "deleting, only our finalizer",
            deleting_va(&[F], true),
            Some(pv()),
            Some(csinode(Some("n1"))),
            &d,
            false,
            "detach n1, release, no status",
        ),
        (
            "deleting, another finalizer too",
            deleting_va(&["x", F], true),
            Some(pv()),
            Some(csinode(Some("n1"))),
            &d,
            false,
            "detach n1, release, status",
        ),
        (
            "deleting, CSINode gone: the annotation",
            annotated.clone(),
            Some(pv()),
            None,
            &d,
            false,
            "detach n-old, release, no status",
        ),
        (
            "deleting, no node id at all",
            deleting_va(&[F], true),
            Some(pv()),
            None,
            &d,
            false,
            "detach error, secret ns/publish first: csinode.storage.k8s.io \"node-1\" not found",
        ),
        (
            "deleting, PV gone",
            deleting_va(&[F], true),
            None,
            Some(csinode(Some("n1"))),
            &d,
            false,
            "detach error: persistentvolume \"pv-1\" not found",
        ),
        (
            "deleting, released, forced",
            deleting_va(&["x"], false),
            Some(pv()),
            Some(csinode(Some("n1"))),
            &d,
            true,
            "detach n1, status clean",
        ),
    ];
    for (name, v, p, n, drv, force, want) in cases {
        let world = World {
            volume: p.as_ref(),
            csinode: n.as_ref(),
            node: None,
            driver: drv,
            options: &o,
        };
        let got = match plan(&v, world, force) {
            P::Nothing => "nothing".to_string(),
            P::MarkAttached => "mark".to_string(),
            P::Attach(a) if a.protect_attachment.is_none() && a.protect_volume.is_none() => {
                "attach, no writes".to_string()
            }
            P::Attach(a) if !a.publish.readonly => "attach read-write".to_string(),
            P::Attach(_) => "attach".to_string(),
            P::Detach(d) => format!(
                "detach {}{}{}",
                d.node_id,
                if d.release.is_some() { ", release" } else { "" },
                match (d.write_status, d.release.is_some()) {
                    (true, _) => ", status",
                    (false, true) => ", no status",
                    (false, false) => ", status clean",
                }
            ),
            P::AttachFailed {
                message,
                protect_volume,
                secret_first,
            } => format!(
                "attach error{}{}: {message}",
                if protect_volume.is_some() {
                    ", volume protected"
                } else {
                    ""
                },
                match secret_first {
                    Some(secret) => format!(", secret {}/{} first", secret.namespace, secret.name),
                    None => String::new(),
                }
            ),
            P::DetachFailed {
                message,
                secret_first,
            } => format!(
                "detach error{}: {message}",
                match secret_first {
                    Some(secret) => format!(", secret {}/{} first", secret.namespace, secret.name),
                    None => String::new(),
                }
            ),
        };
        assert_eq!(got, want, "{name}");
    }
}
