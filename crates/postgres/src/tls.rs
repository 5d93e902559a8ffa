//! TLS for every connection keiro opens (the pool, the `LISTEN` connection, and the dedicated
//! connections of the CLI and of callers), with libpq's `sslmode` semantics, over rustls.
//!
//! | `sslmode` | TLS | what is verified |
//! | --- | --- | --- |
//! | `disable` | never | nothing |
//! | `prefer` (libpq's default) | when the server offers it, else plain | nothing |
//! | `require` | always | nothing; the chain when `sslrootcert` names a file, as libpq |
//! | `verify-ca` | always | the chain, against `sslrootcert` or the platform's roots |
//! | `verify-full` | always | the chain, and that the certificate names the host |
//!
//! `sslrootcert=<file>` trusts the certificates of that PEM file alone, as libpq does; without
//! it the platform's trusted roots are used. `sslrootcert=system` names those roots and, as in
//! libpq, implies `verify-full`: a weaker `sslmode` next to it is refused. Unlike libpq,
//! `~/.postgresql/root.crt` is not read: a connection string says what it trusts.
//!
//! "Nothing verified" still checks the handshake's signatures, so the session is encrypted
//! and bound to the key the server presented; it is not authenticated, which is what libpq's
//! `prefer` and `require` give too.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How a connection uses TLS: libpq's `sslmode`, set in the connection string
/// (`?sslmode=verify-full` or `sslmode=verify-full`).
///
/// ```
/// use keiro_postgres::SslMode;
///
/// let mode: SslMode = "verify-full".parse()?;
/// assert_eq!(mode, SslMode::VerifyFull);
/// assert_eq!(mode.to_string(), "verify-full");
/// assert_eq!(SslMode::default(), SslMode::Prefer); // libpq's default
/// # Ok::<(), keiro_postgres::UnknownSslMode>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, without verifying its certificate; plain otherwise.
    /// libpq's default, and keiro's.
    #[default]
    Prefer,
    /// Always TLS. The certificate is not verified unless `sslrootcert` names a file, as in
    /// libpq (then it behaves as [`VerifyCa`](Self::VerifyCa)).
    Require,
    /// Always TLS, with the certificate's chain verified against the trusted roots.
    VerifyCa,
    /// Always TLS, with the chain verified and the certificate naming the host connected to.
    VerifyFull,
}

impl SslMode {
    /// The name a connection string uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// What the driver is told: it knows whether to ask for TLS, not how to verify.
    pub(crate) fn driver_mode(self) -> tokio_postgres::config::SslMode {
        match self {
            Self::Disable => tokio_postgres::config::SslMode::Disable,
            Self::Prefer => tokio_postgres::config::SslMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `sslmode` keiro does not know (libpq's `allow` included: it tries plain first, which
/// the driver cannot do).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sslmode {0:?}: expected disable, prefer, require, verify-ca or verify-full")]
pub struct UnknownSslMode(pub String);

impl FromStr for SslMode {
    type Err = UnknownSslMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "disable" => Ok(Self::Disable),
            "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            other => Err(UnknownSslMode(other.to_owned())),
        }
    }
}

/// Where trusted roots come from: `sslrootcert`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum RootCert {
    /// The platform's trusted roots (no `sslrootcert`, or `sslrootcert=system`).
    #[default]
    System,
    /// The certificates of a PEM file, and nothing else.
    File(PathBuf),
}

impl RootCert {
    /// As `sslrootcert` spells it.
    pub(crate) fn parse(value: &str) -> Self {
        if value == "system" {
            Self::System
        } else {
            Self::File(PathBuf::from(value))
        }
    }
}

/// The TLS settings of a connection string.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct TlsSettings {
    /// `sslmode`.
    pub(crate) mode: SslMode,
    /// `sslrootcert`, when given.
    pub(crate) root_cert: Option<RootCert>,
}

/// What is checked of the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verification {
    /// Nothing: encryption without authentication.
    None,
    /// The chain, not the name.
    Chain,
    /// The chain and the name.
    Full,
}

impl TlsSettings {
    fn verification(&self) -> Verification {
        match self.mode {
            SslMode::Disable | SslMode::Prefer => Verification::None,
            // libpq: "if a root CA file exists, require behaves as verify-ca".
            SslMode::Require => match self.root_cert {
                Some(RootCert::File(_)) => Verification::Chain,
                _ => Verification::None,
            },
            SslMode::VerifyCa => Verification::Chain,
            SslMode::VerifyFull => Verification::Full,
        }
    }

    /// The connector for these settings; reads `sslrootcert` or the platform's roots when the
    /// mode verifies. `Err` says what is wrong, for a config error on the URL.
    pub(crate) fn connector(&self) -> Result<TlsConnector, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verification = self.verification();
        let verifier: Arc<dyn ServerCertVerifier> = match verification {
            Verification::None => Arc::new(Unverified(provider.clone())),
            Verification::Chain => Arc::new(ChainOnly {
                roots: Arc::new(self.roots()?),
                provider: provider.clone(),
            }),
            Verification::Full => WebPkiServerVerifier::builder_with_provider(
                Arc::new(self.roots()?),
                provider.clone(),
            )
            .build()
            .map_err(|e| format!("cannot verify with the trusted roots ({e})"))?,
        };
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("has no TLS protocol version in common with rustls ({e})"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(TlsConnector {
            mode: self.mode,
            inner: MakeRustlsConnect::new(config),
        })
    }

    /// The trusted roots: `sslrootcert`'s file alone, or the platform's.
    fn roots(&self) -> Result<RootCertStore, String> {
        let mut roots = RootCertStore::empty();
        match &self.root_cert {
            Some(RootCert::File(path)) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| {
                        format!("sslrootcert {} cannot be read as PEM ({e})", path.display())
                    })?;
                for cert in certs {
                    roots.add(cert).map_err(|e| {
                        format!(
                            "sslrootcert {} holds an unusable certificate ({e})",
                            path.display()
                        )
                    })?;
                }
                if roots.is_empty() {
                    return Err(format!(
                        "sslrootcert {} holds no certificate",
                        path.display()
                    ));
                }
            }
            None | Some(RootCert::System) => {
                let native = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(native.certs);
                if roots.is_empty() {
                    return Err(format!(
                        "sslmode={} needs trusted roots, and none were found on this system; \
                         name a CA file with sslrootcert",
                        self.mode
                    ));
                }
            }
        }
        Ok(roots)
    }
}

/// Opens TLS sessions for tokio-postgres as the connection string's `sslmode` and
/// `sslrootcert` say; cheap to clone. What the store's connections use, for dedicated
/// connections of your own ([`PgStore::tls_connector`](crate::PgStore::tls_connector)):
///
/// ```no_run
/// # async fn demo(store: keiro_postgres::PgStore) -> Result<(), tokio_postgres::Error> {
/// let (client, connection) =
///     store.connection_config().connect(store.tls_connector().clone()).await?;
/// tokio::spawn(connection);
/// client.batch_execute("LISTEN my_channel").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TlsConnector {
    mode: SslMode,
    inner: MakeRustlsConnect,
}

impl TlsConnector {
    /// The `sslmode` this connector verifies by.
    pub fn mode(&self) -> SslMode {
        self.mode
    }
}

impl fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnector")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl<S> MakeTlsConnect<S> for TlsConnector
where
    MakeRustlsConnect: MakeTlsConnect<S>,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        MakeTlsConnect::<S>::make_tls_connect(&mut self.inner, domain)
    }
}

/// `prefer`, and `require` without a root file: any certificate, with the handshake's
/// signatures still checked against the key it holds.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the names in the certificate are not
/// compared with the host.
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The rustls error somewhere in `error`'s chain, if a TLS handshake failed on it. An
/// `io::Error`'s `source()` skips the error it wraps, so each one is opened by hand.
pub(crate) fn rustls_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(found) = e.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(found) = io
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                return Some(found);
            }
        }
        cause = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_and_map_to_the_driver() {
        for mode in [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ] {
            assert_eq!(mode.as_str().parse::<SslMode>(), Ok(mode));
        }
        assert!("allow".parse::<SslMode>().is_err());
        assert_eq!(
            SslMode::VerifyFull.driver_mode(),
            tokio_postgres::config::SslMode::Require
        );
    }

    #[test]
    fn require_verifies_the_chain_only_with_a_root_file() {
        let require = |root_cert| TlsSettings {
            mode: SslMode::Require,
            root_cert,
        };
        assert_eq!(require(None).verification(), Verification::None);
        assert_eq!(
            require(Some(RootCert::System)).verification(),
            Verification::None
        );
        assert_eq!(
            require(Some(RootCert::File("ca.pem".into()))).verification(),
            Verification::Chain
        );
        assert_eq!(RootCert::parse("system"), RootCert::System);
    }
}
