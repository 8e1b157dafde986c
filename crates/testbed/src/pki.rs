//! The keys and certificates a control plane needs, made fresh for each one: a self-signed
//! serving certificate for `127.0.0.1` and `localhost` (clients trust it as their CA) and the
//! ECDSA key that signs and verifies ServiceAccount tokens.

use std::path::{Path, PathBuf};

use crate::Error;
use crate::binaries::io;

/// The files written by [`Pki::write`].
#[derive(Debug, Clone)]
pub struct Pki {
    /// The serving certificate (PEM), also the CA clients trust.
    pub cert: PathBuf,
    /// Its key (PKCS#8 PEM).
    pub key: PathBuf,
    /// The ServiceAccount signing key (PKCS#8 PEM).
    pub sa_key: PathBuf,
    /// Its public half (PEM), which kube-apiserver verifies tokens with.
    pub sa_pub: PathBuf,
    /// The certificate's PEM text.
    pub cert_pem: String,
}

impl Pki {
    /// Generates everything and writes it into `dir` (0600 files).
    pub fn write(dir: &Path) -> Result<Pki, Error> {
        let serving =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
                .map_err(|e| Error::Pki(e.to_string()))?;
        let sa = rcgen::KeyPair::generate().map_err(|e| Error::Pki(e.to_string()))?;
        let pki = Pki {
            cert: dir.join("serving.crt"),
            key: dir.join("serving.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
            cert_pem: serving.cert.pem(),
        };
        for (path, text) in [
            (&pki.cert, pki.cert_pem.clone()),
            (&pki.key, serving.signing_key.serialize_pem()),
            (&pki.sa_key, sa.serialize_pem()),
            (&pki.sa_pub, sa.public_key_pem()),
        ] {
            write_private(path, text.as_bytes())?;
        }
        Ok(pki)
    }

    /// Base64 of the certificate, for a kubeconfig's `certificate-authority-data`.
    pub fn ca_data(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(self.cert_pem.as_bytes())
    }
}

/// Writes a file only its owner can read.
pub(crate) fn write_private(path: &Path, data: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io("create", path))?;
    file.write_all(data).map_err(io("write", path))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_private_and_in_pem() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::write(dir.path()).unwrap();
        for (path, header) in [
            (&pki.cert, "-----BEGIN CERTIFICATE-----"),
            (&pki.key, "-----BEGIN PRIVATE KEY-----"),
            (&pki.sa_key, "-----BEGIN PRIVATE KEY-----"),
            (&pki.sa_pub, "-----BEGIN PUBLIC KEY-----"),
        ] {
            let text = std::fs::read_to_string(path).unwrap();
            assert!(text.starts_with(header), "{}: {text}", path.display());
            let mode = std::fs::metadata(path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
        assert!(!pki.ca_data().is_empty());
    }
}
