//! The connection to a CSI driver: endpoint parsing, connect with retry, per-call timeouts
//! and the Go names of gRPC status codes (used in metric labels and messages).

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// Why a CSI endpoint could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address is neither `unix:///path`, `unix:/path` nor an absolute path.
    #[error("invalid CSI address {0:?}: expected unix:///path/to/socket or /path/to/socket")]
    InvalidAddress(String),
    /// The socket did not accept a connection.
    #[error("failed to connect to CSI driver at {address}: {detail}")]
    Connect {
        /// The socket path.
        address: String,
        /// The innermost cause (e.g. "No such file or directory (os error 2)").
        detail: String,
    },
}

impl ConnectError {
    /// Whether trying again may help (the driver may still be starting).
    pub fn is_retryable(&self) -> bool {
        match self {
            ConnectError::InvalidAddress(_) => false,
            ConnectError::Connect { .. } => true,
        }
    }
}

/// Turns `unix:///x`, `unix:/x`, `unix://x` or `/x` into the socket path `/x`.
pub fn socket_path(address: &str) -> Result<String, ConnectError> {
    let path = address
        .strip_prefix("unix://")
        .or_else(|| address.strip_prefix("unix:"))
        .unwrap_or(address);
    if path.is_empty() || !(path.starts_with('/') || path.starts_with('.')) {
        return Err(ConnectError::InvalidAddress(address.to_string()));
    }
    Ok(path.to_string())
}

fn endpoint(address: &str) -> Result<(String, Endpoint), ConnectError> {
    let path = socket_path(address)?;
    let endpoint = Endpoint::from_shared(format!("unix://{path}"))
        .map_err(|_| ConnectError::InvalidAddress(address.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    Ok((path, endpoint))
}

/// Connects once to the driver's socket.
pub async fn connect(address: &str) -> Result<Channel, ConnectError> {
    let (path, endpoint) = endpoint(address)?;
    endpoint
        .connect()
        .await
        .map_err(|error| ConnectError::Connect {
            address: path,
            detail: root_cause(&error),
        })
}

/// The message of the innermost error in a chain; transport errors nest the same text.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

/// Connects, retrying every `interval` while the socket is not there yet, logging every ten
/// attempts (upstream retries every second and logs every 10 s). Gives up only on an address
/// that can never work, or when `give_up_after` has passed (None: never).
pub async fn connect_with_retry(
    address: &str,
    interval: Duration,
    give_up_after: Option<Duration>,
) -> Result<Channel, ConnectError> {
    let started = tokio::time::Instant::now();
    let mut attempt: u64 = 0;
    loop {
        match connect(address).await {
            Ok(channel) => return Ok(channel),
            Err(err) if !err.is_retryable() => return Err(err),
            Err(err) => {
                if give_up_after.is_some_and(|limit| started.elapsed() >= limit) {
                    return Err(err);
                }
                if attempt.is_multiple_of(10) {
                    tracing::warn!(address, error = %err, "still connecting to the CSI driver");
                }
                attempt += 1;
                tokio::time::sleep(interval).await;
            }
        }
    }
}

/// A CSI call that did not succeed: the gRPC code (our own deadline counts as
/// `DeadlineExceeded`, as Go's context deadline does) and the driver's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{method} failed: {}: {message}", go_code_name(*code))]
pub struct CallError {
    /// The method's short name (`CreateVolume`).
    pub method: &'static str,
    /// The status code.
    pub code: tonic::Code,
    /// The message.
    pub message: String,
}

impl CallError {
    /// The error as Go's gRPC status error prints it, `rpc error: code = X desc = Y`: the
    /// text the upstream sidecars put in their events.
    pub fn status_text(&self) -> String {
        format!(
            "rpc error: code = {} desc = {}",
            go_code_name(self.code),
            self.message
        )
    }
}

/// Makes CSI calls the way every sidecar makes them: each with a deadline (sent to the driver
/// as `grpc-timeout` and enforced here), counted in `csi_sidecar_operations_seconds`, failing
/// with a [`CallError`].
#[derive(Debug, Clone)]
pub struct Caller {
    driver: String,
    timeout: Duration,
    metrics: Option<crate::metrics::Metrics>,
}

impl Caller {
    /// Calls to `driver` (its name, for the metrics) with `timeout` each.
    pub fn new(driver: &str, timeout: Duration, metrics: Option<crate::metrics::Metrics>) -> Self {
        Caller {
            driver: driver.to_string(),
            timeout,
            metrics,
        }
    }

    /// The request with this caller's deadline.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        with_timeout(message, self.timeout)
    }

    /// Awaits a call of the gRPC method `path` (`/csi.v1.Controller/CreateVolume`, the
    /// metrics' method name).
    pub async fn call<T>(
        &self,
        path: &'static str,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CallError> {
        self.call_for(path, false, call).await
    }

    /// [`Caller::call`] for a volume that is (`migrated`) or is not translated from an
    /// in-tree plugin: the metrics' `migrated` label, where it exists.
    pub async fn call_for<T>(
        &self,
        path: &'static str,
        migrated: bool,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CallError> {
        let method = path.rsplit('/').next().unwrap_or(path);
        let started = std::time::Instant::now();
        let result = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(CallError {
                method,
                code: tonic::Code::DeadlineExceeded,
                message: "context deadline exceeded".into(),
            }),
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(CallError {
                method,
                code: status.code(),
                message: status.message().to_string(),
            }),
        };
        if let Some(metrics) = &self.metrics {
            let code = result.as_ref().map_or_else(|e| e.code, |_| tonic::Code::Ok);
            metrics.observe_csi(&self.driver, path, code, migrated, started.elapsed());
        }
        result
    }
}

/// Wraps a request with a gRPC deadline (`grpc-timeout`), which the driver sees too.
pub fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// Whether a failed call's code is final: the driver is not working on the request any more.
/// Cancelled, DeadlineExceeded, Unavailable, ResourceExhausted and Aborted are not (the call's
/// outcome is uncertain; the driver may still complete it), as csi-lib-utils' `IsFinalError`.
pub fn is_final(code: tonic::Code) -> bool {
    !matches!(
        code,
        tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Unavailable
            | tonic::Code::ResourceExhausted
            | tonic::Code::Aborted
    )
}

/// The gRPC status code as Go's `codes.Code.String()` prints it (`OK`, `DeadlineExceeded`).
pub fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Parses a status code written as in the CSI spec (`UNAVAILABLE`, `DEADLINE_EXCEEDED`), as Go
/// prints it (`Unavailable`, `DeadlineExceeded`), or as its number.
pub fn parse_code(text: &str) -> Option<tonic::Code> {
    use tonic::Code;
    if let Ok(n) = text.parse::<i32>() {
        let code = Code::from_i32(n);
        return (code != Code::Unknown || n == 2).then_some(code);
    }
    let normalized: String = text
        .chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect();
    let code = match normalized.as_str() {
        "ok" => Code::Ok,
        "canceled" | "cancelled" => Code::Cancelled,
        "unknown" => Code::Unknown,
        "invalidargument" => Code::InvalidArgument,
        "deadlineexceeded" => Code::DeadlineExceeded,
        "notfound" => Code::NotFound,
        "alreadyexists" => Code::AlreadyExists,
        "permissiondenied" => Code::PermissionDenied,
        "resourceexhausted" => Code::ResourceExhausted,
        "failedprecondition" => Code::FailedPrecondition,
        "aborted" => Code::Aborted,
        "outofrange" => Code::OutOfRange,
        "unimplemented" => Code::Unimplemented,
        "internal" => Code::Internal,
        "unavailable" => Code::Unavailable,
        "dataloss" => Code::DataLoss,
        "unauthenticated" => Code::Unauthenticated,
        _ => return None,
    };
    Some(code)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn a_call_error_prints_as_gos_grpc_status_error() {
        let error = super::CallError {
            method: "DeleteVolume",
            code: tonic::Code::FailedPrecondition,
            message: "volume in use".into(),
        };
        assert_eq!(
            error.status_text(),
            "rpc error: code = FailedPrecondition desc = volume in use"
        );
    }

    #[test]
    fn only_codes_after_which_the_driver_may_still_work_are_not_final() {
        use tonic::Code;
        for code in [
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::Aborted,
        ] {
            assert!(!super::is_final(code), "{code:?}");
        }
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::Internal,
            Code::OutOfRange,
            Code::FailedPrecondition,
        ] {
            assert!(super::is_final(code), "{code:?}");
        }
    }

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn calls_fail_with_their_code_and_message_and_are_counted() {
        let metrics = crate::metrics::Metrics::new().unwrap();
        let caller = Caller::new(
            "d.example.com",
            Duration::from_secs(5),
            Some(metrics.clone()),
        );
        let ok = caller
            .call("/csi.v1.Controller/CreateVolume", async {
                Ok(tonic::Response::new(7u32))
            })
            .await;
        assert_eq!(ok, Ok(7));
        let refused = caller
            .call("/csi.v1.Controller/DeleteVolume", async {
                Err::<tonic::Response<()>, _>(tonic::Status::failed_precondition("published"))
            })
            .await
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "DeleteVolume failed: FailedPrecondition: published"
        );
        let late = caller
            .call(
                "/csi.v1.Controller/CreateVolume",
                std::future::pending::<Result<tonic::Response<()>, tonic::Status>>(),
            )
            .await
            .unwrap_err();
        assert_eq!(late.code, tonic::Code::DeadlineExceeded);
        let text = metrics.render();
        assert!(
            text.contains("method_name=\"/csi.v1.Controller/DeleteVolume\""),
            "{text}"
        );
        assert!(
            text.contains("grpc_status_code=\"DeadlineExceeded\""),
            "{text}"
        );
    }

    #[test]
    fn socket_paths_accept_the_forms_upstream_accepts() {
        assert_eq!(
            socket_path("unix:///run/csi/socket").unwrap(),
            "/run/csi/socket"
        );
        assert_eq!(
            socket_path("unix:/run/csi/socket").unwrap(),
            "/run/csi/socket"
        );
        assert_eq!(socket_path("/run/csi/socket").unwrap(), "/run/csi/socket");
        assert!(socket_path("").is_err());
        assert!(socket_path("unix://").is_err());
        assert!(socket_path("tcp://1.2.3.4:5").is_err());
    }

    #[test]
    fn code_names_round_trip_through_the_parser() {
        for n in 0..=16 {
            let code = tonic::Code::from_i32(n);
            assert_eq!(parse_code(go_code_name(code)), Some(code));
        }
        assert_eq!(
            parse_code("DEADLINE_EXCEEDED"),
            Some(tonic::Code::DeadlineExceeded)
        );
        assert_eq!(parse_code("UNAVAILABLE"), Some(tonic::Code::Unavailable));
        assert_eq!(parse_code("14"), Some(tonic::Code::Unavailable));
        assert_eq!(parse_code("nonsense"), None);
        assert_eq!(parse_code("99"), None);
    }

    #[tokio::test]
    async fn connecting_to_a_missing_socket_fails_with_a_retryable_error() {
        let err = connect("unix:///nonexistent/dir/socket").await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        let err = connect("tcp://x").await.unwrap_err();
        assert!(!err.is_retryable());
    }
}
