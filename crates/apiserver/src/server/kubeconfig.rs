//! The kubeconfig the server writes for its clients (mode 0600).

use super::*;

/// Where the server keeps its kubeconfig and how it is reached.
pub fn kubeconfig(address: SocketAddr, token: &str, ca_data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: volstack\n  cluster:\n    server: https://{address}\n    certificate-authority-data: {ca_data}\ncontexts:\n- name: volstack\n  context:\n    cluster: volstack\n    user: volstack-admin\n    namespace: default\ncurrent-context: volstack\nusers:\n- name: volstack-admin\n  user:\n    token: {token}\n"
    )
}

/// Writes the kubeconfig with mode 0600, atomically and durably.
pub fn write_kubeconfig(
    path: &std::path::Path,
    address: SocketAddr,
    token: &str,
    ca_data: &str,
) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        // The file holds the admin token: directories made for it are 0700 (an existing one,
        // the user's, is left as it is).
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(durable_log::files::DIR_MODE)
            .create(parent)?;
    }
    durable_log::files::write_private_atomic(path, kubeconfig(address, token, ca_data).as_bytes())
}
