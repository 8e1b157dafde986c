//! The CSI Identity service.

use csi::identity_server::Identity;
use csi::plugin_capability::service::Type as Service;
use csi_proto::v1 as csi;
use tonic::{Request, Response, Status};

use crate::driver::Driver;

type Reply<T> = std::result::Result<Response<T>, Status>;

#[tonic::async_trait]
impl Identity for Driver {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Reply<csi::GetPluginInfoResponse> {
        self.call("GetPluginInfo", async {
            Ok(csi::GetPluginInfoResponse {
                name: self.cfg.name.clone(),
                vendor_version: env!("CARGO_PKG_VERSION").to_string(),
                // Volumes carry the provisioner's marks and are listed from the moment
                // CreateVolume records them (sidecar_kit::recoverable).
                manifest: [(
                    sidecar_kit::recoverable::MANIFEST_KEY.to_string(),
                    sidecar_kit::recoverable::VERSION.to_string(),
                )]
                .into(),
            })
        })
        .await
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Reply<csi::GetPluginCapabilitiesResponse> {
        self.call("GetPluginCapabilities", async {
            let mut services = vec![Service::ControllerService];
            if self.cfg.topology_key.is_some() {
                services.push(Service::VolumeAccessibilityConstraints);
            }
            if self.cfg.features.group_snapshots {
                services.push(Service::GroupControllerService);
            }
            let mut capabilities: Vec<csi::PluginCapability> = services
                .into_iter()
                .map(|service| csi::PluginCapability {
                    r#type: Some(csi::plugin_capability::Type::Service(
                        csi::plugin_capability::Service {
                            r#type: service as i32,
                        },
                    )),
                })
                .collect();
            if self.cfg.features.expansion {
                capabilities.push(csi::PluginCapability {
                    r#type: Some(csi::plugin_capability::Type::VolumeExpansion(
                        csi::plugin_capability::VolumeExpansion {
                            r#type: csi::plugin_capability::volume_expansion::Type::Online as i32,
                        },
                    )),
                });
            }
            Ok(csi::GetPluginCapabilitiesResponse { capabilities })
        })
        .await
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Reply<csi::ProbeResponse> {
        self.call("Probe", async {
            Ok(csi::ProbeResponse {
                ready: Some(self.store.healthy()),
            })
        })
        .await
    }
}
