//! `fast-openai`: an OpenAI-compatible completions server that is never the
//! bottleneck, for measuring load generators (`scripts/bench-loadgen.sh`).
//!
//! ```text
//! fast-openai [--port N] [--threads N] [--ttft-ms X] [--itl-ms X] [--model NAME] [--tokenizer FILE]
//! ```
//!
//! `/v1/completions` and `/v1/chat/completions`, streamed (SSE, as vLLM
//! frames them, with the `usage` chunk when `stream_options.include_usage`)
//! or whole. Every answer has `max_tokens` (or `max_completion_tokens`, 16 by
//! default) tokens ` tok`; the first after `--ttft-ms`, the next each
//! `--itl-ms` later (0: at once), on tokio timers, so the server's own
//! latency is known and what a client adds can be read off. `usage` counts
//! the prompt's tokens with `--tokenizer` (a `tokenizer.json`, special tokens
//! included, as a vLLM server counts them), else its whitespace-separated
//! words (a chat request: its messages' contents). `GET /v1/models`, `GET /health`, and `GET /stats` (requests
//! served, in flight, the most in flight at once). The first stdout line is
//! `endpoint http://127.0.0.1:PORT`.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const USAGE: &str =
    "usage: fast-openai [--port N] [--threads N] [--ttft-ms X] [--itl-ms X] [--model NAME] [--tokenizer FILE]

  --port N      port on 127.0.0.1 (default: a free port)
  --threads N   tokio worker threads (default 1)
  --ttft-ms X   delay before the first token (default 0)
  --itl-ms X    delay between tokens (default 0: all at once)
  --model NAME  the model id `/v1/models` lists (default `fast`)
  --tokenizer F a tokenizer.json: `usage.prompt_tokens` in its tokens (default: words)";

struct Opts {
    port: u16,
    threads: usize,
    ttft: Duration,
    itl: Duration,
    model: String,
    tokenizer: Option<tokenizers::Tokenizer>,
}

#[derive(Default)]
struct Stats {
    served: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

struct State {
    opts: Opts,
    stats: Stats,
}

type Body = BoxBody<Bytes, Infallible>;

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        port: 0,
        threads: 1,
        ttft: Duration::ZERO,
        itl: Duration::ZERO,
        model: "fast".into(),
        tokenizer: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("`{a}` needs a value"));
        let ms = |v: String| -> Result<Duration, String> {
            v.parse::<f64>()
                .ok()
                .filter(|x| *x >= 0.0)
                .map(|x| Duration::from_secs_f64(x / 1000.0))
                .ok_or_else(|| format!("`{v}` is not a number of milliseconds"))
        };
        match a.as_str() {
            "--port" => {
                o.port = val()?
                    .parse()
                    .map_err(|_| "`--port` takes a number".to_string())?
            }
            "--threads" => {
                o.threads = val()?
                    .parse()
                    .map_err(|_| "`--threads` takes a number".to_string())?
            }
            "--ttft-ms" => o.ttft = ms(val()?)?,
            "--itl-ms" => o.itl = ms(val()?)?,
            "--model" => o.model = val()?,
            "--tokenizer" => {
                let path = val()?;
                o.tokenizer = Some(
                    tokenizers::Tokenizer::from_file(&path)
                        .map_err(|e| format!("cannot load the tokenizer `{path}`: {e}"))?,
                )
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("fast-openai: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fast-openai: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fast-openai: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(opts: Opts) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port)).await?;
    let addr = listener.local_addr()?;
    println!("endpoint http://{addr}");
    std::io::stdout().flush()?;
    let state = Arc::new(State {
        opts,
        stats: Stats::default(),
    });
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            // Too many open files and the like: keep serving the others.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(state.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn full(status: StatusCode, ctype: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    if let Ok(v) = ctype.parse() {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Tokens (with a tokenizer) or whitespace-separated words of the prompt,
/// or of every message's content.
fn prompt_tokens(v: &Value, tok: Option<&tokenizers::Tokenizer>) -> u64 {
    let count = |s: &str| match tok.and_then(|t| t.encode(s, true).ok()) {
        Some(enc) => enc.get_ids().len() as u64,
        None => s.split_whitespace().count() as u64,
    };
    if let Some(p) = v.get("prompt") {
        return match p {
            Value::String(s) => count(s),
            Value::Array(a) => a.iter().filter_map(|x| x.as_str()).map(count).sum(),
            _ => 0,
        };
    }
    v.get("messages")
        .and_then(|m| m.as_array())
        .map(|msgs| {
            msgs.iter()
                .map(|m| match m.get("content") {
                    Some(Value::String(s)) => count(s),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
                        .map(count)
                        .sum(),
                    _ => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

struct InFlight(Arc<State>);

impl InFlight {
    fn new(state: Arc<State>) -> Self {
        let n = state.stats.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        state.stats.max_in_flight.fetch_max(n, Ordering::Relaxed);
        InFlight(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.stats.served.fetch_add(1, Ordering::Relaxed);
    }
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let json_type = "application/json";
    match (method, path.as_str()) {
        (Method::GET, "/health") => Ok(full(StatusCode::OK, "text/plain", "ok")),
        (Method::GET, "/v1/models") => Ok(full(
            StatusCode::OK,
            json_type,
            json!({"object": "list", "data": [{"id": state.opts.model, "object": "model", "created": now_s(), "owned_by": "fast-openai"}]})
                .to_string(),
        )),
        (Method::GET, "/stats") => Ok(full(
            StatusCode::OK,
            json_type,
            json!({
                "served": state.stats.served.load(Ordering::Relaxed),
                "in_flight": state.stats.in_flight.load(Ordering::Relaxed),
                "max_in_flight": state.stats.max_in_flight.load(Ordering::Relaxed),
            })
            .to_string(),
        )),
        (Method::POST, "/v1/completions") | (Method::POST, "/v1/chat/completions") => {
            let chat = path.ends_with("chat/completions");
            let bytes = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return Ok(full(StatusCode::BAD_REQUEST, json_type, r#"{"error":"unreadable body"}"#)),
            };
            let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
                return Ok(full(StatusCode::BAD_REQUEST, json_type, r#"{"error":"body is not JSON"}"#));
            };
            Ok(answer(state, chat, &v))
        }
        _ => Ok(full(StatusCode::NOT_FOUND, json_type, r#"{"error":"not found"}"#)),
    }
}

fn answer(state: Arc<State>, chat: bool, v: &Value) -> Response<Body> {
    let guard = InFlight::new(state.clone());
    let n = v
        .get("max_completion_tokens")
        .or_else(|| v.get("max_tokens"))
        .and_then(|x| x.as_u64())
        .unwrap_or(16)
        .max(1);
    let stream = v.get("stream").and_then(|x| x.as_bool()).unwrap_or(false);
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(|x| x.as_bool())
        .unwrap_or(false);
    let prompt_tokens = prompt_tokens(v, state.opts.tokenizer.as_ref());
    let model = v
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or(&state.opts.model)
        .to_string();
    let usage =
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n});
    let created = now_s();
    let id = format!("cmpl-{}", state.stats.served.load(Ordering::Relaxed));
    let (ttft, itl) = (state.opts.ttft, state.opts.itl);
    if !stream {
        let text = " tok".repeat(n as usize);
        let body = if chat {
            json!({"id": id, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": usage})
        } else {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}],
                "usage": usage})
        };
        let fut = async move {
            tokio::time::sleep(ttft + itl * (n as u32).saturating_sub(1)).await;
            drop(guard);
            Ok::<_, Infallible>(Frame::data(Bytes::from(body.to_string())))
        };
        let mut r = Response::new(StreamBody::new(futures_util::stream::once(fut)).boxed());
        if let Ok(v) = "application/json".parse() {
            r.headers_mut().insert(http::header::CONTENT_TYPE, v);
        }
        return r;
    }
    let chunk = move |k: u64| -> String {
        let last = k + 1 == n;
        let finish = if last { json!("length") } else { Value::Null };
        let v = if chat {
            let mut delta = json!({"content": " tok"});
            if k == 0 {
                delta["role"] = json!("assistant");
            }
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        } else {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": " tok", "logprobs": null, "finish_reason": finish}]})
        };
        format!("data: {v}\n\n")
    };
    let tail = {
        let mut t = String::new();
        if include_usage {
            t.push_str(&format!(
                "data: {}\n\n",
                json!({"object": if chat {"chat.completion.chunk"} else {"text_completion"}, "choices": [], "usage": usage})
            ));
        }
        t.push_str("data: [DONE]\n\n");
        t
    };
    // One frame per token, each after its delay; the usage and `[DONE]`
    // with the last. With no inter-token delay, all tokens in one frame.
    let steps: u64 = if itl.is_zero() { 1 } else { n };
    let stream = futures_util::stream::unfold((0u64, Some(guard)), move |(k, guard)| {
        let chunk = chunk.clone();
        let tail = tail.clone();
        async move {
            if k >= steps {
                return None;
            }
            tokio::time::sleep(if k == 0 { ttft } else { itl }).await;
            let mut out = String::new();
            if steps == 1 {
                for j in 0..n {
                    out.push_str(&chunk(j));
                }
            } else {
                out.push_str(&chunk(k));
            }
            let mut guard = guard;
            if k + 1 == steps {
                out.push_str(&tail);
                guard = None;
            }
            Some((Ok::<_, Infallible>(Frame::data(Bytes::from(out))), (k + 1, guard)))
        }
    });
    let mut r = Response::new(StreamBody::new(stream).boxed());
    if let Ok(v) = "text/event-stream".parse() {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}
