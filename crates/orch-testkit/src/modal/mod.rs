//! A fake Modal server speaking Modal's gRPC protocol (`modal.client.ModalClient`,
//! the RPCs orch and Modal's official clients use to run a sandbox), for tests.
//!
//! - each sandbox's entrypoint runs in its image's root folder as a container
//!   runtime would run it ([`crate::container`]: a mount namespace, `chroot`,
//!   a writable layer of its own; needs root), in its own process group, so
//!   the real agent runs there and its stdout/stderr become the sandbox's
//!   logs, with entry ids a client can resume from; its environment is the
//!   image's `ENV` and the secrets, nothing of this host's;
//! - volumes are host folders (`ROOT/volumes/NAME`) bind-mounted at their
//!   mount paths (read-only when asked), mount files are content-addressed
//!   blobs (`ROOT/blobs/SHA256`) bind-mounted read-only at their file names
//!   (`/orch/agent`); no path is translated: a program that needs a library
//!   the image lacks fails as it would on Modal;
//! - images come from `dockerfile_commands`: `FROM REF` is the root folder
//!   the builder maps REF to ([`FakeModalBuilder::image`]; `scratch` is an
//!   empty one; an unmapped REF fails the build at that step, as a registry
//!   without the image does), `COPY`/`ADD` copy context files, `RUN` runs in
//!   the image's root (copied first: mapped roots never change), `ENV` and
//!   `WORKDIR` reach its sandboxes; the build log names each step;
//! - GPU sandboxes (`gpu_config`) get the NVIDIA container toolkit's
//!   injection when the builder has an NVML library
//!   ([`FakeModalBuilder::nvml_stub`]): the library at `libnvidia-ml.so.1`
//!   and `NVIDIA_VISIBLE_DEVICES=0,..,N-1`;
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
