//! `orch-modal-proto`: Modal's gRPC protocol as orch speaks it, in one place
//! that both the `modal` backend (`orch-backend-modal`) and its fake
//! (`orch-fake-modal`) use, so neither depends on the other.
//!
//! - the generated types and stubs of `proto/modal_api.proto` (our subset of
//!   `modal.client.ModalClient`, compiled by protox in `build.rs`: no system
//!   `protoc`), client and server; [`DESCRIPTOR`], checked against the
//!   official wheel's by `tests/proto_matches_official.rs`;
//! - [`status`]: Modal's `RPCStatus` in `grpc-status-details-bin` and its
//!   retry policy (what a throttled call carries), read by the client and
//!   written by the fake.
//!
//! Written by us from Modal's published client; never a copy of its files.

#![allow(clippy::all, clippy::pedantic)]
tonic::include_proto!("modal.client");

/// Our descriptor set (for the check against Modal's own).
pub const DESCRIPTOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/modal_api.descriptor.bin"));

/// The protobuf runtime of the generated types (for fakes that measure messages).
pub use prost;

/// Modal's status details: the retry policy of a throttled call.
pub mod status {
    use std::time::Duration;
    use tonic::{Code, Status};

    /// Modal's `RPCStatus` (wire-compatible with `google.rpc.Status`), the
    /// content of `grpc-status-details-bin`; declared here rather than in the
    /// `.proto` because its `details` are `google.protobuf.Any`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RpcStatus {
        #[prost(int32, tag = "1")]
        pub code: i32,
        #[prost(string, tag = "2")]
        pub message: String,
        #[prost(message, repeated, tag = "3")]
        pub details: Vec<AnyDetail>,
    }

    /// `google.protobuf.Any`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AnyDetail {
        #[prost(string, tag = "1")]
        pub type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }

    /// The full name the `Any` of a retry policy carries after its prefix.
    const RETRY_POLICY_TYPE: &str = "modal.client.RPCRetryPolicy";

    /// The server's retry-after, when `status` carries an `RPCRetryPolicy` in
    /// its details (as Modal's Python client reads it; any type URL prefix).
    pub fn retry_after(status: &Status) -> Option<Duration> {
        use prost::Message;
        if status.details().is_empty() {
            return None;
        }
        let st = RpcStatus::decode(status.details()).ok()?;
        st.details.iter().find_map(|d| {
            let name = d.type_url.rsplit('/').next().unwrap_or_default();
            if name != RETRY_POLICY_TYPE {
                return None;
            }
            let p = crate::RpcRetryPolicy::decode(d.value.as_slice()).ok()?;
            let secs = f64::from(p.retry_after_secs);
            // To the millisecond: the field is an `f32`.
            Some(if secs.is_finite() && secs > 0.0 {
                Duration::from_millis((secs.min(86_400.0) * 1000.0).round() as u64)
            } else {
                Duration::ZERO
            })
        })
    }

    /// A throttling answer as Modal sends it: `code` with an `RPCRetryPolicy`
    /// of `after` in its details (for fakes and tests).
    pub fn throttled(code: Code, message: &str, after: Duration) -> Status {
        use prost::Message;
        let policy = crate::RpcRetryPolicy {
            retry_after_secs: after.as_secs_f32(),
        };
        let st = RpcStatus {
            code: code as i32,
            message: message.into(),
            details: vec![AnyDetail {
                type_url: format!("type.modal.com/{RETRY_POLICY_TYPE}"),
                value: policy.encode_to_vec(),
            }],
        };
        Status::with_details(code, message, st.encode_to_vec().into())
    }
}
