//! Read, change, write back: the `update` verb of an object our caches keep only in part. The
//! object is read live (whole: a cache's trimmed copy written back would drop the fields it
//! left out), changed by a pure edit, and written with its resourceVersion; a conflict reads it
//! again. This is what the Go sidecars do with their informers' full objects, and it needs only
//! the `get` and `update` verbs their RBAC grants (a PATCH would need `patch`).

use kube::api::{Api, PostParams};

/// Conflicts retried before the last one is returned.
pub const CONFLICT_RETRIES: usize = 5;

/// What [`update_live`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Updated<K> {
    /// The edit changed the object and the change was written (the object as stored).
    Written(K),
    /// The edit left the object as it was; nothing was written.
    Unchanged(K),
    /// The object does not exist.
    Gone,
}

/// Reads `name`, applies `edit` (which answers whether it changed anything) and writes the
/// result back under the resourceVersion it was read at; on a conflict it reads again, up to
/// [`CONFLICT_RETRIES`] times. Errors other than 404 on the read are returned as they are.
pub async fn update_live<K>(
    api: &Api<K>,
    name: &str,
    mut edit: impl FnMut(&mut K) -> bool,
) -> Result<Updated<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mut attempt = 0;
    loop {
        let Some(mut object) = api.get_opt(name).await? else {
            return Ok(Updated::Gone);
        };
        if !edit(&mut object) {
            return Ok(Updated::Unchanged(object));
        }
        match api.replace(name, &PostParams::default(), &object).await {
            Ok(written) => return Ok(Updated::Written(written)),
            Err(error) if crate::api_errors::is_not_found(&error) => return Ok(Updated::Gone),
            Err(error) if crate::api_errors::is_conflict(&error) && attempt < CONFLICT_RETRIES => {
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    async fn server() -> (apiserver::RunningServer, kube::Client) {
        let server = apiserver::serve(apiserver::Config::default(), std::future::pending())
            .await
            .unwrap();
        let local = server.local_service("update-test").unwrap();
        let client = kube::Client::new(local, "default");
        (server, client)
    }

    fn map(name: &str, value: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "data": {"key": value, "other": "kept"},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn an_edit_is_written_whole_a_no_op_writes_nothing_and_a_missing_object_is_gone() {
        let (_server, client) = server().await;
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        api.create(&PostParams::default(), &map("m", "a"))
            .await
            .unwrap();
        let written = update_live(&api, "m", |m: &mut ConfigMap| {
            m.data
                .get_or_insert_default()
                .insert("key".into(), "b".into());
            true
        })
        .await
        .unwrap();
        let Updated::Written(stored) = written else {
            panic!("{written:?}");
        };
        let data = stored.data.unwrap();
        assert_eq!(data["key"], "b");
        assert_eq!(data["other"], "kept", "fields the edit did not touch stay");
        let version = stored.metadata.resource_version.clone();
        let unchanged = update_live(&api, "m", |_| false).await.unwrap();
        assert!(
            matches!(&unchanged, Updated::Unchanged(m) if m.metadata.resource_version == version),
            "{unchanged:?}"
        );
        assert_eq!(
            update_live(&api, "missing", |_| true).await.unwrap(),
            Updated::Gone
        );
    }

    #[tokio::test]
    async fn a_conflict_reads_the_object_again_and_edits_the_new_version() {
        let (_server, client) = server().await;
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let created = api
            .create(&PostParams::default(), &map("m", "a"))
            .await
            .unwrap();
        // Someone else writes after the version our first read will be made to see.
        let mut theirs = created.clone();
        theirs
            .data
            .get_or_insert_default()
            .insert("other".into(), "theirs".into());
        api.replace("m", &PostParams::default(), &theirs)
            .await
            .unwrap();
        let mut calls = 0;
        let written = update_live(&api, "m", |m: &mut ConfigMap| {
            calls += 1;
            if calls == 1 {
                // As if read before their write: the write back conflicts.
                m.metadata.resource_version = created.metadata.resource_version.clone();
            }
            m.data
                .get_or_insert_default()
                .insert("key".into(), "ours".into());
            true
        })
        .await
        .unwrap();
        assert_eq!(calls, 2, "the conflict made it read and edit again");
        let Updated::Written(stored) = written else {
            panic!("{written:?}");
        };
        let data = stored.data.unwrap();
        assert_eq!(data["key"], "ours");
        assert_eq!(
            data["other"], "theirs",
            "the other writer's change survives"
        );
    }
}
