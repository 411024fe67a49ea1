//! The `modal` backend: every cell runs in a Modal sandbox, driven in Rust
//! over Modal's own gRPC API (`modal.client.ModalClient`), the way Modal's
//! Go and JS clients drive it. Nothing of Python is needed on the host.
//!
//! - [`proto`]: the subset of Modal's API orch uses (`proto/modal_api.proto`,
//!   ours, checked against the official descriptor by a CI test);
//! - [`config`]: credentials (`MODAL_TOKEN_ID`/`MODAL_TOKEN_SECRET`, else the
//!   active profile of `~/.modal.toml`), `MODAL_SERVER_URL`, `MODAL_ENVIRONMENT`;
//! - [`client`]: the headers Modal's Go client sends (client type 9,
//!   `CLIENT_TYPE_LIBMODAL_GO`; `x-modal-libmodal-version: modal-go/orch-VERSION`),
//!   the auth token, retries with idempotency keys: transient codes with
//!   backoff, throttling (an error carrying an `RPCRetryPolicy`, typically
//!   `RESOURCE_EXHAUSTED`) waited out for its retry-after and sent again under
//!   the same key, bounded (`MODAL_MAX_THROTTLE_WAIT`); `SandboxCreate` paced
//!   through one limiter for the run (`ORCH_MODAL_CREATE_RATE`), held by a
//!   throttled answer;
//! - [`blob`]: the blob store as the official client writes to it: files of
//!   4 MiB or more (`LARGE_FILE_LIMIT`) by `BlobCreate`, then one `PUT` or a
//!   multipart upload (a `PUT` per part, each retried, then the completion),
//!   ETags checked against the data's MD5;
//! - [`ops`]: app, image (with the build log streamed; a Dockerfile's context
//!   as a context mount, as the official client sends `COPY` sources, never
//!   inline), content-addressed
//!   mounts for the static agent, `orch` and the cell's files (an upload
//!   answered `exists: false` is sent again with its data, as the official
//!   client does, with backoff until it is there, at most 10 minutes),
//!   secrets, volumes, sandboxes
//!   (create with `network_access: OPEN` as the official client sends it,
//!   schedule, logs from the last entry id, wait, terminate, list);
//! - [`backend`]: the [`orch_backend::Backend`] for `--backend modal`;
//! - [`setup`]: `orch setup --backend modal`, the download run inside a sandbox
//!   with the weights volume mounted read-write.
//!
//! ## What is where
//!
//! `--backend modal`: `proto/modal_api.proto` (our subset of
//! `modal.client.ModalClient`, compiled by protox in `build.rs`: no system `protoc`;
//! `tests/proto_matches_official.rs` checks it against the official wheel's descriptor);
//! `config.rs` (token from env or `~/.modal.toml`, never shown); `client.rs` (the Go
//! client's headers, `AuthTokenGet`, retries with one idempotency key per call, throttling
//! read from `grpc-status-details-bin`); `blob.rs` (`BlobCreate`, single and multipart
//! uploads with per-part retry and ETag checks); `ops.rs`
//! (environment, app, image build with streamed log and failing step and its context as
//! a mount, content-addressed mounts with blob upload and the wait for ingestion, secrets,
//! volumes, sandbox
//! create (`network_access: OPEN`)/schedule/logs from the last
//! entry id/wait/terminate/list; the task and the end are long polls, one call a
//! cell at a time); `backend.rs` (a sandbox per cell, billed from its task's start
//! (`info.container_started_at`), the cell's files as a
//! mount of their blobs at `/orch/blobs` with the task rewritten to `/orch/files`, GPU
//! fallback on a refusal (a throttled create is no refusal), ends
//! mapped to `oom`/`sandbox_terminated`/`timeout`, `cleanup` by tag); `setup.rs` (setup
//! in a sandbox, weights check from the volume). Its host side (`host.rs`): settings from
//! the suite and the flags, each cell's image, the weights check, `orch setup` run
//! remotely, `orch down`.

pub mod backend;
pub mod blob;
pub mod client;
pub mod config;
pub mod host;
pub mod ops;
pub mod setup;

/// The generated types and stubs of Modal's protocol (`orch-modal-proto`,
/// shared with the fake).
pub use orch_modal_proto as proto;

pub use backend::ModalBackend;
pub use client::Modal;
pub use config::Credentials;
/// The protobuf runtime of [`proto`].
pub use orch_modal_proto::prost;

/// The app every orch sandbox belongs to.
pub const APP_NAME: &str = "orch";
/// The weights volume's default name.
pub const WEIGHTS_VOLUME: &str = "orch-weights";
/// Where the weights volume is mounted in a sandbox.
pub const WEIGHTS_MOUNT: &str = "/weights";
/// Where the static agent is mounted in a sandbox.
pub const AGENT_PATH: &str = "/orch/agent";
/// Where the static `orch` (for in-sandbox setup) is mounted.
pub const ORCH_PATH: &str = "/orch/orch";

#[derive(Debug, thiserror::Error)]
pub enum ModalError {
    /// Modal cannot be used from here (no token, bad URL).
    #[error("{message}\nhint: {hint}")]
    Unavailable { message: String, hint: String },
    /// Modal answered a call with an error.
    #[error("modal `{call}` failed: {code}: {message}")]
    Rpc {
        call: &'static str,
        code: tonic::Code,
        message: String,
    },
    /// The image did not build: the failing step and the log's tail.
    #[error("the image `{image}` did not build{}: {message}", step.as_ref().map(|s| format!(" at step `{s}`")).unwrap_or_default())]
    ImageBuild {
        image: String,
        step: Option<String>,
        message: String,
    },
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },
    #[error("uploading `{file}` to Modal failed: {message}")]
    Upload { file: String, message: String },
}

impl ModalError {
    pub fn rpc(call: &'static str) -> impl Fn(tonic::Status) -> ModalError {
        move |s: tonic::Status| ModalError::Rpc {
            call,
            code: s.code(),
            message: s.message().to_string(),
        }
    }

    pub fn is_user_error(&self) -> bool {
        matches!(self, ModalError::Unavailable { .. })
            || matches!(
                self,
                ModalError::Rpc {
                    code: tonic::Code::Unauthenticated | tonic::Code::PermissionDenied,
                    ..
                }
            )
    }
}

impl From<ModalError> for orch_backend::BackendError {
    fn from(e: ModalError) -> Self {
        match e {
            ModalError::Unavailable { message, hint } => orch_backend::BackendError::Unavailable {
                backend: "modal",
                message,
                hint,
            },
            ModalError::Rpc {
                code: code @ (tonic::Code::Unauthenticated | tonic::Code::PermissionDenied),
                message,
                ..
            } => orch_backend::BackendError::Unavailable {
                backend: "modal",
                message: format!("Modal refused the token ({code}): {message}"),
                hint: "check `MODAL_TOKEN_ID`/`MODAL_TOKEN_SECRET` or `~/.modal.toml` (`modal token new` makes a new one)".into(),
            },
            other => orch_backend::BackendError::Io {
                action: "talk to Modal".into(),
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}

impl orch_protocol::ErrorClass for ModalError {
    fn is_user_error(&self) -> bool {
        Self::is_user_error(self)
    }
}
