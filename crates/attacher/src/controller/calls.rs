//! The attacher's CSI calls ([`DriverCalls`]: the connection, the calls' timeout and metrics,
//! the logging and paging flags). Requests are logged at debug level without their secrets,
//! cut to `--max-grpc-log-length`.

use std::collections::HashMap;

use csi_proto::v1 as csi;
use sidecar_kit::csi::CallError;

use sidecar_kit::csi::Caller;
use tonic::transport::Channel;

use crate::decide::attach::{Detach, Publish};

/// The driver as the attacher calls it.
pub(super) struct DriverCalls {
    channel: Channel,
    calls: Caller,
    /// Longest logged gRPC message (-1: no limit).
    max_log_length: i32,
    /// ListVolumes page size (0: the driver's).
    max_entries: i32,
}

/// `text` cut to `max` bytes (at a character boundary; 0 or less: no limit, as csi-lib-utils'
/// `LogGRPC` cuts only for a positive length).
pub fn cut(text: String, max: i32) -> String {
    let Ok(max) = usize::try_from(max) else {
        return text;
    };
    if max == 0 || text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

impl DriverCalls {
    pub(super) fn new(
        channel: Channel,
        calls: Caller,
        max_log_length: i32,
        max_entries: i32,
    ) -> Self {
        DriverCalls {
            channel,
            calls,
            max_log_length,
            max_entries,
        }
    }

    fn client(&self) -> csi::controller_client::ControllerClient<tonic::transport::Channel> {
        csi::controller_client::ControllerClient::new(self.channel.clone())
    }

    /// ControllerPublishVolume; returns the publish context.
    pub(super) async fn publish(
        &self,
        publish: &Publish,
        secrets: HashMap<String, String>,
    ) -> Result<HashMap<String, String>, CallError> {
        let mut request = csi::ControllerPublishVolumeRequest {
            volume_id: publish.volume_id.clone(),
            node_id: publish.node_id.clone(),
            volume_capability: Some(publish.capability.clone()),
            readonly: publish.readonly,
            secrets: HashMap::new(),
            volume_context: publish.context.clone(),
        };
        tracing::debug!(request = %cut(format!("{request:?}"), self.max_log_length), "ControllerPublishVolume");
        request.secrets = secrets;
        let mut client = self.client();
        let response = self
            .calls
            .call_for(
                "/csi.v1.Controller/ControllerPublishVolume",
                publish.migrated,
                client.controller_publish_volume(self.calls.request(request)),
            )
            .await?;
        Ok(response.publish_context)
    }

    /// ControllerUnpublishVolume.
    pub(super) async fn unpublish(
        &self,
        detach: &Detach,
        secrets: HashMap<String, String>,
    ) -> Result<(), CallError> {
        let mut request = csi::ControllerUnpublishVolumeRequest {
            volume_id: detach.volume_id.clone(),
            node_id: detach.node_id.clone(),
            secrets: HashMap::new(),
        };
        tracing::debug!(request = %cut(format!("{request:?}"), self.max_log_length), "ControllerUnpublishVolume");
        request.secrets = secrets;
        let mut client = self.client();
        self.calls
            .call_for(
                "/csi.v1.Controller/ControllerUnpublishVolume",
                detach.migrated,
                client.controller_unpublish_volume(self.calls.request(request)),
            )
            .await
            .map(|_| ())
    }

    /// Every page of ListVolumes: volume id → the nodes it is published to.
    pub(super) async fn published(&self) -> Result<crate::decide::reconcile::Published, CallError> {
        let mut out = crate::decide::reconcile::Published::new();
        let mut client = self.client();
        let mut token = String::new();
        loop {
            let request = csi::ListVolumesRequest {
                max_entries: self.max_entries,
                starting_token: token.clone(),
            };
            let page = self
                .calls
                .call(
                    "/csi.v1.Controller/ListVolumes",
                    client.list_volumes(self.calls.request(request)),
                )
                .await?;
            for entry in page.entries {
                let (Some(volume), Some(status)) = (entry.volume, entry.status) else {
                    continue;
                };
                out.entry(volume.volume_id)
                    .or_default()
                    .extend(status.published_node_ids);
            }
            if page.next_token.is_empty() {
                return Ok(out);
            }
            token = page.next_token;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn logged_messages_are_cut_to_the_limit() {
        assert_eq!(cut("abcdef".into(), -1), "abcdef");
        assert_eq!(cut("abcdef".into(), -7), "abcdef");
        assert_eq!(cut("abcdef".into(), 0), "abcdef", "0 is no limit too");
        assert_eq!(cut("abcdef".into(), 6), "abcdef");
        assert_eq!(cut("abcdef".into(), 3), "abc...");
        assert_eq!(cut("äbc".into(), 1), "...");
    }
}
