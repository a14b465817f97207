//! Bedrock specifics: SigV4 signing of Converse requests and the model path.

use std::time::SystemTime;

use super::credentials::AwsCredentials;

/// The SigV4 service name of Bedrock runtime.
pub const SERVICE: &str = "bedrock";

/// The request path of a Converse call: `/model/{modelId}/converse` or `/converse-stream`, the
/// model id percent-encoded (Bedrock ids contain `:`).
pub fn converse_path(model: &str, stream: bool) -> String {
    let mut enc = String::new();
    for b in model.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            enc.push(b as char);
        } else {
            enc.push_str(&format!("%{b:02X}"));
        }
    }
    format!(
        "/model/{enc}/{}",
        if stream {
            "converse-stream"
        } else {
            "converse"
        }
    )
}

/// SigV4 headers (`authorization`, `x-amz-date`, `x-amz-security-token` when there is a session
/// token) for a request; `headers` are the headers that will be sent and must be signed (the
/// host is taken from `url`). Errors never contain the credentials.
#[allow(clippy::too_many_arguments)]
pub fn sign(
    creds: &AwsCredentials,
    region: &str,
    service: &str,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    time: SystemTime,
) -> Result<Vec<(String, String)>, String> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let identity: aws_smithy_runtime_api::client::identity::Identity =
        aws_credential_types::Credentials::new(
            creds.access_key_id.expose(),
            creds.secret_access_key.expose(),
            creds.session_token.as_ref().map(|t| t.expose().to_string()),
            None,
            "kinference",
        )
        .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("SigV4 parameters: {e}"))?
        .into();
    let req = SignableRequest::new(
        method,
        url,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| format!("SigV4 request: {e}"))?;
    let (instructions, _sig) = sign(req, &params)
        .map_err(|e| format!("SigV4 signing failed: {e}"))?
        .into_parts();
    Ok(instructions
        .headers()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::credentials::Secret;

    /// `get-vanilla` of the AWS SigV4 test suite.
    #[test]
    fn sigv4_get_vanilla_vector() {
        let creds = AwsCredentials {
            access_key_id: Secret::new("AKIDEXAMPLE"),
            secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
            session_token: None,
        };
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_440_938_160);
        let h = sign(
            &creds,
            "us-east-1",
            "service",
            "GET",
            "https://example.amazonaws.com/",
            &[],
            b"",
            t,
        );
        let h = h.unwrap_or_default();
        let get = |k: &str| {
            h.iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("x-amz-date").as_deref(), Some("20150830T123600Z"));
        assert_eq!(
            get("authorization").as_deref(),
            Some(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
            )
        );
    }

    #[test]
    fn model_ids_are_encoded() {
        assert_eq!(
            converse_path("meta.llama3-3-70b-instruct-v1:0", true),
            "/model/meta.llama3-3-70b-instruct-v1%3A0/converse-stream"
        );
    }
}
