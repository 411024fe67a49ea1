//! The load generator's HTTP/1.1 client: one thread, one `mio` poll loop,
//! any number of requests in flight (no thread per request).
//!
//! - Requests are `POST`s of JSON over plain TCP (`http://` only), each with an
//!   absolute due time from the run's start; the loop sleeps until the next one
//!   is due (a `timerfd` on Linux for sub-millisecond wake-ups, the poll
//!   timeout elsewhere), so a late wake-up is never carried into the next.
//!   `max_concurrency` holds due requests back while that many are in flight.
//! - Connections are kept alive and reused from an idle pool; a server's
//!   `Connection: close`, or a close of an idle connection, is followed.
//!   A request that fails on a reused connection before any byte of its answer
//!   came is sent again, once, on a fresh one.
//! - Bodies framed by `Content-Length`, `Transfer-Encoding: chunked` or the
//!   connection's close; a 2xx body is handed over line by line with the time
//!   its bytes were read (SSE `data:` lines, or a JSON body); any other status
//!   ends the request with the status and the start of the body.
//! - Refused connections, resets and early closes end the request with an
//!   error, as does the per-request timeout (from the send); the stop flag ends
//!   every request in flight. Nothing waits forever.
//!
//! [`Handler`] receives the events and may answer the end of a request with
//! further requests (the next turn of a conversation).

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where requests go: `http://host:port/path`.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    /// The `Host` header.
    pub host: String,
    pub path: String,
}

impl Target {
    /// The target of an `http://` URL (resolved once, here).
    pub(crate) fn parse(url: &str) -> Result<Target, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!("the load generator speaks plain `http://`, not `{url}`; hint: point it at the server's port inside the cell")
        })?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let with_port = if hostport
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            hostport.to_string()
        } else {
            format!("{hostport}:80")
        };
        let addr = with_port
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve `{hostport}`: {e}"))?
            .next()
            .ok_or_else(|| format!("cannot resolve `{hostport}`: no address"))?;
        Ok(Target {
            addr,
            host: hostport.to_string(),
            path: path.to_string(),
        })
    }
}

/// One request: a JSON body, due at `due` from the run's start.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: usize,
    pub due: Duration,
    pub body: Vec<u8>,
}

/// What the loop tells about each request.
pub trait Handler {
    /// The request was started (a connection opened or reused) at `at`.
    fn sent(&mut self, id: usize, at: Instant);
    /// A line of a 2xx answer's body (no line end), its bytes read at `at`.
    fn line(&mut self, id: usize, at: Instant, line: &[u8]);
    /// The request ended at `at`: `Ok` once a whole 2xx answer came, else
    /// why not. Returns requests to send next.
    fn end(&mut self, id: usize, at: Instant, result: Result<(), String>) -> Vec<Job>;
}

#[derive(Debug, Clone)]
pub struct Options {
    /// Requests in flight at most (`None`: no limit).
    pub max_concurrency: Option<usize>,
    /// A request still unanswered this long after its send fails.
    pub timeout: Duration,
}

/// A due request, ordered so that the heap's top is the earliest.
struct Due(Job, u64);

impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == CmpOrdering::Equal
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    fn cmp(&self, o: &Self) -> CmpOrdering {
        (o.0.due, o.1).cmp(&(self.0.due, self.1))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Chunk {
    Size,
    Data(u64),
    DataEnd,
    Trailer,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Framing {
    Length(u64),
    Chunked(Chunk),
    Close,
}

/// A request on a connection.
struct Active {
    job: Job,
    deadline: Instant,
    retried: bool,
    /// Whether any byte of the answer came.
    answered: bool,
    head_done: bool,
    status: u16,
    keep_alive: bool,
    framing: Framing,
    /// The unfinished line (2xx) or the start of the body (others).
    line: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Connecting,
    Busy,
    Idle,
}

struct Conn {
    sock: TcpStream,
    state: State,
    reused: bool,
    out: Vec<u8>,
    written: usize,
    /// Bytes read and not yet taken (head, chunk framing).
    buf: Vec<u8>,
    req: Option<Active>,
}

const TIMER: Token = Token(usize::MAX);
/// The start of a non-2xx body kept for the error.
const ERR_BODY: usize = 300;
const MAX_HEAD: usize = 64 * 1024;
const MAX_IDLE: usize = 4096;

/// What one read or step of a connection came to.
enum Outcome {
    /// Still going.
    Open,
    /// The answer is whole; the connection may be kept.
    Done { keep: bool },
    /// The request failed (`retry`: on a reused connection before any answer).
    Failed { why: String, retry: bool },
}

struct Loop<'a> {
    target: &'a Target,
    opts: &'a Options,
    poll: Poll,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    idle: Vec<usize>,
    pending: BinaryHeap<Due>,
    seq: u64,
    in_flight: usize,
    head: Vec<u8>,
    timer: Option<Timer>,
}

/// Sends `jobs` (and whatever the handler adds) to `target`; returns once
/// every request ended, or at once on `stop` (requests in flight then end
/// with an error). `Err` only when the loop itself cannot run.
pub(crate) fn run(
    target: &Target,
    jobs: Vec<Job>,
    opts: &Options,
    stop: &AtomicBool,
    start: Instant,
    h: &mut dyn Handler,
) -> Result<(), String> {
    raise_fd_limit();
    let poll = Poll::new().map_err(|e| format!("cannot create a poll: {e}"))?;
    let timer = Timer::new(&poll);
    let mut lp = Loop {
        target,
        opts,
        poll,
        conns: Vec::new(),
        free: Vec::new(),
        idle: Vec::new(),
        pending: BinaryHeap::new(),
        seq: 0,
        in_flight: 0,
        head: format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: orch-agent\r\nAccept: */*\r\nContent-Type: application/json\r\n",
            target.path, target.host
        )
        .into_bytes(),
        timer,
    };
    for j in jobs {
        lp.push(j);
    }
    let mut events = Events::with_capacity(1024);
    let mut scratch = vec![0u8; 64 * 1024];
    let scan_every = Duration::from_millis(20);
    let mut next_scan = Instant::now() + scan_every;
    loop {
        if stop.load(Ordering::Relaxed) {
            lp.pending.clear();
            let now = Instant::now();
            for t in 0..lp.conns.len() {
                if lp.conns[t].as_ref().is_some_and(|c| c.req.is_some()) {
                    lp.fail(t, now, "stopped".into(), h);
                }
            }
            return Ok(());
        }
        // Start what is due.
        let now = Instant::now();
        while lp.can_start() {
            if lp.pending.peek().is_none_or(|d| start + d.0.due > now) {
                break;
            }
            let Some(Due(job, _)) = lp.pending.pop() else {
                break;
            };
            lp.start(job, h);
        }
        if lp.pending.is_empty() && lp.in_flight == 0 {
            return Ok(());
        }
        let now = Instant::now();
        if now >= next_scan {
            lp.expire(now, h);
            next_scan = now + scan_every;
        }
        // Sleep until the next due request (when it may start), the next
        // timeout scan, or an event.
        let mut wake = next_scan.min(now + Duration::from_millis(100));
        if lp.can_start() {
            if let Some(d) = lp.pending.peek() {
                wake = wake.min(start + d.0.due);
            }
        }
        let timeout = match &mut lp.timer {
            Some(t) => {
                t.set(wake.saturating_duration_since(now));
                // The timer wakes the poll; this is a backstop only.
                Some(Duration::from_millis(200))
            }
            None => Some(wake.saturating_duration_since(now)),
        };
        if let Err(e) = lp.poll.poll(&mut events, timeout) {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(format!("poll failed: {e}"));
            }
        }
        for ev in events.iter() {
            let t = ev.token();
            if t == TIMER {
                if let Some(tm) = &mut lp.timer {
                    tm.drain();
                }
                continue;
            }
            lp.ready(t.0, &mut scratch, h);
        }
    }
}

impl Loop<'_> {
    fn push(&mut self, job: Job) {
        self.seq += 1;
        self.pending.push(Due(job, self.seq));
    }

    fn can_start(&self) -> bool {
        self.opts
            .max_concurrency
            .is_none_or(|m| self.in_flight < m.max(1))
    }

    fn request_bytes(&self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.head.len() + body.len() + 32);
        out.extend_from_slice(&self.head);
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        out.extend_from_slice(body);
        out
    }

    fn start(&mut self, job: Job, h: &mut dyn Handler) {
        let now = Instant::now();
        h.sent(job.id, now);
        self.in_flight += 1;
        let active = Active {
            job,
            deadline: now + self.opts.timeout,
            retried: false,
            answered: false,
            head_done: false,
            status: 0,
            keep_alive: false,
            framing: Framing::Close,
            line: Vec::new(),
        };
        self.launch(active, false, h);
    }

    /// Puts `a` on an idle connection (unless `fresh`) or a new one.
    fn launch(&mut self, a: Active, fresh: bool, h: &mut dyn Handler) {
        let out = self.request_bytes(&a.job.body);
        if !fresh {
            while let Some(t) = self.idle.pop() {
                let Some(c) = self.conns[t].as_mut() else { continue };
                if c.state != State::Idle {
                    continue;
                }
                c.state = State::Busy;
                c.reused = true;
                c.out = out;
                c.written = 0;
                c.buf.clear();
                c.req = Some(a);
                self.step(t, h);
                return;
            }
        }
        let sock = match TcpStream::connect(self.target.addr) {
            Ok(s) => s,
            Err(e) => {
                let id = a.job.id;
                self.finish(
                    id,
                    Instant::now(),
                    Err(format!("cannot connect to {}: {e}", self.target.addr)),
                    h,
                );
                return;
            }
        };
        let _ = sock.set_nodelay(true);
        let t = match self.free.pop() {
            Some(t) => t,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        let mut conn = Conn {
            sock,
            state: State::Connecting,
            reused: false,
            out,
            written: 0,
            buf: Vec::new(),
            req: Some(a),
        };
        if let Err(e) =
            self.poll
                .registry()
                .register(&mut conn.sock, Token(t), Interest::READABLE | Interest::WRITABLE)
        {
            self.free.push(t);
            let id = conn.req.as_ref().map(|a| a.job.id).unwrap_or(0);
            self.finish(
                id,
                Instant::now(),
                Err(format!("cannot watch a connection: {e}")),
                h,
            );
            return;
        }
        self.conns[t] = Some(conn);
    }

    /// An event on connection `t`.
    fn ready(&mut self, t: usize, scratch: &mut [u8], h: &mut dyn Handler) {
        let Some(c) = self.conns.get_mut(t).and_then(Option::as_mut) else {
            return;
        };
        match c.state {
            State::Idle => {
                // An idle connection only speaks to close (or misbehave): drop it.
                match c.sock.read(scratch) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    _ => self.close(t),
                }
            }
            State::Connecting => {
                match c.sock.take_error() {
                    Ok(Some(e)) | Err(e) => {
                        let why = format!("cannot connect to {}: {e}", self.target.addr);
                        self.fail(t, Instant::now(), why, h);
                        return;
                    }
                    Ok(None) => {}
                }
                match c.sock.peer_addr() {
                    Ok(_) => {
                        c.state = State::Busy;
                        self.step(t, h);
                        self.read(t, scratch, h);
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => {}
                    Err(e) => {
                        let why = format!("cannot connect to {}: {e}", self.target.addr);
                        self.fail(t, Instant::now(), why, h);
                    }
                }
            }
            State::Busy => {
                self.step(t, h);
                self.read(t, scratch, h);
            }
        }
    }

    /// Writes what is left of the request.
    fn step(&mut self, t: usize, h: &mut dyn Handler) {
        let Some(c) = self.conns.get_mut(t).and_then(Option::as_mut) else {
            return;
        };
        if c.state != State::Busy || c.req.is_none() {
            return;
        }
        while c.written < c.out.len() {
            match c.sock.write(&c.out[c.written..]) {
                Ok(0) => {
                    self.broken(t, "the connection closed while sending".into(), h);
                    return;
                }
                Ok(n) => c.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.broken(t, format!("sending failed: {e}"), h);
                    return;
                }
            }
        }
    }

    /// Reads until the socket has nothing more, handing lines over.
    fn read(&mut self, t: usize, scratch: &mut [u8], h: &mut dyn Handler) {
        loop {
            let Some(c) = self.conns.get_mut(t).and_then(Option::as_mut) else {
                return;
            };
            if c.state != State::Busy || c.req.is_none() {
                return;
            }
            match c.sock.read(scratch) {
                Ok(0) => {
                    let now = Instant::now();
                    let Some(a) = c.req.as_mut() else { return };
                    if a.head_done && a.framing == Framing::Close {
                        if a.status / 100 == 2 && !a.line.is_empty() {
                            let line = std::mem::take(&mut a.line);
                            h.line(a.job.id, now, trim_cr(&line));
                        }
                        let res = status_result(a);
                        let id = a.job.id;
                        self.release(t, false);
                        self.finish(id, now, res, h);
                    } else if a.answered {
                        self.fail(t, now, "the server closed the connection mid-answer".into(), h);
                    } else {
                        self.broken(t, "the server closed the connection before answering".into(), h);
                    }
                    return;
                }
                Ok(n) => {
                    let now = Instant::now();
                    let c_buf = &mut c.buf;
                    c_buf.extend_from_slice(&scratch[..n]);
                    let Some(a) = c.req.as_mut() else { return };
                    a.answered = true;
                    match feed(a, c_buf, now, h) {
                        Outcome::Open => {}
                        Outcome::Done { keep } => {
                            let res = status_result(a);
                            let id = a.job.id;
                            let keep = keep && c.buf.is_empty() && c.written == c.out.len();
                            self.release(t, keep);
                            self.finish(id, now, res, h);
                            return;
                        }
                        Outcome::Failed { why, retry } => {
                            if retry {
                                self.broken(t, why, h);
                            } else {
                                self.fail(t, now, why, h);
                            }
                            return;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let now = Instant::now();
                    let answered = c.req.as_ref().is_some_and(|a| a.answered);
                    let why = format!("the connection broke: {e}");
                    if answered {
                        self.fail(t, now, why, h);
                    } else {
                        self.broken(t, why, h);
                    }
                    return;
                }
            }
        }
    }

    /// The connection failed before any answer: a reused one is replaced
    /// once (the server may have closed it while idle), else the request fails.
    fn broken(&mut self, t: usize, why: String, h: &mut dyn Handler) {
        let Some(c) = self.conns.get_mut(t).and_then(Option::as_mut) else {
            return;
        };
        let reused = c.reused;
        match c.req.take() {
            Some(mut a) if reused && !a.retried && !a.answered => {
                self.close(t);
                a.retried = true;
                a.line.clear();
                self.launch(a, true, h);
            }
            Some(a) => {
                c.req = Some(a);
                self.fail(t, Instant::now(), why, h);
            }
            None => self.close(t),
        }
    }

    /// Ends the request on `t` with an error and closes the connection.
    fn fail(&mut self, t: usize, at: Instant, why: String, h: &mut dyn Handler) {
        let id = self
            .conns
            .get_mut(t)
            .and_then(Option::as_mut)
            .and_then(|c| c.req.take())
            .map(|a| a.job.id);
        self.close(t);
        if let Some(id) = id {
            self.finish(id, at, Err(why), h);
        }
    }

    fn finish(&mut self, id: usize, at: Instant, res: Result<(), String>, h: &mut dyn Handler) {
        self.in_flight = self.in_flight.saturating_sub(1);
        for j in h.end(id, at, res) {
            self.push(j);
        }
    }

    /// The request on `t` is done: keep the connection idle, or close it.
    fn release(&mut self, t: usize, keep: bool) {
        let Some(c) = self.conns.get_mut(t).and_then(Option::as_mut) else {
            return;
        };
        c.req = None;
        if keep && self.idle.len() < MAX_IDLE {
            c.state = State::Idle;
            c.out.clear();
            c.buf.clear();
            self.idle.push(t);
        } else {
            self.close(t);
        }
    }

    fn close(&mut self, t: usize) {
        if let Some(mut c) = self.conns.get_mut(t).and_then(Option::take) {
            let _ = self.poll.registry().deregister(&mut c.sock);
            self.free.push(t);
        }
    }

    /// Fails every request past its deadline.
    fn expire(&mut self, now: Instant, h: &mut dyn Handler) {
        for t in 0..self.conns.len() {
            let late = self.conns[t]
                .as_ref()
                .and_then(|c| c.req.as_ref())
                .is_some_and(|a| a.deadline <= now);
            if late {
                let secs = self.opts.timeout.as_secs_f64();
                self.fail(t, now, format!("no whole answer within {secs:.0}s"), h);
            }
        }
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn status_result(a: &Active) -> Result<(), String> {
    if a.status / 100 == 2 {
        return Ok(());
    }
    let body = String::from_utf8_lossy(&a.line);
    let body = body.trim();
    Err(if body.is_empty() {
        format!("http status {}", a.status)
    } else {
        format!("http status {}: {body}", a.status)
    })
}

/// Takes what `buf` holds for the request `a`: the head, then the body.
fn feed(a: &mut Active, buf: &mut Vec<u8>, at: Instant, h: &mut dyn Handler) -> Outcome {
    let mut pos = 0;
    let out = loop {
        if !a.head_done {
            let mut headers = [httparse::EMPTY_HEADER; 48];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&buf[pos..]) {
                Ok(httparse::Status::Complete(n)) => {
                    let status = resp.code.unwrap_or(0);
                    let version = resp.version.unwrap_or(1);
                    pos += n;
                    if (100..200).contains(&status) && status != 101 {
                        continue;
                    }
                    let mut length = None;
                    let mut chunked = false;
                    let mut conn_close = version == 0;
                    for hd in resp.headers.iter() {
                        let v = String::from_utf8_lossy(hd.value);
                        if hd.name.eq_ignore_ascii_case("content-length") {
                            length = v.trim().parse::<u64>().ok();
                        } else if hd.name.eq_ignore_ascii_case("transfer-encoding") {
                            chunked = v.to_ascii_lowercase().contains("chunked");
                        } else if hd.name.eq_ignore_ascii_case("connection") {
                            let v = v.to_ascii_lowercase();
                            if v.contains("close") {
                                conn_close = true;
                            } else if v.contains("keep-alive") {
                                conn_close = false;
                            }
                        }
                    }
                    a.status = status;
                    a.head_done = true;
                    a.framing = if chunked {
                        Framing::Chunked(Chunk::Size)
                    } else if status == 204 || status == 304 {
                        Framing::Length(0)
                    } else if let Some(n) = length {
                        Framing::Length(n)
                    } else {
                        Framing::Close
                    };
                    a.keep_alive = !conn_close && a.framing != Framing::Close;
                    if a.framing == Framing::Length(0) {
                        break Outcome::Done { keep: a.keep_alive };
                    }
                }
                Ok(httparse::Status::Partial) => {
                    if buf.len() - pos > MAX_HEAD {
                        break Outcome::Failed {
                            why: "the answer's head is too long".into(),
                            retry: false,
                        };
                    }
                    break Outcome::Open;
                }
                Err(e) => {
                    break Outcome::Failed {
                        why: format!("not an HTTP answer: {e}"),
                        retry: false,
                    }
                }
            }
            continue;
        }
        let rest = &buf[pos..];
        match a.framing {
            Framing::Close => {
                body(a, rest, at, h);
                pos = buf.len();
                break Outcome::Open;
            }
            Framing::Length(n) => {
                let k = (n as usize).min(rest.len());
                body(a, &rest[..k], at, h);
                pos += k;
                let left = n - k as u64;
                a.framing = Framing::Length(left);
                if left == 0 {
                    if a.status / 100 == 2 && !a.line.is_empty() {
                        let line = std::mem::take(&mut a.line);
                        h.line(a.job.id, at, trim_cr(&line));
                    }
                    break Outcome::Done { keep: a.keep_alive };
                }
                break Outcome::Open;
            }
            Framing::Chunked(Chunk::Size) | Framing::Chunked(Chunk::Trailer) => {
                let Some(nl) = rest.iter().position(|b| *b == b'\n') else {
                    if rest.len() > 4096 {
                        break Outcome::Failed {
                            why: "a chunk size line is too long".into(),
                            retry: false,
                        };
                    }
                    break Outcome::Open;
                };
                let line = String::from_utf8_lossy(trim_cr(&rest[..nl])).to_string();
                pos += nl + 1;
                if a.framing == Framing::Chunked(Chunk::Trailer) {
                    if line.is_empty() {
                        if a.status / 100 == 2 && !a.line.is_empty() {
                            let l = std::mem::take(&mut a.line);
                            h.line(a.job.id, at, trim_cr(&l));
                        }
                        break Outcome::Done { keep: a.keep_alive };
                    }
                    continue;
                }
                let size = line.split(';').next().unwrap_or("").trim();
                match u64::from_str_radix(size, 16) {
                    Ok(0) => a.framing = Framing::Chunked(Chunk::Trailer),
                    Ok(n) => a.framing = Framing::Chunked(Chunk::Data(n)),
                    Err(_) => {
                        break Outcome::Failed {
                            why: format!("a bad chunk size `{size}`"),
                            retry: false,
                        }
                    }
                }
            }
            Framing::Chunked(Chunk::Data(n)) => {
                if rest.is_empty() {
                    break Outcome::Open;
                }
                let k = (n as usize).min(rest.len());
                body(a, &rest[..k], at, h);
                pos += k;
                let left = n - k as u64;
                a.framing = Framing::Chunked(if left == 0 {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(left)
                });
            }
            Framing::Chunked(Chunk::DataEnd) => {
                if rest.starts_with(b"\r\n") {
                    pos += 2;
                } else if rest.starts_with(b"\n") {
                    pos += 1;
                } else if rest.len() < 2 {
                    break Outcome::Open;
                } else {
                    break Outcome::Failed {
                        why: "a chunk does not end with a line end".into(),
                        retry: false,
                    };
                }
                a.framing = Framing::Chunked(Chunk::Size);
            }
        }
    };
    buf.drain(..pos.min(buf.len()));
    out
}

/// Body bytes: lines of a 2xx answer to the handler, the start of any other kept.
fn body(a: &mut Active, mut data: &[u8], at: Instant, h: &mut dyn Handler) {
    if a.status / 100 != 2 {
        let room = ERR_BODY.saturating_sub(a.line.len());
        a.line.extend_from_slice(&data[..room.min(data.len())]);
        return;
    }
    while let Some(nl) = data.iter().position(|b| *b == b'\n') {
        if a.line.is_empty() {
            h.line(a.job.id, at, trim_cr(&data[..nl]));
        } else {
            a.line.extend_from_slice(&data[..nl]);
            let line = std::mem::take(&mut a.line);
            h.line(a.job.id, at, trim_cr(&line));
        }
        data = &data[nl + 1..];
    }
    a.line.extend_from_slice(data);
}

/// A file descriptor per connection: as many as the hard limit allows.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max.min(1 << 20);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// A `timerfd` in the poll: wake-ups to the microsecond (epoll's own timeout
/// counts whole milliseconds).
#[cfg(target_os = "linux")]
struct Timer {
    fd: std::os::fd::OwnedFd,
}

#[cfg(target_os = "linux")]
impl Timer {
    fn new(poll: &Poll) -> Option<Timer> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: timerfd_create returns a new descriptor we own, or -1.
        let raw =
            unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if raw < 0 {
            return None;
        }
        // SAFETY: `raw` is a fresh, valid descriptor owned by nothing else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        poll.registry()
            .register(
                &mut mio::unix::SourceFd(&fd.as_raw_fd()),
                TIMER,
                Interest::READABLE,
            )
            .ok()?;
        Some(Timer { fd })
    }

    /// Fires once, `after` from now (at least a microsecond: zero disarms).
    fn set(&mut self, after: Duration) {
        use std::os::fd::AsRawFd;
        let after = after.max(Duration::from_micros(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: a valid timerfd and a fully initialised itimerspec.
        unsafe {
            libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut());
        }
    }

    fn drain(&mut self) {
        use std::os::fd::AsRawFd;
        let mut n = [0u8; 8];
        // SAFETY: reads at most 8 bytes into `n` from our non-blocking timerfd.
        unsafe {
            libc::read(self.fd.as_raw_fd(), n.as_mut_ptr().cast(), n.len());
        }
    }
}

#[cfg(not(target_os = "linux"))]
struct Timer;

#[cfg(not(target_os = "linux"))]
impl Timer {
    fn new(_: &Poll) -> Option<Timer> {
        None
    }
    fn set(&mut self, _: Duration) {}
    fn drain(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::HashMap;
    use std::io::BufRead;
    use std::net::{TcpListener, TcpStream as StdStream};
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// A test server: each connection runs `f` on its own thread.
    fn serve<F>(f: F) -> (String, Arc<AtomicUsize>)
    where
        F: Fn(StdStream) + Send + Sync + 'static,
    {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/completions", l.local_addr().unwrap());
        let conns = Arc::new(AtomicUsize::new(0));
        let (f, n) = (Arc::new(f), conns.clone());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                n.fetch_add(1, Ordering::SeqCst);
                let f = f.clone();
                std::thread::spawn(move || f(s));
            }
        });
        (url, conns)
    }

    /// Reads one request's body; `None` once the client closed.
    fn read_request(r: &mut std::io::BufReader<StdStream>) -> Option<Vec<u8>> {
        let mut len = 0;
        let mut first = true;
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if first {
                assert!(line.starts_with("POST /v1/completions HTTP/1.1"), "{line}");
                first = false;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).ok()?;
        Some(body)
    }

    #[derive(Default)]
    struct Rec {
        sent: HashMap<usize, Instant>,
        lines: HashMap<usize, Vec<String>>,
        ends: HashMap<usize, Result<(), String>>,
        /// Jobs to add when a request ends: id → job.
        then: HashMap<usize, Job>,
    }

    impl Handler for Rec {
        fn sent(&mut self, id: usize, at: Instant) {
            assert!(self.sent.insert(id, at).is_none(), "sent twice: {id}");
        }
        fn line(&mut self, id: usize, _: Instant, line: &[u8]) {
            self.lines
                .entry(id)
                .or_default()
                .push(String::from_utf8_lossy(line).into());
        }
        fn end(&mut self, id: usize, _: Instant, r: Result<(), String>) -> Vec<Job> {
            assert!(self.ends.insert(id, r).is_none(), "ended twice: {id}");
            self.then.remove(&id).into_iter().collect()
        }
    }

    fn job(id: usize, due_ms: u64) -> Job {
        Job {
            id,
            due: Duration::from_millis(due_ms),
            body: format!("{{\"id\": {id}}}").into_bytes(),
        }
    }

    fn go(url: &str, jobs: Vec<Job>, max: Option<usize>, timeout_ms: u64, rec: &mut Rec) {
        let t = Target::parse(url).unwrap();
        let opts = Options {
            max_concurrency: max,
            timeout: Duration::from_millis(timeout_ms),
        };
        let stop = AtomicBool::new(false);
        let started = Instant::now();
        run(&t, jobs, &opts, &stop, Instant::now(), rec).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "took {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn chunked_sse_lines_across_chunk_boundaries() {
        let (url, _) = serve(|s| {
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            while read_request(&mut r).is_some() {
                let body = "data: {\"a\": 1}\n\ndata: [DONE]\n\n";
                let mut out = String::from("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
                // Chunks of 7 bytes: lines split over chunks, a chunk extension.
                for (k, part) in body.as_bytes().chunks(7).enumerate() {
                    let ext = if k == 1 { ";x=1" } else { "" };
                    out.push_str(&format!(
                        "{:x}{ext}\r\n{}\r\n",
                        part.len(),
                        String::from_utf8_lossy(part)
                    ));
                }
                out.push_str("0\r\nTrailer: x\r\n\r\n");
                w.write_all(out.as_bytes()).unwrap();
            }
        });
        let mut rec = Rec::default();
        go(&url, vec![job(0, 0), job(1, 0)], None, 5000, &mut rec);
        for id in 0..2 {
            assert_eq!(rec.ends[&id], Ok(()));
            assert_eq!(
                rec.lines[&id],
                ["data: {\"a\": 1}", "", "data: [DONE]", ""],
                "{id}"
            );
        }
    }

    #[test]
    fn content_length_answers_reuse_one_kept_alive_connection() {
        let (url, conns) = serve(|s| {
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            while let Some(body) = read_request(&mut r) {
                let answer = format!("{{\"echo\": {}}}", String::from_utf8_lossy(&body));
                write!(
                    w,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
                    answer.len()
                )
                .unwrap();
            }
        });
        let mut rec = Rec::default();
        // One at a time, spaced out: every one after the first reuses the connection.
        let jobs = (0..5).map(|i| job(i, i as u64 * 20)).collect();
        go(&url, jobs, Some(1), 5000, &mut rec);
        for id in 0..5 {
            assert_eq!(rec.ends[&id], Ok(()));
            assert_eq!(rec.lines[&id], [format!("{{\"echo\": {{\"id\": {id}}}}}")]);
        }
        assert_eq!(conns.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_connection_the_server_closes_while_idle_is_replaced() {
        // Answers one request per connection, keep-alive claimed, then closes.
        let (url, conns) = serve(|s| {
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            if read_request(&mut r).is_some() {
                w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                    .unwrap();
            }
        });
        let mut rec = Rec::default();
        go(
            &url,
            vec![job(0, 0), job(1, 100), job(2, 101)],
            Some(1),
            5000,
            &mut rec,
        );
        for id in 0..3 {
            assert_eq!(rec.ends[&id], Ok(()), "{id}");
        }
        assert_eq!(conns.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn resets_early_closes_refusals_and_errors_fail_the_request_without_a_hang() {
        let (url, _) = serve(|s| {
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            let Some(body) = read_request(&mut r) else { return };
            let id: Value = serde_json::from_slice(&body).unwrap();
            match id["id"].as_u64().unwrap() {
                // Part of the body, then a reset.
                0 => {
                    w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ndata: x\n")
                        .unwrap();
                    std::thread::sleep(Duration::from_millis(50));
                    let l = libc::linger {
                        l_onoff: 1,
                        l_linger: 0,
                    };
                    // SAFETY: a valid socket and a linger struct of the right size.
                    unsafe {
                        use std::os::fd::AsRawFd;
                        libc::setsockopt(
                            w.as_raw_fd(),
                            libc::SOL_SOCKET,
                            libc::SO_LINGER,
                            (&l as *const libc::linger).cast(),
                            std::mem::size_of::<libc::linger>() as libc::socklen_t,
                        );
                    }
                }
                // Part of the body, then a close.
                1 => {
                    w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ndata: x\n")
                        .unwrap();
                }
                2 => {
                    let b = "{\"error\": \"the model is not loaded\"}";
                    write!(
                        w,
                        "HTTP/1.1 500 Internal Server Error\r\nContent-Length: {}\r\n\r\n{b}",
                        b.len()
                    )
                    .unwrap();
                }
                // No answer at all (the timeout ends it).
                _ => std::thread::sleep(Duration::from_secs(30)),
            }
        });
        let mut rec = Rec::default();
        go(&url, (0..4).map(|i| job(i, 0)).collect(), None, 1000, &mut rec);
        let err = |id: usize| rec.ends[&id].clone().unwrap_err();
        assert!(
            err(0).contains("broke") || err(0).contains("mid-answer"),
            "{}",
            err(0)
        );
        assert!(err(1).contains("mid-answer"), "{}", err(1));
        assert!(
            err(2).contains("500") && err(2).contains("not loaded"),
            "{}",
            err(2)
        );
        assert!(err(3).contains("within 1s"), "{}", err(3));
        // The lines before the break were handed over.
        assert_eq!(rec.lines[&1], ["data: x"]);

        // Nobody listens.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/completions", l.local_addr().unwrap());
        drop(l);
        let mut rec = Rec::default();
        go(&url, vec![job(0, 0)], None, 1000, &mut rec);
        assert!(
            rec.ends[&0].clone().unwrap_err().contains("cannot connect"),
            "{:?}",
            rec.ends
        );
    }

    /// Throughput and schedule lag against a fast server (run by hand:
    /// `cargo test -p orch-loadgen --lib --release evclient -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn thousands_of_requests_a_second_keep_the_schedule() {
        let (url, conns) = serve(|s| {
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            while read_request(&mut r).is_some() {
                let b = "data: {\"choices\": [{\"text\": \" tok\"}]}\n\ndata: [DONE]\n\n";
                write!(w, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{b}", b.len()).unwrap();
            }
        });
        let n = 20_000;
        let rate = 5000.0;
        let jobs = (0..n)
            .map(|i| Job {
                id: i,
                due: Duration::from_secs_f64(i as f64 / rate),
                body: b"{}".to_vec(),
            })
            .collect();
        let mut rec = Rec::default();
        let start = Instant::now();
        let t = Target::parse(&url).unwrap();
        let opts = Options {
            max_concurrency: None,
            timeout: Duration::from_secs(30),
        };
        run(&t, jobs, &opts, &AtomicBool::new(false), start, &mut rec).unwrap();
        let took = start.elapsed().as_secs_f64();
        let mut lags: Vec<f64> = (0..n)
            .map(|i| ((rec.sent[&i] - start).as_secs_f64() - i as f64 / rate) * 1000.0)
            .collect();
        lags.sort_by(|a, b| a.total_cmp(b));
        let ok = rec.ends.values().filter(|r| r.is_ok()).count();
        println!(
            "{n} requests at {rate}/s in {took:.2}s: {ok} ok, {} connections, lag median {:.3} ms p99 {:.3} ms max {:.3} ms",
            conns.load(Ordering::SeqCst),
            lags[n / 2],
            lags[n * 99 / 100],
            lags[n - 1]
        );
        assert_eq!(ok, n);
        assert!(lags[n / 2] < 1.0);
    }

    /// Thousands of streams at once on the one thread (run by hand, as above).
    #[test]
    #[ignore]
    fn thousands_of_concurrent_streams() {
        let (url, conns) = serve(|s| {
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            while read_request(&mut r).is_some() {
                w.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    .unwrap();
                for _ in 0..10 {
                    std::thread::sleep(Duration::from_millis(200));
                    w.write_all(b"8\r\ndata: x\n\r\n").unwrap();
                }
                w.write_all(b"0\r\n\r\n").unwrap();
            }
        });
        let n = 3000;
        let jobs = (0..n).map(|i| job(i, 0)).collect();
        let mut rec = Rec::default();
        let start = Instant::now();
        go(&url, jobs, None, 30_000, &mut rec);
        let ok = rec.ends.values().filter(|r| r.is_ok()).count();
        println!(
            "{n} streams of 2 s at once: {ok} ok in {:.2}s over {} connections",
            start.elapsed().as_secs_f64(),
            conns.load(Ordering::SeqCst)
        );
        assert_eq!(ok, n);
        assert!(rec.lines.values().all(|l| l.len() == 10));
    }

    #[test]
    fn keeps_the_schedule_and_sends_follow_ups() {
        let (url, _) = serve(|s| {
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            while read_request(&mut r).is_some() {
                std::thread::sleep(Duration::from_millis(30));
                w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                    .unwrap();
            }
        });
        let mut rec = Rec::default();
        // Request 3 follows request 0's end, due at 100 ms.
        rec.then.insert(0, job(3, 100));
        let start = Instant::now();
        let t = Target::parse(&url).unwrap();
        let opts = Options {
            max_concurrency: None,
            timeout: Duration::from_secs(5),
        };
        let jobs = vec![job(0, 0), job(1, 20), job(2, 45)];
        run(&t, jobs, &opts, &AtomicBool::new(false), start, &mut rec).unwrap();
        for (id, due) in [(0, 0), (1, 20), (2, 45), (3, 100)] {
            assert_eq!(rec.ends[&id], Ok(()), "{id}");
            let at = rec.sent[&id] - start;
            let due = Duration::from_millis(due);
            assert!(at >= due, "{id} sent early: {at:?}");
            assert!(at - due < Duration::from_millis(25), "{id} sent late: {at:?}");
        }
    }
}
