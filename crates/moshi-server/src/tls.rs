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

/// Largest PEM file read (a certificate chain or key is a few KB; a long chain tens of KB): a
/// device such as `/dev/zero` or a huge file must not be read into memory without end.
pub const MAX_PEM_BYTES: u64 = 4 * 1024 * 1024;

/// Reads at most [`MAX_PEM_BYTES`] of `path`; more is an error naming `flag`.
fn read_pem(flag: &'static str, path: &Path) -> Result<Vec<u8>, ServerError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| bad(flag, path, e))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(flag, path, e))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(bad(
            flag,
            path,
            format!(
                "larger than {} MiB: not a PEM file",
                MAX_PEM_BYTES / (1024 * 1024)
            ),
        ));
    }
    Ok(bytes)
}

impl TlsFiles {
    /// Reads and checks both files and builds the acceptor.
    pub fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
        let cert_pem = read_pem("--tls-cert", &self.cert)?;
        let key_pem = read_pem("--tls-key", &self.key)?;
        let config = self.server_config(&cert_pem, &key_pem)?;
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }

    /// The rustls configuration of a PEM certificate chain and a PEM private key (the contents
    /// of [`Self::cert`] and [`Self::key`], named in errors).
    pub fn server_config(
        &self,
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<rustls::ServerConfig, ServerError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
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
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
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
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #41 defect 8: `--tls-cert /dev/zero` was read without end (GBs in seconds).
    #[test]
    fn an_endless_pem_file_is_refused_naming_its_flag() {
        let files = TlsFiles {
            cert: "/dev/zero".into(),
            key: "/dev/zero".into(),
        };
        let e = files.acceptor().err().unwrap().to_string();
        assert!(e.contains("--tls-cert") && e.contains("larger than"), "{e}");
        // The key is read after a valid certificate only; its reader is the same.
        let e = read_pem("--tls-key", Path::new("/dev/zero"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--tls-key") && e.contains("/dev/zero"), "{e}");
        assert!(e.contains("larger than 4 MiB"), "{e}");
    }
}
