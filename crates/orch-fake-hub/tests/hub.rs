//! The fake Hub over real HTTP: info, tree, resolve (HEAD, full and ranged GET), gating, error codes,
//! and interop with the `hf-hub` crate.

use std::path::Path;

use futures::StreamExt as _;
use orch_fake_hub::fixtures::{self, GeneratedModel, ModelOptions};
use orch_fake_hub::hashing::{git_blob_oid, sha256_hex};
use orch_fake_hub::{HubServer, RequestKind};
use reqwest::StatusCode;
use serde_json::Value;

const TOKEN: &str = "hf_valid_token";

fn setup(root: &Path) -> (GeneratedModel, GeneratedModel) {
    let open =
        fixtures::write_test_model(root, "acme/tiny-llama", &ModelOptions::tiny()).expect("write model");
    let gated = fixtures::write_test_model(
        root,
        "acme/gated-llama",
        &ModelOptions::tiny().seed(7).gated(TOKEN),
    )
    .expect("write gated model");
    (open, gated)
}

fn is_lfs(path: &str) -> bool {
    path.ends_with(".safetensors") || path.ends_with(".onnx")
}

async fn get(url: &str) -> reqwest::Response {
    reqwest::Client::new().get(url).send().await.expect("request")
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).and_then(|v| v.to_str().ok())
}

#[test]
fn generated_model_is_realistic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = fixtures::write_test_model(dir.path(), "acme/m", &ModelOptions::with_size(600 << 10, 3))
        .expect("write");
    let names: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    for want in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "onnx/model.onnx",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let config: Value =
        serde_json::from_slice(&std::fs::read(m.path_of("config.json")).expect("read")).expect("json");
    assert_eq!(config["architectures"][0], "LlamaForCausalLM");
    assert_eq!(config["num_hidden_layers"], 3);
    assert_eq!(config["torch_dtype"], "bfloat16");

    // Every shard parses as safetensors and the index covers exactly its tensors.
    let index: Value =
        serde_json::from_slice(&std::fs::read(m.path_of("model.safetensors.index.json")).expect("read"))
            .expect("json");
    let mut total = 0u64;
    let mut tensors = 0usize;
    for shard in names.iter().filter(|n| n.ends_with(".safetensors")) {
        let bytes = std::fs::read(m.path_of(shard)).expect("read shard");
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        assert_eq!(n % 8, 0);
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header json");
        assert_eq!(header["__metadata__"]["format"], "pt");
        let mut end_max = 0u64;
        for (name, t) in header.as_object().expect("object") {
            if name == "__metadata__" {
                continue;
            }
            tensors += 1;
            assert_eq!(index["weight_map"][name], *shard);
            let elems: u64 = t["shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|d| d.as_u64().expect("dim"))
                .product();
            let size = if t["dtype"] == "F32" { 4 } else { 2 };
            let (a, b) = (
                t["data_offsets"][0].as_u64().expect("a"),
                t["data_offsets"][1].as_u64().expect("b"),
            );
            assert_eq!(b - a, elems * size, "{name}");
            end_max = end_max.max(b);
            total += b - a;
        }
        assert_eq!(
            8 + n as u64 + end_max,
            bytes.len() as u64,
            "{shard}: data fills the file"
        );
    }
    assert_eq!(index["weight_map"].as_object().expect("map").len(), tensors);
    assert_eq!(index["metadata"]["total_size"], total);

    // Deterministic.
    let dir2 = tempfile::tempdir().expect("tempdir");
    let m2 = fixtures::write_test_model(dir2.path(), "acme/m", &ModelOptions::with_size(600 << 10, 3))
        .expect("write");
    for f in &m.files {
        assert_eq!(
            std::fs::read(m.path_of(&f.path)).ok(),
            std::fs::read(m2.path_of(&f.path)).ok(),
            "{}",
            f.path
        );
    }
}

#[tokio::test]
async fn info_tree_resolve_and_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (open, _gated) = setup(dir.path());
    let server = HubServer::start(dir.path());
    let ep = server.endpoint();
    let commit = server.commit("acme/tiny-llama").expect("commit");
    assert_eq!(commit.len(), 40);
    assert!(commit.chars().all(|c| c.is_ascii_hexdigit()));

    // Info.
    let r = get(&format!("{ep}/api/models/acme/tiny-llama")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let info: Value = r.json().await.expect("json");
    assert_eq!(info["id"], "acme/tiny-llama");
    assert_eq!(info["sha"], commit.as_str());
    assert_eq!(info["gated"], false);
    let siblings: Vec<&str> = info["siblings"]
        .as_array()
        .expect("siblings")
        .iter()
        .map(|s| s["rfilename"].as_str().expect("name"))
        .collect();
    let files: Vec<&str> = open.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(siblings, files);
    assert!(!siblings.contains(&orch_fake_hub::MARKER_FILE));
    let r = get(&format!(
        "{ep}/api/models/acme/tiny-llama/revision/{commit}?blobs=true"
    ))
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let info: Value = r.json().await.expect("json");
    assert_eq!(info["siblings"][0]["size"], open.files[0].size);
    let r = get(&format!("{ep}/api/models/acme/tiny-llama/revision/v9")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(header(&r, "x-error-code"), Some("RevisionNotFound"));

    // Recursive tree: sizes, blob oids, lfs sha256, directory entry.
    let r = get(&format!(
        "{ep}/api/models/acme/tiny-llama/tree/main?recursive=true"
    ))
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let tree: Vec<Value> = r.json().await.expect("json");
    let tree_files: Vec<&Value> = tree.iter().filter(|e| e["type"] == "file").collect();
    assert_eq!(tree_files.len(), open.files.len());
    assert!(tree
        .iter()
        .any(|e| e["type"] == "directory" && e["path"] == "onnx"));
    for e in tree_files {
        let path = e["path"].as_str().expect("path");
        let content = std::fs::read(open.path_of(path)).expect("read");
        assert_eq!(e["size"], content.len() as u64, "{path}");
        if is_lfs(path) {
            assert_eq!(e["lfs"]["oid"], sha256_hex(&content), "{path}");
            assert_eq!(e["lfs"]["size"], content.len() as u64);
            assert_eq!(server.etag("acme/tiny-llama", path), Some(sha256_hex(&content)));
        } else {
            assert!(e.get("lfs").is_none(), "{path}");
            assert_eq!(e["oid"], git_blob_oid(&content), "{path}");
        }
    }
    // Non-recursive and subfolder listings.
    let tree: Vec<Value> = get(&format!("{ep}/api/models/acme/tiny-llama/tree/main"))
        .await
        .json()
        .await
        .expect("json");
    assert!(tree
        .iter()
        .any(|e| e["path"] == "onnx" && e["type"] == "directory"));
    assert!(!tree.iter().any(|e| e["path"] == "onnx/model.onnx"));
    let tree: Vec<Value> = get(&format!("{ep}/api/models/acme/tiny-llama/tree/{commit}/onnx"))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(tree.len(), 1);
    assert_eq!(tree[0]["path"], "onnx/model.onnx");

    // HEAD headers.
    let shard = "model-00001-of-00002.safetensors";
    let content = std::fs::read(open.path_of(shard)).expect("read");
    let sha = sha256_hex(&content);
    let r = reqwest::Client::new()
        .head(format!("{ep}/acme/tiny-llama/resolve/main/{shard}"))
        .send()
        .await
        .expect("head");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "etag"), Some(format!("\"{sha}\"").as_str()));
    assert_eq!(header(&r, "x-linked-etag"), Some(format!("\"{sha}\"").as_str()));
    assert_eq!(
        header(&r, "x-linked-size"),
        Some(content.len().to_string().as_str())
    );
    assert_eq!(
        header(&r, "content-length"),
        Some(content.len().to_string().as_str())
    );
    assert_eq!(header(&r, "x-repo-commit"), Some(commit.as_str()));
    assert_eq!(header(&r, "accept-ranges"), Some("bytes"));
    let r = reqwest::Client::new()
        .head(format!("{ep}/acme/tiny-llama/resolve/main/config.json"))
        .send()
        .await
        .expect("head");
    let cfg = std::fs::read(open.path_of("config.json")).expect("read");
    assert_eq!(
        header(&r, "etag"),
        Some(format!("\"{}\"", git_blob_oid(&cfg)).as_str())
    );
    assert_eq!(header(&r, "x-linked-etag"), None);

    // Full and ranged GET.
    let r = get(&format!("{ep}/acme/tiny-llama/resolve/main/{shard}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.bytes().await.expect("body").as_ref(), content.as_slice());
    let r = reqwest::Client::new()
        .get(format!("{ep}/acme/tiny-llama/resolve/{commit}/{shard}"))
        .header("Range", "bytes=100-1123")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        header(&r, "content-range"),
        Some(format!("bytes 100-1123/{}", content.len()).as_str())
    );
    assert_eq!(header(&r, "content-length"), Some("1024"));
    assert_eq!(
        header(&r, "x-linked-size"),
        None,
        "206 must not advertise the full size as X-Linked-Size"
    );
    assert_eq!(r.bytes().await.expect("body").as_ref(), &content[100..1124]);
    let r = reqwest::Client::new()
        .get(format!("{ep}/acme/tiny-llama/resolve/main/{shard}"))
        .header("Range", format!("bytes={}-", content.len() - 10))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        r.bytes().await.expect("body").as_ref(),
        &content[content.len() - 10..]
    );
    let r = reqwest::Client::new()
        .get(format!("{ep}/acme/tiny-llama/resolve/main/{shard}"))
        .header("Range", format!("bytes={}-", content.len()))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    let r = get(&format!("{ep}/acme/tiny-llama/resolve/main/onnx/model.onnx")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.bytes().await.expect("body").to_vec(),
        std::fs::read(open.path_of("onnx/model.onnx")).expect("read")
    );

    // Error codes.
    let r = get(&format!("{ep}/acme/nope/resolve/main/config.json")).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(header(&r, "x-error-code"), Some("RepoNotFound"));
    let r = get(&format!("{ep}/api/models/acme/nope")).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(header(&r, "x-error-code"), Some("RepoNotFound"));
    let r = get(&format!("{ep}/acme/tiny-llama/resolve/main/missing.bin")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(header(&r, "x-error-code"), Some("EntryNotFound"));
    let r = get(&format!("{ep}/acme/tiny-llama/resolve/v2/config.json")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(header(&r, "x-error-code"), Some("RevisionNotFound"));
    let r = get(&format!("{ep}/some/other/path")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // Counters.
    assert_eq!(server.count(RequestKind::ResolveHead), 2);
    assert_eq!(server.count(RequestKind::ResolveGet), 8);
    assert_eq!(server.ranged_gets(), 3);
    assert!(server
        .requests()
        .iter()
        .any(|r| r.range.as_deref() == Some("bytes=100-1123") && r.status == 206));
    assert!(server.bytes_served() >= content.len() as u64);
    server.clear_requests();
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn gated_repo() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_open, gated) = setup(dir.path());
    // Also gate the open repo through the builder.
    let server = HubServer::builder(dir.path())
        .gated("acme/tiny-llama", "hf_other")
        .start()
        .expect("start");
    let ep = server.endpoint();
    let client = reqwest::Client::new();

    for repo in ["acme/gated-llama", "acme/tiny-llama"] {
        let info: Value = get(&format!("{ep}/api/models/{repo}"))
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(info["gated"], "manual");
    }
    let url = format!("{ep}/acme/gated-llama/resolve/main/config.json");
    for head in [true, false] {
        let req = |tok: Option<&str>| {
            let mut b = if head { client.head(&url) } else { client.get(&url) };
            if let Some(t) = tok {
                b = b.bearer_auth(t);
            }
            b.send()
        };
        let r = req(None).await.expect("send");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(header(&r, "x-error-code"), Some("GatedRepo"));
        assert_eq!(
            header(&r, "x-error-message"),
            Some(
                "Access to model acme/gated-llama is restricted. You must have access to it and be \
                 authenticated to access it. Please log in."
            )
        );
        if !head {
            let body: Value = r.json().await.expect("json");
            assert!(body["error"].as_str().expect("error").contains("restricted"));
        }
        let r = req(Some("hf_wrong")).await.expect("send");
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(header(&r, "x-error-code"), Some("GatedRepo"));
        assert!(header(&r, "x-error-message")
            .expect("message")
            .contains("not in the authorized list"));
        let r = req(Some(TOKEN)).await.expect("send");
        assert_eq!(r.status(), StatusCode::OK);
        if !head {
            assert_eq!(
                r.bytes().await.expect("body").to_vec(),
                std::fs::read(gated.path_of("config.json")).expect("read")
            );
        }
    }
    let r = get(&format!("{ep}/api/models/acme/gated-llama/tree/main")).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(header(&r, "x-error-code"), Some("GatedRepo"));
    let r = client
        .get(format!("{ep}/api/models/acme/gated-llama/tree/main"))
        .bearer_auth(TOKEN)
        .send()
        .await;
    assert_eq!(r.expect("send").status(), StatusCode::OK);
    let r = client
        .get(format!("{ep}/acme/tiny-llama/resolve/main/config.json"))
        .bearer_auth(TOKEN)
        .send()
        .await;
    assert_eq!(r.expect("send").status(), StatusCode::FORBIDDEN);
    let r = client
        .get(format!("{ep}/acme/tiny-llama/resolve/main/config.json"))
        .bearer_auth("hf_other")
        .send()
        .await;
    assert_eq!(r.expect("send").status(), StatusCode::OK);
}

#[tokio::test]
async fn large_file_streams_from_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = ModelOptions {
        onnx: false,
        ..ModelOptions::with_size_mb(110, 1)
    };
    let m = fixtures::write_test_model(dir.path(), "acme/big", &opts).expect("write");
    let big = m.largest_file().expect("files").clone();
    assert!(big.size > 100_000_000, "{big:?}");
    let server = HubServer::start(dir.path());
    let (want, _) = orch_fake_hub::hashing::sha256_file(&m.path_of(&big.path)).expect("hash");
    assert_eq!(server.etag("acme/big", &big.path), Some(want.clone()));

    let r = get(&format!(
        "{}/acme/big/resolve/main/{}",
        server.endpoint(),
        big.path
    ))
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.content_length(), Some(big.size));
    let mut stream = r.bytes_stream();
    let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
    let mut n = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("chunk");
        n += chunk.len() as u64;
        sha2::Digest::update(&mut hasher, &chunk);
    }
    assert_eq!(n, big.size);
    assert_eq!(
        orch_fake_hub::hashing::to_hex(&sha2::Digest::finalize(hasher)),
        want
    );
}

#[tokio::test]
async fn hf_hub_crate_interop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = tempfile::tempdir().expect("tempdir");
    let (open, gated) = setup(dir.path());
    let server = HubServer::start(dir.path());
    let client = hf_hub::HFClient::builder()
        .endpoint(server.endpoint())
        .cache_dir(cache.path())
        .build()
        .expect("client");
    let repo = client.model("acme", "tiny-llama");

    let info = repo.info().send().await.expect("info");
    assert_eq!(info.sha.as_deref(), server.commit("acme/tiny-llama").as_deref());
    assert_eq!(info.siblings.as_ref().map(Vec::len), Some(open.files.len()));

    let entries: Vec<_> = repo
        .list_tree()
        .recursive(true)
        .send()
        .expect("tree")
        .collect::<Vec<_>>()
        .await;
    let mut files = 0;
    for e in entries {
        if let hf_hub::repository::RepoTreeEntry::File { path, size, lfs, .. } = e.expect("entry") {
            files += 1;
            let content = std::fs::read(open.path_of(&path)).expect("read");
            assert_eq!(size, content.len() as u64);
            if is_lfs(&path) {
                let sha = lfs.and_then(|l| l.sha256);
                // The tree sends the sha256 as both `oid` and `sha256` inside `lfs`.
                assert_eq!(sha, Some(sha256_hex(&content)), "{path}");
            }
        }
    }
    assert_eq!(files, open.files.len());

    let shard = "model-00002-of-00002.safetensors";
    let content = std::fs::read(open.path_of(shard)).expect("read");
    let (len, mut stream) = repo
        .download_file_stream()
        .filename(shard)
        .range(8..4096)
        .send()
        .await
        .expect("stream");
    assert_eq!(len, Some(4088));
    let mut got = Vec::new();
    while let Some(c) = stream.next().await {
        got.extend_from_slice(&c.expect("chunk"));
    }
    assert_eq!(got, &content[8..4096]);
    assert!(server
        .requests()
        .iter()
        .any(|r| r.range.as_deref() == Some("bytes=8-4095") && r.status == 206));

    let path = repo
        .download_file()
        .filename("onnx/model.onnx")
        .send()
        .await
        .expect("download_file");
    assert_eq!(
        std::fs::read(path).expect("read"),
        std::fs::read(open.path_of("onnx/model.onnx")).expect("read")
    );

    // Gated: AuthRequired without a token, works with it.
    let gated_repo = client.model("acme", "gated-llama");
    let err = gated_repo
        .download_file()
        .filename("config.json")
        .send()
        .await
        .expect_err("gated");
    assert!(matches!(err, hf_hub::HFError::AuthRequired { .. }), "{err:?}");
    let authed = hf_hub::HFClient::builder()
        .endpoint(server.endpoint())
        .cache_dir(cache.path())
        .token(TOKEN)
        .build()
        .expect("client");
    let path = authed
        .model("acme", "gated-llama")
        .download_file()
        .filename("config.json")
        .send()
        .await;
    assert_eq!(
        std::fs::read(path.expect("download")).expect("read"),
        std::fs::read(gated.path_of("config.json")).expect("read")
    );
}
