//! A fake Modal server speaking Modal's gRPC protocol (`modal.client.ModalClient`,
//! the RPCs orch and Modal's official clients use to run a sandbox), for tests.
//!
//! - each sandbox's entrypoint runs as a local process (its own process
//!   group), so the real agent runs and its stdout/stderr become the
//!   sandbox's logs, with entry ids a client can resume from;
//! - volumes are host folders (`ROOT/volumes/NAME`), mount files are
//!   content-addressed blobs (`ROOT/blobs/SHA256`); container paths of mounts
//!   and volume mounts are mapped to those host paths in the entrypoint's
//!   arguments (a process here has no container file system: paths inside
//!   the base64 task, like `HF_HUB_CACHE=/weights`, are not mapped);
//! - images "build" without running anything: the build log names each
//!   Dockerfile step; context files are kept for inspection;
//! - large files go through `BlobCreate` and an HTTP `PUT` to a local URL,
//!   checked against `Content-MD5`;
//! - requests without `x-modal-token-id`/`x-modal-token-secret` (or with
//!   other values than the server's) are `UNAUTHENTICATED`;
//! - [`Scenario`] knobs: an image build that fails at a step, GPU types with
//!   no capacity (the sandbox is never scheduled), sandboxes killed for OOM
//!   or terminated mid-run, transient `UNAVAILABLE` answers, log streams that
//!   drop after every batch.

mod server;

pub use server::{Call, FakeModal, FakeModalBuilder, SandboxRecord, Scenario};
