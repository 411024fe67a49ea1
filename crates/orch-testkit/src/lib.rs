//! Test support for `orch`'s own tests, under one roof: every fake re-exported under the module
//! path it had when this crate held them all, so tests keep writing `orch_testkit::kube::FakeKube`
//! or `orch_testkit::skip::skip_or_fail`; [`suites`] (suites whose files must travel with their
//! cells); and the `fast-openai` binary (an OpenAI-compatible server that is never the
//! bottleneck, for `scripts/bench-loadgen.sh`).
//!
//! A crate that needs one fake depends on that fake's crate alone (`orch-backend-modal` on
//! `orch-fake-modal`, `orch-store-s3` on `orch-fake-s3`) and builds none of the others:
//!
//! | module | crate |
//! |---|---|
//! | [`container`], [`gpu`], [`rootfs`] | `orch-fake-containers` |
//! | [`kube`] | `orch-fake-kube` |
//! | [`modal`] | `orch-fake-modal` |
//! | [`hub`], [`hashing`] | `orch-fake-hub` |
//! | [`fixtures`], [`MARKER_FILE`] | `orch-fixtures` (std and `serde_json` only) |
//! | [`s3`], [`faultproxy`] | `orch-fake-s3` |
//! | [`slurm`] | `orch-fake-slurm` |
//! | [`skip`] | `orch-test-support` |

pub use orch_fake_containers::{container, gpu, rootfs};
pub use orch_fake_hub as hub;
pub use orch_fake_hub::{fixtures, hashing, MARKER_FILE};
pub use orch_fake_kube as kube;
pub use orch_fake_modal as modal;
pub use orch_fake_s3 as s3;
pub use orch_fake_s3::faultproxy;
pub use orch_fake_slurm as slurm;
/// The skip-or-fail rule (`orch-test-support`), under its old path.
pub use orch_test_support::skip;
pub mod suites;
