//! The dev control plane's CA: istiod's `IstioCertificateService` backed by
//! a [`BuiltinCa`], for local setups and tests.
//!
//! It authenticates nobody: the bearer token is only noted (present or not)
//! in the logs, and any caller gets any identity in the CA's trust domain,
//! `ImpersonatedIdentity` included (the certificate then names the
//! impersonated identity, as istiod's does for a trusted node agent). Never
//! expose it beyond a test network.
//!
//! The requested lifetime (`validity_duration`, seconds) is honoured within
//! [`DevCaOptions`]' bounds; the answer is the chain as istiod sends it, leaf
//! first and root last, one certificate per element.

use std::sync::Arc;
use std::time::Duration;

use ringway_proto::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ringway_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use tonic::{Request, Response, Status};

use crate::model::identity::Identity;
use crate::security::ca::{BuiltinCa, CaError};
use crate::security::caclient::{CLUSTER_ID_HEADER, IMPERSONATED_IDENTITY_KEY};

/// Lifetime bounds. A request outside `[min_validity, max_validity]` is
/// moved to the nearest bound; one asking for nothing (0 or negative) gets
/// `default_validity` (itself kept within the bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevCaOptions {
    pub default_validity: Duration,
    pub max_validity: Duration,
    /// Keep at a second or more: X.509 times are whole seconds.
    pub min_validity: Duration,
}

impl Default for DevCaOptions {
    /// 24 h default and maximum (istiod's defaults), 60 s minimum.
    fn default() -> Self {
        DevCaOptions {
            default_validity: Duration::from_secs(24 * 60 * 60),
            max_validity: Duration::from_secs(24 * 60 * 60),
            min_validity: Duration::from_secs(60),
        }
    }
}

impl DevCaOptions {
    /// The lifetime to sign for a request's `validity_duration`.
    pub fn validity_for(&self, requested_secs: i64) -> Duration {
        let min = self.min_validity.max(Duration::from_secs(1));
        let max = self.max_validity.max(min);
        let wanted = u64::try_from(requested_secs)
            .ok()
            .filter(|&s| s > 0)
            .map_or(self.default_validity, Duration::from_secs);
        wanted.clamp(min, max)
    }
}

/// The service implementation; [`service`] wraps it for a tonic server.
#[derive(Debug, Clone)]
pub struct DevCa {
    ca: Arc<BuiltinCa>,
    options: DevCaOptions,
}

impl DevCa {
    pub fn new(ca: Arc<BuiltinCa>, options: DevCaOptions) -> DevCa {
        DevCa { ca, options }
    }
}

/// The dev CA as a tonic service, ready for
/// `tonic::transport::Server::builder().add_service(...)`.
pub fn service(ca: Arc<BuiltinCa>, options: DevCaOptions) -> IstioCertificateServiceServer<DevCa> {
    IstioCertificateServiceServer::new(DevCa::new(ca, options))
}

#[tonic::async_trait]
impl IstioCertificateService for DevCa {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let has_token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("Bearer ") && v.len() > "Bearer ".len());
        let cluster = request
            .metadata()
            .get(CLUSTER_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let request = request.into_inner();

        let impersonated = impersonated_identity(&request)?;
        let validity = self.options.validity_for(request.validity_duration);
        let chain = self
            .ca
            .sign_csr(&request.csr, impersonated.as_ref(), validity)
            .map_err(|e| {
                tracing::info!(error = %e, "dev CA: refusing a certificate request");
                status_for(&e)
            })?;
        tracing::info!(
            impersonated = ?impersonated.as_ref().map(ToString::to_string),
            bearer_token = has_token,
            cluster = %cluster,
            validity_secs = validity.as_secs(),
            "dev CA: signed a workload certificate"
        );
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: chain,
        }))
    }
}

/// `metadata.ImpersonatedIdentity`, when set.
fn impersonated_identity(request: &IstioCertificateRequest) -> Result<Option<Identity>, Status> {
    use prost_types::value::Kind;
    let Some(value) = request
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get(IMPERSONATED_IDENTITY_KEY))
    else {
        return Ok(None);
    };
    match &value.kind {
        Some(Kind::StringValue(uri)) if uri.is_empty() => Ok(None),
        Some(Kind::StringValue(uri)) => uri
            .parse()
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("{IMPERSONATED_IDENTITY_KEY}: {e}"))),
        _ => Err(Status::invalid_argument(format!(
            "{IMPERSONATED_IDENTITY_KEY} must be a string"
        ))),
    }
}

fn status_for(e: &CaError) -> Status {
    match e {
        CaError::Csr(_) | CaError::Identity { .. } | CaError::Validity(_) => {
            Status::invalid_argument(e.to_string())
        }
        CaError::ForeignTrustDomain { .. } => Status::permission_denied(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_is_kept_within_bounds() {
        let o = DevCaOptions::default();
        assert_eq!(o.validity_for(0), Duration::from_secs(86400));
        assert_eq!(o.validity_for(-5), Duration::from_secs(86400));
        assert_eq!(o.validity_for(3600), Duration::from_secs(3600));
        assert_eq!(o.validity_for(10), Duration::from_secs(60));
        assert_eq!(o.validity_for(i64::MAX), Duration::from_secs(86400));
        let short = DevCaOptions {
            min_validity: Duration::ZERO,
            ..o
        };
        assert_eq!(short.validity_for(1), Duration::from_secs(1));
        assert_eq!(short.validity_for(4), Duration::from_secs(4));
    }
}
