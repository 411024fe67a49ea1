//! `orch-fixtures`: generated model repositories, written to disk in the layout the Hugging Face
//! Hub serves (`orch-fake-hub`'s `HubServer` serves them as they lie): `root/{org}/{name}/...`.
//! Test support that costs no async runtime and no server: std and `serde_json` only, so a crate
//! whose tests need a model on disk builds nothing of the fakes.
//!
//! Content is streamed to disk while it is generated, so multi-gigabyte models are never held in
//! memory. Everything is deterministic: the same spec always produces byte-identical files.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

/// Name of the per-repo marker file (inside `root/org/name/`) that the fake Hub reads and never
/// serves.
///
/// JSON object; recognised keys: `"gated_token"` (string: the repo is gated and only this bearer
/// token may read it) and `"generator"` (free-form, written here to describe how the repo was
/// generated).
pub const MARKER_FILE: &str = ".fakehub.json";

/// Element type of a generated tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    Bf16,
    F16,
    F32,
}

impl Dtype {
    /// Size of one element in bytes.
    pub fn size(self) -> u64 {
        match self {
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
        }
    }

    /// The safetensors dtype name (`"BF16"`, `"F16"`, `"F32"`).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "BF16",
            Dtype::F16 => "F16",
            Dtype::F32 => "F32",
        }
    }

    /// The `torch_dtype` name used in `config.json`.
    pub fn torch_name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bfloat16",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
        }
    }
}

/// One tensor of a generated safetensors file.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: Vec<u64>) -> Self {
        TensorSpec {
            name: name.into(),
            dtype,
            shape,
        }
    }

    /// Number of data bytes.
    pub fn byte_len(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size()
    }
}

/// A safetensors file: tensors in order, data filled with deterministic pseudo-random values.
#[derive(Debug, Clone)]
pub struct SafetensorsSpec {
    pub tensors: Vec<TensorSpec>,
    pub seed: u64,
}

impl SafetensorsSpec {
    /// The JSON header (padded with spaces to a multiple of 8 bytes, like the reference
    /// implementation) and the total data length.
    pub fn header(&self) -> (String, u64) {
        let mut parts = vec![r#""__metadata__":{"format":"pt"}"#.to_string()];
        let mut offset = 0u64;
        for t in &self.tensors {
            let end = offset + t.byte_len();
            let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
            parts.push(format!(
                r#"{}:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}}"#,
                serde_json::Value::String(t.name.clone()),
                t.dtype.safetensors_name(),
                shape.join(","),
                offset,
                end
            ));
            offset = end;
        }
        let mut header = format!("{{{}}}", parts.join(","));
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        (header, offset)
    }

    /// Total file size in bytes.
    pub fn file_size(&self) -> u64 {
        let (header, data) = self.header();
        8 + header.len() as u64 + data
    }
}

/// Where a file's content comes from.
#[derive(Debug, Clone)]
pub enum FileSource {
    /// Literal content.
    Bytes(Vec<u8>),
    /// `size` deterministic pseudo-random bytes.
    Random { size: u64, seed: u64 },
    /// A real safetensors file.
    Safetensors(SafetensorsSpec),
}

/// A repository to write under a hub root.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// `org/name`.
    pub repo: String,
    /// Repo-relative paths (`/`-separated, may contain folders) and their content.
    pub files: Vec<(String, FileSource)>,
    /// `Some(token)`: the repo is gated and only `Authorization: Bearer {token}` may download it.
    pub gated: Option<String>,
}

/// A file that was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedFile {
    /// Repo-relative path.
    pub path: String,
    pub size: u64,
}

/// Result of writing a [`ModelSpec`].
#[derive(Debug, Clone)]
pub struct GeneratedModel {
    /// `org/name`.
    pub repo: String,
    /// `root/org/name`.
    pub dir: PathBuf,
    pub files: Vec<GeneratedFile>,
}

impl GeneratedModel {
    /// Sum of all file sizes.
    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// The largest file, if any.
    pub fn largest_file(&self) -> Option<&GeneratedFile> {
        self.files.iter().max_by_key(|f| f.size)
    }

    /// Absolute path of a repo-relative file.
    pub fn path_of(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }
}

/// `root/org/name` for a repo id.
pub fn repo_dir(root: &Path, repo: &str) -> PathBuf {
    root.join(repo)
}

impl ModelSpec {
    pub fn new(repo: impl Into<String>) -> Self {
        ModelSpec {
            repo: repo.into(),
            files: Vec::new(),
            gated: None,
        }
    }

    /// Add a file.
    pub fn file(mut self, path: impl Into<String>, source: FileSource) -> Self {
        self.files.push((path.into(), source));
        self
    }

    /// Gate the repo behind `token`.
    pub fn gated(mut self, token: impl Into<String>) -> Self {
        self.gated = Some(token.into());
        self
    }

    /// Write the repo to `root/org/name` (replacing files of the same name; other files are left).
    pub fn write(&self, root: &Path) -> io::Result<GeneratedModel> {
        validate_repo_id(&self.repo)?;
        let dir = repo_dir(root, &self.repo);
        fs::create_dir_all(&dir)?;
        let mut files = Vec::with_capacity(self.files.len());
        for (rel, source) in &self.files {
            if rel.is_empty() || rel.starts_with('/') || rel.split('/').any(|s| s.is_empty() || s == "..") {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("bad file path {rel:?}"),
                ));
            }
            let path = dir.join(rel);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            let size = write_source(&path, rel, source)?;
            files.push(GeneratedFile {
                path: rel.clone(),
                size,
            });
        }
        let marker = dir.join(MARKER_FILE);
        match &self.gated {
            Some(token) => fs::write(
                &marker,
                serde_json::to_vec_pretty(&json!({ "gated_token": token }))?,
            )?,
            None => {
                if marker.exists() {
                    fs::remove_file(&marker)?;
                }
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(GeneratedModel {
            repo: self.repo.clone(),
            dir,
            files,
        })
    }
}

fn validate_repo_id(repo: &str) -> io::Result<()> {
    let parts: Vec<&str> = repo.split('/').collect();
    let ok = parts.len() == 2 && parts.iter().all(|p| !p.is_empty() && !p.starts_with('.'));
    if ok {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("repo id must be org/name, got {repo:?}"),
        ))
    }
}

fn write_source(path: &Path, rel: &str, source: &FileSource) -> io::Result<u64> {
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
    let size = match source {
        FileSource::Bytes(b) => {
            out.write_all(b)?;
            b.len() as u64
        }
        FileSource::Random { size, seed } => {
            let mut rng = Rng::new(*seed ^ fnv(rel));
            write_random(&mut out, *size, &mut rng, None)?;
            *size
        }
        FileSource::Safetensors(spec) => {
            let (header, _) = spec.header();
            out.write_all(&(header.len() as u64).to_le_bytes())?;
            out.write_all(header.as_bytes())?;
            let mut rng = Rng::new(spec.seed ^ fnv(rel));
            for t in &spec.tensors {
                write_random(&mut out, t.byte_len(), &mut rng, Some(t.dtype))?;
            }
            spec.file_size()
        }
    };
    out.flush()?;
    Ok(size)
}

/// splitmix64: fast, deterministic, good enough for filler data.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Write `len` bytes of pseudo-random data; with a dtype, the values are small finite floats
/// (no NaN/inf) like real weights.
fn write_random(out: &mut impl Write, len: u64, rng: &mut Rng, dtype: Option<Dtype>) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        for chunk in buf[..n].chunks_mut(8) {
            let mut v = rng.next();
            v = match dtype {
                // 4 x bf16/f16: keep sign + mantissa, force a small exponent.
                Some(Dtype::Bf16) => (v & 0x807F_807F_807F_807F) | 0x3C00_3C00_3C00_3C00,
                Some(Dtype::F16) => (v & 0x83FF_83FF_83FF_83FF) | 0x2000_2000_2000_2000,
                Some(Dtype::F32) => (v & 0x807F_FFFF_807F_FFFF) | 0x3C00_0000_3C00_0000,
                None => v,
            };
            let bytes = v.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Options for [`write_test_model`].
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// Approximate total tensor bytes over all shards (each shard gets `weights_bytes / shards`,
    /// give or take a few KiB for norms/embeddings and header).
    pub weights_bytes: u64,
    /// Number of `model-0000i-of-0000N.safetensors` shards (at least 1; always with an index).
    pub shards: usize,
    /// dtype of the weight matrices (norms are always F32).
    pub dtype: Dtype,
    /// `hidden_size` in config.json, and the column count of every matrix.
    pub hidden_size: u64,
    /// Also write `onnx/model.onnx` (a small LFS file in a subfolder).
    pub onnx: bool,
    /// Seed of the pseudo-random data.
    pub seed: u64,
    /// `Some(token)`: gate the repo behind this token.
    pub gated: Option<String>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions::tiny()
    }
}

impl ModelOptions {
    /// About 256 KiB of weights in 2 shards, plus the small files and `onnx/model.onnx`.
    pub fn tiny() -> Self {
        ModelOptions {
            weights_bytes: 256 << 10,
            shards: 2,
            dtype: Dtype::Bf16,
            hidden_size: 256,
            onnx: true,
            seed: 42,
            gated: None,
        }
    }

    /// About `bytes` of weights in `shards` shards.
    pub fn with_size(bytes: u64, shards: usize) -> Self {
        ModelOptions {
            weights_bytes: bytes,
            shards: shards.max(1),
            ..ModelOptions::tiny()
        }
    }

    /// About `mb` MiB of weights in `shards` shards.
    pub fn with_size_mb(mb: u64, shards: usize) -> Self {
        ModelOptions::with_size(mb << 20, shards)
    }

    pub fn gated(mut self, token: impl Into<String>) -> Self {
        self.gated = Some(token.into());
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// Small vocabulary used by the generated tokenizer and embedding sizes.
const VOCAB: &[&str] = &[
    "<unk>", "<s>", "</s>", "▁the", "▁a", "▁model", "▁orch", "▁test", "▁hello", "▁world", "e", "t", "a", "o",
    "i", "n", "s", "r", "h", "l", "d", "c", "u", "m", "▁", ".", ",", "!", "?", "th", "he", "in",
];

/// The [`ModelSpec`] of a llama-like model: config, tokenizer files, safetensors shards + index,
/// README, `.gitattributes` and optionally `onnx/model.onnx`.
pub fn llama_like_spec(repo: &str, opts: &ModelOptions) -> ModelSpec {
    let shards = opts.shards.max(1);
    let h = opts.hidden_size.max(8);
    let vocab = VOCAB.len() as u64;
    let per_shard = opts.weights_bytes / shards as u64;
    let norms = 2 * h * 4;
    let rows = ((per_shard.saturating_sub(norms)) / 7 / (h * opts.dtype.size())).max(1);

    let mut shard_specs = Vec::with_capacity(shards);
    let mut weight_map = serde_json::Map::new();
    let mut total_size = 0u64;
    for s in 0..shards {
        let name = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        let mut tensors = Vec::new();
        if s == 0 {
            tensors.push(TensorSpec::new(
                "model.embed_tokens.weight",
                opts.dtype,
                vec![vocab, h],
            ));
        }
        let l = format!("model.layers.{s}");
        tensors.push(TensorSpec::new(
            format!("{l}.input_layernorm.weight"),
            Dtype::F32,
            vec![h],
        ));
        for m in [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
        ] {
            tensors.push(TensorSpec::new(
                format!("{l}.{m}.weight"),
                opts.dtype,
                vec![rows, h],
            ));
        }
        tensors.push(TensorSpec::new(
            format!("{l}.post_attention_layernorm.weight"),
            Dtype::F32,
            vec![h],
        ));
        for m in ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] {
            tensors.push(TensorSpec::new(
                format!("{l}.{m}.weight"),
                opts.dtype,
                vec![rows, h],
            ));
        }
        if s + 1 == shards {
            tensors.push(TensorSpec::new("model.norm.weight", Dtype::F32, vec![h]));
            tensors.push(TensorSpec::new("lm_head.weight", opts.dtype, vec![vocab, h]));
        }
        for t in &tensors {
            total_size += t.byte_len();
            weight_map.insert(t.name.clone(), json!(name));
        }
        shard_specs.push((
            name,
            SafetensorsSpec {
                tensors,
                seed: opts.seed.wrapping_add(s as u64),
            },
        ));
    }

    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": rows,
        "num_hidden_layers": shards,
        "num_attention_heads": (h / 64).max(1),
        "num_key_value_heads": (h / 64).max(1),
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": false,
        "torch_dtype": opts.dtype.torch_name(),
        "transformers_version": "4.46.0"
    });
    let vocab_map: serde_json::Map<String, serde_json::Value> = VOCAB
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), json!(i)))
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        ]},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"}
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": false,
            "vocab": vocab_map,
            "merges": ["t h", "h e", "i n"]
        }
    });
    let tokenizer_config = json!({
        "add_bos_token": true,
        "add_eos_token": false,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": null,
        "clean_up_tokenization_spaces": false,
        "model_max_length": 2048,
        "tokenizer_class": "LlamaTokenizerFast",
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    });
    let generation_config = json!({
        "_from_model_config": true,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "do_sample": true,
        "temperature": 0.6,
        "top_p": 0.9,
        "transformers_version": "4.46.0"
    });
    let index = json!({ "metadata": { "total_size": total_size }, "weight_map": weight_map });
    let readme = format!(
        "---\nlicense: apache-2.0\nlibrary_name: transformers\npipeline_tag: text-generation\n---\n\n# {repo}\n\n\
         Generated test model ({shards} shards, {total_size} bytes of weights).\n"
    );
    let gitattributes = "*.safetensors filter=lfs diff=lfs merge=lfs -text\n\
                         *.bin filter=lfs diff=lfs merge=lfs -text\n\
                         *.onnx filter=lfs diff=lfs merge=lfs -text\n";

    let pretty = |v: &serde_json::Value| {
        // Serializing a serde_json::Value to a Vec cannot fail.
        let mut b = serde_json::to_vec_pretty(v).expect("serialize json value");
        b.push(b'\n');
        b
    };
    let mut spec = ModelSpec::new(repo)
        .file(
            ".gitattributes",
            FileSource::Bytes(gitattributes.as_bytes().to_vec()),
        )
        .file("README.md", FileSource::Bytes(readme.into_bytes()))
        .file("config.json", FileSource::Bytes(pretty(&config)))
        .file(
            "generation_config.json",
            FileSource::Bytes(pretty(&generation_config)),
        )
        .file("tokenizer.json", FileSource::Bytes(pretty(&tokenizer)))
        .file(
            "tokenizer_config.json",
            FileSource::Bytes(pretty(&tokenizer_config)),
        )
        .file("model.safetensors.index.json", FileSource::Bytes(pretty(&index)));
    for (name, st) in shard_specs {
        spec = spec.file(name, FileSource::Safetensors(st));
    }
    if opts.onnx {
        spec = spec.file(
            "onnx/model.onnx",
            FileSource::Random {
                size: 4096 + 123,
                seed: opts.seed,
            },
        );
    }
    spec.gated = opts.gated.clone();
    spec
}

/// Generate a realistic llama-like model repo at `root/{repo}` (see [`llama_like_spec`]).
///
/// `ModelOptions::with_size_mb(110, 1)` gives one shard over 100 MB;
/// `ModelOptions::with_size_mb(2048, 10)` gives ≥ 2 GiB in 10 shards (+ 8 small files).
pub fn write_test_model(root: &Path, repo: &str, opts: &ModelOptions) -> io::Result<GeneratedModel> {
    llama_like_spec(repo, opts).write(root)
}
