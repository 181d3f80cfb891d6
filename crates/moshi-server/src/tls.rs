//! `--tls-cert F --tls-key F`: HTTPS and WSS with rustls (browsers open the microphone only on
//! localhost or https, so this is how another machine reaches the server without a tunnel).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::ServerError;

/// A PEM certificate chain and its PEM private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn bad(flag: &'static str, path: &Path, detail: impl std::fmt::Display) -> ServerError {
    ServerError::Tls {
        flag,
        path: path.to_path_buf(),
        detail: detail.to_string(),
    }
}

impl TlsFiles {
    /// Reads and checks both files and builds the acceptor.
    pub fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
        let cert_pem = std::fs::read(&self.cert).map_err(|e| bad("--tls-cert", &self.cert, e))?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| {
                bad(
                    "--tls-cert",
                    &self.cert,
                    format!("not a PEM certificate: {e}"),
                )
            })?;
        if certs.is_empty() {
            return Err(bad(
                "--tls-cert",
                &self.cert,
                "no certificate in it (expected PEM \"-----BEGIN CERTIFICATE-----\")",
            ));
        }
        let key_pem = std::fs::read(&self.key).map_err(|e| bad("--tls-key", &self.key, e))?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            bad(
                "--tls-key",
                &self.key,
                format!("no PEM private key in it (PKCS#8, PKCS#1 or SEC1 expected): {e}"),
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("--tls-cert", &self.cert, e))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| {
                bad(
                    "--tls-key",
                    &self.key,
                    format!(
                        "does not go with the certificate {}: {e}",
                        self.cert.display()
                    ),
                )
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}
