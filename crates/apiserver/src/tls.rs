//! TLS for the server: a self-signed certificate for `localhost` and `127.0.0.1`, kept in the
//! data directory so kubeconfigs stay valid across restarts. (kubectl sends bearer tokens only
//! over TLS.)

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The server's certificate and key.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Certificate, PEM (also the CA clients trust).
    pub cert_pem: String,
    /// Key, PEM.
    pub key_pem: String,
    cert_der: Vec<u8>,
    key_der: Vec<u8>,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Certificate generation failed.
    #[error("failed to generate a certificate: {0}")]
    Generate(String),
    /// Reading or writing the files failed.
    #[error("failed to {action} {path}: {source}")]
    Io {
        /// What was being done (read, write).
        action: &'static str,
        /// The certificate or key file.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// rustls refused the configuration.
    #[error("invalid TLS configuration: {0}")]
    Config(String),
}

fn pem_to_der(pem: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

impl Identity {
    /// Loads the identity from `dir`, or makes (and, with a dir, saves) a new one.
    pub fn load_or_create(dir: Option<&Path>) -> Result<Identity, TlsError> {
        if let Some(dir) = dir {
            let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
            if let (Ok(cert_pem), Ok(key_pem)) = (
                std::fs::read_to_string(&cert),
                std::fs::read_to_string(&key),
            ) && let (Some(cert_der), Some(key_der)) =
                (pem_to_der(&cert_pem), pem_to_der(&key_pem))
            {
                return Ok(Identity {
                    cert_pem,
                    key_pem,
                    cert_der,
                    key_der,
                });
            }
        }
        let generated = rcgen::generate_simple_self_signed(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ])
        .map_err(|e| TlsError::Generate(e.to_string()))?;
        let identity = Identity {
            cert_pem: generated.cert.pem(),
            key_pem: generated.signing_key.serialize_pem(),
            cert_der: generated.cert.der().to_vec(),
            key_der: generated.signing_key.serialize_der(),
        };
        if let Some(dir) = dir {
            durable_log::files::create_durable_private_dir(dir).map_err(|source| TlsError::Io {
                action: "create",
                path: dir.display().to_string(),
                source,
            })?;
            // Every file in the data directory is 0600, the certificate included.
            for (name, text) in [
                ("server.crt", &identity.cert_pem),
                ("server.key", &identity.key_pem),
            ] {
                let path = dir.join(name);
                durable_log::files::write_private_atomic(&path, text.as_bytes()).map_err(
                    |source| TlsError::Io {
                        action: "write",
                        path: path.display().to_string(),
                        source,
                    },
                )?;
            }
        }
        Ok(identity)
    }

    /// The rustls acceptor (HTTP/2 and HTTP/1.1).
    pub fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(self.cert_der.clone())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone())),
            )
            .map_err(|e| TlsError::Config(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }

    /// Base64 of the certificate PEM, for `certificate-authority-data`.
    pub fn ca_data(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(self.cert_pem.as_bytes())
    }
}
