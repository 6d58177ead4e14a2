//! The sandbox CA: generated on first start and persisted in the state dir; signs the serving
//! certificate, client certificates minted for kubeconfigs, and approved CSRs.

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, DnValue, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use std::path::Path;
use time::{Duration, OffsetDateTime};

/// PKI errors.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// Certificate generation failed.
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// Reading or writing the CA files failed.
    #[error("CA files: {0}")]
    Io(#[from] std::io::Error),
    /// A CSR could not be parsed or verified.
    #[error("invalid certificate signing request: {0}")]
    BadCsr(String),
}

/// The CA (certificate PEM + key).
pub struct Ca {
    /// CA certificate, PEM.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// A certificate with its private key, both PEM.
#[derive(Debug, Clone)]
pub struct CertKey {
    /// Certificate PEM.
    pub cert_pem: String,
    /// Private key PEM (PKCS#8).
    pub key_pem: String,
}

impl Ca {
    /// Load `dir/ca.crt` + `dir/ca.key`, or create them.
    pub fn load_or_create(dir: &Path) -> Result<Self, PkiError> {
        let crt = dir.join("ca.crt");
        let key = dir.join("ca.key");
        if crt.exists() && key.exists() {
            let cert_pem = std::fs::read_to_string(&crt)?;
            let key_pem = std::fs::read_to_string(&key)?;
            let kp = KeyPair::from_pem(&key_pem)?;
            let issuer = Issuer::from_ca_cert_pem(&cert_pem, kp)?;
            return Ok(Self { cert_pem, issuer });
        }
        let kp = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "ovnk-sandbox-ca");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
        params.not_after = OffsetDateTime::now_utc() + Duration::days(3650);
        let cert = params.self_signed(&kp)?;
        let cert_pem = cert.pem();
        write_private(&key, &kp.serialize_pem())?;
        std::fs::write(&crt, &cert_pem)?;
        Ok(Self {
            cert_pem,
            issuer: Issuer::new(params, kp),
        })
    }

    fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }

    /// Serving certificate for the given names/IPs.
    pub fn serving_cert(&self, names: &[String]) -> Result<CertKey, PkiError> {
        let kp = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "ovnk-apiserver");
        params.distinguished_name = dn;
        for n in names {
            match n.parse::<IpAddr>() {
                Ok(ip) => params.subject_alt_names.push(SanType::IpAddress(ip)),
                Err(_) => params
                    .subject_alt_names
                    .push(SanType::DnsName(n.clone().try_into()?)),
            }
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
        params.not_after = OffsetDateTime::now_utc() + Duration::days(365);
        let cert = params.signed_by(&kp, self.issuer())?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: kp.serialize_pem(),
        })
    }

    /// Client certificate: CN = user, O = groups.
    pub fn client_cert(
        &self,
        user: &str,
        groups: &[String],
        lifetime: Duration,
    ) -> Result<CertKey, PkiError> {
        let kp = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, user);
        for g in groups {
            dn.push(DnType::OrganizationName, DnValue::Utf8String(g.clone()));
        }
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.not_before = OffsetDateTime::now_utc() - Duration::minutes(5);
        params.not_after = OffsetDateTime::now_utc() + lifetime;
        let cert = params.signed_by(&kp, self.issuer())?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: kp.serialize_pem(),
        })
    }

    /// Sign a PEM CSR for client auth, keeping its subject, for `lifetime`.
    pub fn sign_client_csr(&self, csr_pem: &str, lifetime: Duration) -> Result<String, PkiError> {
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::BadCsr(e.to_string()))?;
        let now = OffsetDateTime::now_utc();
        csr.params.not_before = now - Duration::seconds(30);
        csr.params.not_after = now + lifetime;
        csr.params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        csr.params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        csr.params.is_ca = IsCa::ExplicitNoCa;
        let mut serial = [0u8; 16];
        serial.copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        serial[0] &= 0x7f;
        csr.params.serial_number = Some(serial.to_vec().into());
        let cert = csr.signed_by(self.issuer())?;
        Ok(cert.pem())
    }
}

fn write_private(path: &Path, content: &str) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(content.as_bytes())
    }
    #[cfg(not(unix))]
    {
        std::fs::write(path, content)
    }
}

/// Subject (CN, O values) of a PEM CSR, after verifying its signature.
pub fn csr_subject(csr_pem: &str) -> Result<(String, Vec<String>), PkiError> {
    let p = pem::parse(csr_pem.trim()).map_err(|e| PkiError::BadCsr(e.to_string()))?;
    if p.tag() != "CERTIFICATE REQUEST" {
        return Err(PkiError::BadCsr(format!(
            "PEM block type must be CERTIFICATE REQUEST, got {}",
            p.tag()
        )));
    }
    use x509_parser::prelude::FromDer;
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(p.contents())
            .map_err(|e| PkiError::BadCsr(e.to_string()))?;
    req.verify_signature()
        .map_err(|e| PkiError::BadCsr(format!("signature: {e}")))?;
    let subj = &req.certification_request_info.subject;
    let cn = subj
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let orgs = subj
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_string))
        .collect();
    Ok((cn, orgs))
}

/// (CN, O values) of a DER certificate.
pub fn cert_identity(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subj = cert.subject();
    let cn = subj
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())?
        .to_string();
    let orgs = subj
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_string))
        .collect();
    Some((cn, orgs))
}
