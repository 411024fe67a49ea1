//! The fake against orch's own Modal client: image builds in their roots, sandboxes that
//! see only their image, mounts, volumes and the GPU injection.

use orch_backend_modal::ops::{self, ImageSpec, MountSource};
use orch_backend_modal::proto::{self, generic_result::GenericStatus};
use orch_backend_modal::{Credentials, Modal, ModalError};
use orch_fake_containers::container;
use orch_fake_modal::*;

fn client(fake: &FakeModal) -> Modal {
    Modal::connect(Credentials {
        token_id: "ak-t".into(),
        token_secret: "as-t".into(),
        server_url: fake.url().into(),
        environment: String::new(),
        source: "test".into(),
    })
    .unwrap()
}

async fn build(m: &Modal, app: &str, spec: &ImageSpec) -> (Result<String, ModalError>, String) {
    let mut log = String::new();
    let r = ops::image(m, app, spec, "2025.06", |l| log.push_str(l)).await;
    (r.map(|b| b.image_id), log)
}

/// Runs `sh -c SCRIPT` in a sandbox of `image`: (exit status, stdout).
async fn sandbox(m: &Modal, app: &str, image: &str, script: &str, extra: proto::Sandbox) -> (i32, String) {
    let def = proto::Sandbox {
        entrypoint_args: vec!["sh".into(), "-c".into(), script.into()],
        image_id: image.into(),
        timeout_secs: 60,
        ..extra
    };
    let id = ops::sandbox_create(m, app, def, &[]).await.unwrap();
    let mut out = String::new();
    ops::sandbox_logs(m, &id, proto::FileDescriptor::Stdout, |c| out.push_str(c))
        .await
        .unwrap();
    let r = ops::sandbox_wait(m, &id).await.unwrap();
    (r.status, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_build_in_their_roots_and_sandboxes_see_only_them() {
    if !container::available_or_skip("the fake Modal's sandboxes") {
        return;
    }
    let busybox_bin = container::host_busybox().unwrap();
    let lib = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(lib.path(), "stub-nvml").unwrap();
    let fake = FakeModal::builder()
        .image("debian:bookworm-slim", container::busybox_root().unwrap())
        .nvml_stub(lib.path())
        .start()
        .unwrap();
    let m = client(&fake);
    let app = ops::app(&m, "t").await.unwrap();

    // A registry image the fake has no root for does not build, naming the step.
    let (r, log) = build(&m, &app, &ImageSpec::registry("nosuch/image:v9")).await;
    match r {
        Err(ModalError::ImageBuild { step, .. }) => {
            assert_eq!(step.as_deref(), Some("FROM nosuch/image:v9"), "{log}")
        }
        other => panic!("{other:?}\n{log}"),
    }
    assert!(log.contains("docker.io/nosuch/image:v9: not found"), "{log}");

    // A RUN step runs in the image: python is not in a busybox image.
    let spec = ImageSpec::dockerfile("py", "FROM debian:bookworm-slim\nRUN python3 -c 1\n", vec![]);
    let (r, log) = build(&m, &app, &spec).await;
    assert!(matches!(r, Err(ModalError::ImageBuild { .. })), "{log}");
    assert!(log.contains("exit code: 127"), "{log}");

    // FROM scratch + COPY + RUN + ENV + WORKDIR, as containers/quickstart builds.
    let ctx = tempfile::tempdir().unwrap();
    std::fs::copy(&busybox_bin, ctx.path().join("busybox")).unwrap();
    let spec = ImageSpec::dockerfile(
        "qs",
        "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nENV PATH=/bin GREETING=\"hi there\"\nWORKDIR /work\n",
        vec![("busybox".into(), ctx.path().join("busybox"))],
    );
    let (r, log) = build(&m, &app, &spec).await;
    let qs = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert!(log.contains("Step 3/5 : RUN"), "{log}");

    let file = ctx.path().join("note.txt");
    std::fs::write(&file, "mounted-file").unwrap();
    let mount = ops::mount(
        &m,
        &app,
        &[MountSource {
            remote_path: "/orch/note.txt",
            local: &file,
            mode: 0o644,
        }],
    )
    .await
    .unwrap();
    let vol = ops::volume(&m, "v", true).await.unwrap().unwrap();
    std::fs::write(fake.volume_dir("v").join("in-volume"), "x").unwrap();
    let script = "echo \"path=$PATH greet=$GREETING pwd=$(pwd) home=$HOME\"; cat /orch/note.txt; echo; ls /data; \
        test -e /root/.cargo && echo LEAK; test -e /work/main && echo LEAK; echo \"gpu=${NVIDIA_VISIBLE_DEVICES-none}\"; \
        echo w > /data/out; echo z > /orch/note.txt || echo read-only-mount";
    let (status, out) = sandbox(
        &m,
        &app,
        &qs,
        script,
        proto::Sandbox {
            mount_ids: vec![mount],
            volume_mounts: vec![proto::VolumeMount {
                volume_id: vol,
                mount_path: "/data".into(),
                allow_background_commits: false,
                read_only: false,
            }],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(status, GenericStatus::Success as i32, "{out}");
    assert!(
        out.starts_with("path=/bin greet=hi there pwd=/work home=/root\nmounted-file\nin-volume\n"),
        "{out}"
    );
    assert!(
        !out.contains("LEAK") && out.contains("gpu=none") && out.contains("read-only-mount"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(fake.volume_dir("v").join("out")).unwrap(),
        "w\n"
    );

    // A GPU sandbox: the library and its devices.
    let deb = ops::image(
        &m,
        &app,
        &ImageSpec::registry("debian:bookworm-slim"),
        "2025.06",
        |_| {},
    )
    .await
    .unwrap()
    .image_id;
    let (status, out) = sandbox(
        &m,
        &app,
        &deb,
        "echo \"gpu=$NVIDIA_VISIBLE_DEVICES\"; cat /usr/lib64/libnvidia-ml.so.1",
        proto::Sandbox {
            resources: Some(proto::Resources {
                gpu_config: ops::gpu_config(&"H100:2".into(), false),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(status, GenericStatus::Success as i32, "{out}");
    assert_eq!(out, "gpu=0,1\nstub-nvml");
    // The mapped root did not change.
    assert!(!container::busybox_root()
        .unwrap()
        .join("usr/lib64/libnvidia-ml.so.1")
        .exists());
}

/// A mount of many files and one over the inline limit (uploaded through `BlobCreate`):
/// every file in the sandbox's root byte for byte; the same mount again uploads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_of_many_and_large_files_land_byte_exact_and_upload_once() {
    if !container::available_or_skip("the fake Modal's sandboxes") {
        return;
    }
    let fake = FakeModal::builder()
        .image("debian:bookworm-slim", container::busybox_root().unwrap())
        .start()
        .unwrap();
    let m = client(&fake);
    let app = ops::app(&m, "t").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // 40 small files (two of them alike) and a 5 MiB one of every byte value.
    let mut files: Vec<(String, std::path::PathBuf, Vec<u8>)> = (0..40)
        .map(|i| {
            let data = {
                // The last is the first's twin.
                let k = if i == 39 { 0 } else { i };
                format!("file {k}\n").repeat(k + 1).into_bytes()
            };
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, &data).unwrap();
            (format!("/orch/blobs/f{i}"), p, data)
        })
        .collect();
    let big: Vec<u8> = (0..5 * 1024 * 1024 + 7)
        .map(|i: usize| (i * 31 % 251) as u8)
        .collect();
    assert!(big.len() > ops::LARGE_FILE_LIMIT);
    let p = dir.path().join("big");
    std::fs::write(&p, &big).unwrap();
    files.push(("/orch/blobs/big".into(), p, big.clone()));
    let sources: Vec<MountSource<'_>> = files
        .iter()
        .map(|(remote, local, _)| MountSource {
            remote_path: remote,
            local,
            mode: 0o644,
        })
        .collect();
    let mount = ops::mount(&m, &app, &sources).await.unwrap();
    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 40, "one upload per distinct content: {uploads:?}");
    assert_eq!(uploads.iter().filter(|u| u.via_blob).count(), 1, "{uploads:?}");
    assert!(uploads
        .iter()
        .any(|u| u.via_blob && u.size == big.len() as u64 && u.sha256 == sha256_hex(&big)));
    assert_eq!(fake.count("BlobCreate"), 1);

    // In the sandbox: each file's SHA-256 and size as the host has them.
    let deb = ops::image(
        &m,
        &app,
        &ImageSpec::registry("debian:bookworm-slim"),
        "2025.06",
        |_| {},
    )
    .await
    .unwrap()
    .image_id;
    let (status, out) = sandbox(
        &m,
        &app,
        &deb,
        "cd /orch/blobs && for f in *; do echo \"$f $(wc -c < $f) $(sha256sum $f | cut -d' ' -f1)\"; done",
        proto::Sandbox {
            mount_ids: vec![mount.clone()],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(status, GenericStatus::Success as i32, "{out}");
    let mut want: Vec<String> = files
        .iter()
        .map(|(remote, _, data)| {
            format!(
                "{} {} {}",
                remote.trim_start_matches("/orch/blobs/"),
                data.len(),
                sha256_hex(data)
            )
        })
        .collect();
    want.sort();
    let mut got: Vec<String> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    got.sort();
    assert_eq!(got, want);

    // The same files again: offered by digest, none uploaded, the same mount.
    let again = ops::mount(&m, &app, &sources).await.unwrap();
    assert_eq!(again, mount);
    assert_eq!(
        fake.uploads().len(),
        40,
        "a second identical mount uploads nothing"
    );
    assert_eq!(fake.count("BlobCreate"), 1);
}

/// Throttling: the first `SandboxCreate`s answer `RESOURCE_EXHAUSTED` with a retry-after;
/// the client waits and sends the same call again, same idempotency key, counting its
/// throttled retries; the definition carries `network_access: OPEN` and every call the Go
/// client's type. Past the client's bound the throttled status is the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_sandbox_creates_are_sent_again_under_the_same_key() {
    let fake = FakeModal::start();
    fake.scenario(|s| {
        s.throttle_sandbox_creates = 2;
        s.throttle_after = std::time::Duration::from_millis(50);
    });
    let mut m = client(&fake);
    let app = ops::app(&m, "t").await.unwrap();
    // No entrypoint: once through the throttle, the fake refuses it (no container needed).
    let started = std::time::Instant::now();
    let err = ops::sandbox_create(&m, &app, proto::Sandbox::default(), &[])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    // Waited at least the official minimum (0.1 s) twice.
    assert!(started.elapsed() >= std::time::Duration::from_millis(200));
    let creates: Vec<Call> = fake
        .calls()
        .into_iter()
        .filter(|c| c.method == "SandboxCreate")
        .collect();
    assert_eq!(creates.len(), 3, "{creates:?}");
    let key = creates[0].idempotency_key.clone().unwrap();
    assert!(creates
        .iter()
        .all(|c| c.idempotency_key.as_deref() == Some(key.as_str())));
    let attempts: Vec<_> = creates.iter().map(|c| c.throttle_attempt.as_deref()).collect();
    assert_eq!(attempts, [Some("0"), Some("1"), Some("2")]);
    assert_eq!(creates[2].detail.as_deref(), Some("network_access=1"));
    assert!(fake.calls().iter().all(|c| c.client_type.as_deref() == Some("9")));
    assert!(fake.calls().iter().all(|c| c
        .libmodal_version
        .as_deref()
        .is_some_and(|v| v.starts_with("modal-go/"))));

    // Past the bound: the throttled answer itself, told apart by its retry-after.
    fake.scenario(|s| s.throttle_sandbox_creates = 5);
    m.retry.throttle_attempts = 1;
    let err = ops::sandbox_create(&m, &app, proto::Sandbox::default(), &[])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        orch_backend_modal::client::retry_after(&err),
        Some(std::time::Duration::from_millis(50))
    );
    assert_eq!(fake.count("SandboxCreate"), 5);
}

/// Slow ingestion: after an upload `MountPutFile` says `exists: false` for N more asks and
/// a mount naming the file fails `FAILED_PRECONDITION`; `ops::mount` asks again until the
/// file is there and the mount is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowly_ingested_files_are_waited_for() {
    let fake = FakeModal::start();
    fake.scenario(|s| s.slow_ingestion = 2);
    let m = client(&fake);
    let app = ops::app(&m, "t").await.unwrap();

    // Straight after the upload, a mount of it is refused.
    let data = b"not ingested yet".to_vec();
    let sha = sha256_hex(&data);
    let put = proto::MountPutFileRequest {
        sha256_hex: sha.clone(),
        data_oneof: Some(proto::mount_put_file_request::DataOneof::Data(data.clone())),
    };
    let r = m
        .call("MountPutFile", put, |mut c, r| async move {
            c.mount_put_file(r).await
        })
        .await
        .unwrap();
    assert!(!r.exists);
    let req = proto::MountGetOrCreateRequest {
        object_creation_type: proto::ObjectCreationType::AnonymousOwnedByApp as i32,
        files: vec![proto::MountFile {
            filename: "/f".into(),
            sha256_hex: sha,
            size: data.len() as u64,
            mode: 0o644,
        }],
        app_id: app.clone(),
        ..Default::default()
    };
    let err = m
        .call("MountGetOrCreate", req, |mut c, r| async move {
            c.mount_get_or_create(r).await
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");

    // Through `ops::mount`: probe, upload, then the upload again until `exists`.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("agent");
    std::fs::write(&p, b"a file Modal ingests slowly").unwrap();
    let before = fake.count("MountPutFile");
    let mount = ops::mount(
        &m,
        &app,
        &[MountSource {
            remote_path: "/orch/agent",
            local: &p,
            mode: 0o755,
        }],
    )
    .await
    .unwrap();
    assert!(mount.starts_with("mo-"));
    let answers: Vec<String> = fake
        .calls()
        .into_iter()
        .filter(|c| c.method == "MountPutFile")
        .skip(before)
        .map(|c| c.detail.unwrap_or_default())
        .collect();
    assert_eq!(
        answers,
        [
            "exists=false",
            "exists=false",
            "exists=false (ingesting)",
            "exists=false (ingesting)",
            "exists=true"
        ]
    );
    // Each file stored once; while Modal ingests it, its bytes are sent again
    // (the official client's loop), not asked about by digest.
    assert_eq!(fake.uploads().len(), 2, "each file stored once");
}

/// A Dockerfile context travels as the official client sends it: a context mount (files
/// at `/PATH`) referenced by the image, its 5 MiB file as a blob, here a multipart one
/// (2 MiB parts, two of the `PUT`s answered `503 Slow Down` and sent again); no request
/// carries the bytes, and the build copies the file byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_goes_as_a_mount_and_its_large_file_as_a_multipart_blob() {
    let fake = FakeModal::start();
    fake.scenario(|s| {
        s.multipart_part_bytes = Some(2 * 1024 * 1024);
        s.fail_blob_puts = 2;
    });
    let m = client(&fake);
    let app = ops::app(&m, "t").await.unwrap();
    let ctx = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..5 * 1024 * 1024 + 3)
        .map(|i: usize| (i * 7 % 253) as u8)
        .collect();
    std::fs::create_dir_all(ctx.path().join("data")).unwrap();
    std::fs::write(ctx.path().join("data/big.bin"), &big).unwrap();
    std::fs::write(ctx.path().join("small.txt"), "small\n").unwrap();
    let spec = ImageSpec::dockerfile(
        "ctx",
        "FROM scratch\nCOPY data/big.bin /data/big.bin\nCOPY small.txt /small.txt\n",
        vec![
            ("data/big.bin".into(), ctx.path().join("data/big.bin")),
            ("small.txt".into(), ctx.path().join("small.txt")),
        ],
    );
    let (r, log) = build(&m, &app, &spec).await;
    let id = r.unwrap_or_else(|e| panic!("{e}\n{log}"));

    let ctxs = fake.image_contexts();
    assert_eq!(ctxs.len(), 1, "{ctxs:?}");
    assert!(ctxs[0].mount_id.starts_with("mo-"), "{ctxs:?}");
    let mut files: Vec<(String, String, u64, bool)> = ctxs[0]
        .files
        .iter()
        .map(|f| (f.name.clone(), f.sha256.clone(), f.size, f.inline))
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            (
                "data/big.bin".to_string(),
                sha256_hex(&big),
                big.len() as u64,
                false
            ),
            ("small.txt".to_string(), sha256_hex(b"small\n"), 6, false),
        ]
    );
    let blobs = fake.blobs();
    assert_eq!(blobs.len(), 1, "{blobs:?}");
    assert_eq!(
        (blobs[0].size, blobs[0].parts),
        (big.len() as u64, 3),
        "{blobs:?}"
    );
    assert!(blobs[0].completed, "{blobs:?}");
    assert_eq!(blobs[0].puts, 3 + 2, "each refused part sent again: {blobs:?}");
    let uploads = fake.uploads();
    assert!(
        uploads.iter().any(|u| u.via_blob && u.sha256 == sha256_hex(&big)),
        "{uploads:?}"
    );
    let (method, largest) = fake.largest_request().unwrap();
    assert!(largest < 1024 * 1024, "{method} carried {largest} bytes");
    let copied = std::fs::read(fake.root().join("images").join(&id).join("rootfs/data/big.bin")).unwrap();
    assert!(copied == big, "the build copied other bytes");

    // A single upload (no multipart asked) lands the same way.
    fake.scenario(|s| s.multipart_part_bytes = None);
    let other: Vec<u8> = big.iter().map(|b| b ^ 0x5a).collect();
    std::fs::write(ctx.path().join("data/big.bin"), &other).unwrap();
    let (r, log) = build(&m, &app, &spec).await;
    let id2 = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert_ne!(id, id2);
    let blobs = fake.blobs();
    assert_eq!(blobs.len(), 2, "{blobs:?}");
    assert_eq!(
        (blobs[1].parts, blobs[1].puts, blobs[1].completed),
        (0, 1, true),
        "{blobs:?}"
    );
    let copied = std::fs::read(fake.root().join("images").join(&id2).join("rootfs/data/big.bin")).unwrap();
    assert!(copied == other, "the build copied other bytes");

    // A Dockerfile that copies nothing sends no context mount.
    let spec = ImageSpec::dockerfile(
        "none",
        "FROM scratch\nENV A=1\n",
        vec![("small.txt".into(), ctx.path().join("small.txt"))],
    );
    build(&m, &app, &spec).await.0.unwrap();
    assert_eq!(fake.image_contexts().last().unwrap().mount_id, "");
}

/// The fake refuses a request over its limit, as a gRPC server does; every call records
/// its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_limit_are_refused_and_sizes_recorded() {
    let fake = FakeModal::start();
    fake.scenario(|s| s.max_request_bytes = Some(1024 * 1024));
    let m = client(&fake);
    let app = ops::app(&m, "t").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Three MiB: under the blob threshold, so inline in `MountPutFile`.
    let p = dir.path().join("mid");
    std::fs::write(&p, vec![7u8; 3 * 1024 * 1024]).unwrap();
    let src = [MountSource {
        remote_path: "/mid",
        local: &p,
        mode: 0o644,
    }];
    match ops::mount(&m, &app, &src).await {
        Err(ModalError::Rpc { call, code, .. }) => {
            assert_eq!((call, code), ("MountPutFile", tonic::Code::ResourceExhausted))
        }
        other => panic!("{other:?}"),
    }
    let (method, largest) = fake.largest_request().unwrap();
    assert_eq!(method, "MountPutFile");
    assert!(largest > 3 * 1024 * 1024, "{largest}");
}
