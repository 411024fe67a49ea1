//! The HTTP API: routing, CRUD, list and watch, pod logs, and
//! `SelfSubjectAccessReview` (`kubectl auth can-i`) answered from the Role.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::jobs::{
    delete_job, delete_pod, is_dns_subdomain, prepare_job, run_job, start_pod, validate_pod_spec, JobRt,
};
use super::store::{info, key_of, list_locked, lock, Inner, ResourceInfo};
use super::util::{
    decode, details, field_str, labels_match, merge_patch, now, parse_field_selector, parse_label_selector,
    rand_suffix, uuid, ApiError, Req,
};

pub(crate) type Body = UnsyncBoxBody<Bytes, io::Error>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed_unsync()
}

fn json_resp(code: u16, v: &Value) -> Response<Body> {
    let mut r = Response::new(full(serde_json::to_vec(v).unwrap_or_default()));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn err_resp(e: &ApiError) -> Response<Body> {
    json_resp(e.code, &e.status())
}

fn text_resp(b: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(full(b));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    r
}

type Tx = mpsc::Sender<Result<Frame<Bytes>, io::Error>>;

fn stream_resp(content_type: &'static str) -> (Tx, Response<Body>) {
    let (tx, rx) = mpsc::channel(64);
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed_unsync();
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    (tx, r)
}

pub(crate) async fn handle(inner: Arc<Inner>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let line = if query.is_empty() {
        format!("{} {path}", req.method())
    } else {
        format!("{} {path}?{query}", req.method())
    };
    lock(&inner.requests).push(line.clone());
    {
        let segs: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(decode).collect();
        let q: BTreeMap<String, String> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect();
        match attributes(req.method(), &segs, &q) {
            Some(a) => inner.limits.count(a.verb, &a.resource),
            None => inner.limits.count("get", "discovery"),
        }
    }
    if !inner.latency.is_zero() {
        tokio::time::sleep(inner.latency).await;
    }
    if let Err(secs) = inner.limits.admit(&line) {
        let mut r = json_resp(429, &super::limits::too_many(secs));
        let h = r.headers_mut();
        h.insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        h.insert(
            "X-Kubernetes-PF-FlowSchema-UID",
            header::HeaderValue::from_static("fake-flowschema-service-accounts"),
        );
        h.insert(
            "X-Kubernetes-PF-PriorityLevel-UID",
            header::HeaderValue::from_static("fake-prioritylevel-workload-low"),
        );
        return Ok(r);
    }
    // A scripted drop: this request is never answered, its connection goes with the rest.
    let trigger = {
        let mut d = lock(&inner.drop_on);
        match &*d {
            Some((prefix, _)) if line.starts_with(prefix.as_str()) => d.take(),
            _ => None,
        }
    };
    if let Some((_, d)) = trigger {
        inner.drop_connections(d);
        std::future::pending::<()>().await;
    }
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if auth != format!("Bearer {}", inner.token) {
        return Ok(err_resp(&ApiError::new(401, "Unauthorized", "Unauthorized")));
    }
    // Every authenticated user may ask what it may do (`system:basic-user`).
    if *req.method() == Method::POST && path == SSAR_PATH {
        return Ok(self_subject_access_review(&inner, req).await);
    }
    if let Some(rbac) = &inner.rbac {
        let q: BTreeMap<String, String> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect();
        let segs: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(decode).collect();
        if let Some(a) = attributes(req.method(), &segs, &q) {
            if let Err(e) = rbac.authorize(&a) {
                return Ok(err_resp(&e));
            }
        }
    }
    Ok(match route(&inner, req, &path, &query).await {
        Ok(r) => r,
        Err(e) => err_resp(&e),
    })
}

const SSAR_PATH: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

/// `POST selfsubjectaccessreviews` (what `kubectl auth can-i` asks): the
/// review's resource attributes against the shipped Role, answered in
/// `status.allowed` (every verb is allowed on a cluster without a Role).
async fn self_subject_access_review(inner: &Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    let bytes = match Limited::new(req.into_body(), 1 << 20).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return err_resp(&ApiError::bad_request(format!("reading the body: {e}"))),
    };
    // kubectl sends the review as protobuf, orch (kube-rs) as JSON.
    let review: Value = match ssar_from_protobuf(&bytes) {
        Some(v) => v,
        None => match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => return err_resp(&ApiError::bad_request(format!("the body is not JSON: {e}"))),
        },
    };
    let ra = &review["spec"]["resourceAttributes"];
    if !ra.is_object() {
        return err_resp(&ApiError::new(
            422,
            "Invalid",
            "SelfSubjectAccessReview.authorization.k8s.io is invalid: spec.resourceAttributes: Required value (the fake answers resource attributes only)",
        ));
    }
    let text = |k: &str| ra[k].as_str().unwrap_or_default().to_string();
    let (verb, group, resource, sub, name, ns) = (
        text("verb"),
        text("group"),
        text("resource"),
        text("subresource"),
        text("name"),
        text("namespace"),
    );
    let allowed = match &inner.rbac {
        None => Ok(()),
        Some(rbac) => rbac.authorize(&super::rbac::Attributes {
            verb: &verb,
            group: &group,
            resource: if sub.is_empty() {
                resource.clone()
            } else {
                format!("{resource}/{sub}")
            },
            name: &name,
            namespace: (!ns.is_empty()).then_some(ns.as_str()),
        }),
    };
    let status = match &allowed {
        Ok(()) => json!({"allowed": true, "reason": "allowed by the Role"}),
        Err(_) => json!({"allowed": false}),
    };
    json_resp(
        201,
        &json!({
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": review["spec"],
            "status": status,
        }),
    )
}

/// The length-delimited fields of one protobuf message: (number, bytes);
/// `None` when it does not parse.
fn proto_fields(mut buf: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    fn varint(buf: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (b, rest) = buf.split_first()?;
            *buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        match key & 7 {
            0 => {
                varint(&mut buf)?;
            }
            1 => buf = buf.get(8..)?,
            5 => buf = buf.get(4..)?,
            2 => {
                let n = usize::try_from(varint(&mut buf)?).ok()?;
                out.push((key >> 3, buf.get(..n)?));
                buf = &buf[n..];
            }
            _ => return None,
        }
    }
    Some(out)
}

/// A `SelfSubjectAccessReview` in Kubernetes' protobuf envelope (`k8s\0`,
/// then `runtime.Unknown` whose field 2 is the object) as the JSON the
/// review's handler reads: `spec.resourceAttributes` (fields 1 to 7:
/// namespace, verb, group, version, resource, subresource, name).
fn ssar_from_protobuf(body: &[u8]) -> Option<Value> {
    let unknown = body.strip_prefix(b"k8s\0")?;
    fn field<'a>(fields: &[(u64, &'a [u8])], n: u64) -> Option<&'a [u8]> {
        fields.iter().find(|f| f.0 == n).map(|f| f.1)
    }
    let raw = field(&proto_fields(unknown)?, 2)?;
    let spec = field(&proto_fields(raw)?, 2)?;
    let ra = field(&proto_fields(spec)?, 1)?;
    let ra = proto_fields(ra)?;
    let names = [
        "namespace",
        "verb",
        "group",
        "version",
        "resource",
        "subresource",
        "name",
    ];
    let mut attrs = serde_json::Map::new();
    for (n, bytes) in ra {
        if let Some(name) = usize::try_from(n).ok().and_then(|n| names.get(n.wrapping_sub(1))) {
            attrs.insert(
                (*name).to_string(),
                Value::String(String::from_utf8_lossy(bytes).into_owned()),
            );
        }
    }
    Some(json!({"spec": {"resourceAttributes": attrs}}))
}

/// A resource request as RBAC sees it (`None`: discovery, allowed to all).
fn attributes<'a>(
    method: &Method,
    segs: &'a [String],
    q: &BTreeMap<String, String>,
) -> Option<super::rbac::Attributes<'a>> {
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (group, mut rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => ("", rest),
        ["apis", g, _, rest @ ..] if !rest.is_empty() => (*g, rest),
        _ => return None,
    };
    let mut watch = query_bool(q, "watch");
    if let ["watch", r @ ..] = rest {
        watch = true;
        rest = r;
    }
    let (namespace, rest) = match rest {
        ["namespaces", ns, r @ ..] if !r.is_empty() => (Some(*ns), r),
        r => (None, r),
    };
    let (resource, name, sub) = match rest {
        [r] => (*r, "", None),
        [r, n] => (*r, *n, None),
        [r, n, s] => (*r, *n, Some(*s)),
        _ => return None,
    };
    let verb = match (method, name.is_empty()) {
        (&Method::GET, true) if watch => "watch",
        (&Method::GET, true) => "list",
        (&Method::GET, false) if watch => "watch",
        (&Method::GET, false) => "get",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, true) => "deletecollection",
        (&Method::DELETE, false) => "delete",
        _ => return None,
    };
    Some(super::rbac::Attributes {
        verb,
        group,
        resource: match sub {
            Some(s) => format!("{resource}/{s}"),
            None => resource.to_string(),
        },
        name,
        namespace,
    })
}

struct Ctx<'a> {
    inner: &'a Arc<Inner>,
    q: BTreeMap<String, String>,
    method: Method,
    content_type: String,
    body: Value,
}

async fn route(
    inner: &Arc<Inner>,
    req: Request<Incoming>,
    path: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let q: BTreeMap<String, String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect();
    let method = req.method().clone();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let bytes = Limited::new(req.into_body(), 64 << 20)
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?
        .to_bytes();
    let body = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf: {e}")))?
    };
    let mut cx = Ctx {
        inner,
        q,
        method,
        content_type,
        body,
    };
    let segs: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(decode).collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (group, rest) = match segs.as_slice() {
        ["version"] => {
            return Ok(json_resp(
                200,
                &json!({"major": "1", "minor": inner.minor.to_string(), "gitVersion": format!("v1.{}.0-fake", inner.minor), "platform": "linux/amd64"}),
            ))
        }
        ["api"] => {
            return Ok(json_resp(
                200,
                &json!({"kind": "APIVersions", "versions": ["v1"]}),
            ))
        }
        ["apis"] => {
            return Ok(json_resp(
                200,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [{"name": "batch", "versions": [{"groupVersion": "batch/v1", "version": "v1"}], "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"}}]}),
            ))
        }
        ["api", "v1"] | ["apis", "batch", "v1"] => {
            let gv = if segs.len() == 2 { "v1" } else { "batch/v1" };
            let resources: Vec<Value> = super::store::RESOURCES
                .iter()
                .filter(|r| r.api_version() == gv)
                .flat_map(|r| {
                    let verbs = if r.resource == "nodes" {
                        json!(["get", "list", "watch"])
                    } else {
                        json!(["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"])
                    };
                    let mut out = vec![json!({"name": r.resource, "singularName": r.kind.to_lowercase(), "namespaced": r.namespaced, "kind": r.kind, "verbs": verbs})];
                    if r.resource == "pods" {
                        out.push(json!({"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]}));
                    }
                    out
                })
                .collect();
            return Ok(json_resp(
                200,
                &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
            ));
        }
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", "batch", "v1", rest @ ..] => ("batch", rest),
        _ => return Err(not_found_path(path)),
    };
    let rest = match rest {
        ["watch", r @ ..] => {
            cx.q.insert("watch".into(), "true".into());
            r
        }
        r => r,
    };
    let ri = |r: &str| info(group, r).ok_or_else(|| not_found_path(path));
    match rest {
        ["namespaces", ns] if group.is_empty() && cx.method == Method::GET => Ok(json_resp(
            200,
            &json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": ns, "uid": uuid(), "creationTimestamp": now()}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
        )),
        ["namespaces", ns, r] => {
            let ri = ri(r)?;
            if !ri.namespaced {
                return Err(not_found_path(path));
            }
            collection(&cx, ri, Some(ns)).await
        }
        ["namespaces", ns, r, name] => {
            let ri = ri(r)?;
            if !ri.namespaced {
                return Err(not_found_path(path));
            }
            item(&cx, ri, ns, name).await
        }
        ["namespaces", ns, "pods", name, "log"] if group.is_empty() && cx.method == Method::GET => {
            logs(&cx, ns, name).await
        }
        [r] => {
            let ri = ri(r)?;
            if ri.namespaced && cx.method != Method::GET {
                return Err(ApiError::new(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                ));
            }
            collection(&cx, ri, None).await
        }
        [r, name] => {
            let ri = ri(r)?;
            if ri.namespaced {
                return Err(not_found_path(path));
            }
            item(&cx, ri, "", name).await
        }
        _ => Err(not_found_path(path)),
    }
}

fn not_found_path(_path: &str) -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn method_not_allowed() -> ApiError {
    ApiError::new(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
    )
}

struct Selector {
    labels: Vec<Req>,
    fields: Vec<Req>,
}

impl Selector {
    fn from(q: &BTreeMap<String, String>) -> Result<Self, ApiError> {
        Ok(Selector {
            labels: parse_label_selector(q.get("labelSelector").map_or("", String::as_str))
                .map_err(ApiError::bad_request)?,
            fields: parse_field_selector(q.get("fieldSelector").map_or("", String::as_str))
                .map_err(ApiError::bad_request)?,
        })
    }
    fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        labels_match(&self.labels, |k| labels[k].as_str().map(str::to_string))
            && labels_match(&self.fields, |k| field_str(obj, k))
    }
}

fn list_json(ri: &ResourceInfo, rv: u64, items: Vec<Value>) -> Value {
    let items: Vec<Value> = items
        .into_iter()
        .map(|mut o| {
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            o
        })
        .collect();
    json!({"kind": format!("{}List", ri.kind), "apiVersion": ri.api_version(), "metadata": {"resourceVersion": rv.to_string()}, "items": items})
}

async fn collection(
    cx: &Ctx<'_>,
    ri: &'static ResourceInfo,
    ns: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    match cx.method {
        Method::GET => {
            let sel = Selector::from(&cx.q)?;
            if query_bool(&cx.q, "watch") {
                return Ok(watch(cx, ri, ns, sel));
            }
            let st = cx.inner.lock();
            let items: Vec<Value> = list_locked(&st, ri.resource, ns)
                .into_iter()
                .filter(|o| sel.matches(o))
                .collect();
            Ok(json_resp(200, &list_json(ri, st.rv, items)))
        }
        Method::POST => {
            let ns = ns.unwrap_or_default();
            if !ri.namespaced || ri.resource == "nodes" {
                return Err(method_not_allowed());
            }
            let out = create(cx.inner, ri, ns, cx.body.clone(), cx.q.contains_key("dryRun"))?;
            Ok(json_resp(201, &out))
        }
        Method::DELETE => {
            let Some(ns) = ns else {
                return Err(method_not_allowed());
            };
            let sel = Selector::from(&cx.q)?;
            let items: Vec<Value> = cx
                .inner
                .list(ri.resource, Some(ns))
                .into_iter()
                .filter(|o| sel.matches(o))
                .collect();
            let mut out = Vec::new();
            for o in items {
                let (_, name) = key_of(&o);
                let r = delete_one(cx, ri, ns, &name)?;
                out.push(if r["kind"] == json!("Status") { o } else { r });
            }
            let rv = cx.inner.lock().rv;
            Ok(json_resp(200, &list_json(ri, rv, out)))
        }
        _ => Err(method_not_allowed()),
    }
}

fn create(
    inner: &Arc<Inner>,
    ri: &'static ResourceInfo,
    ns: &str,
    body: Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let mut obj = body;
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body of the request must be an object"));
    }
    if let Some(k) = obj["kind"].as_str() {
        if k != ri.kind {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version ({})",
                obj["apiVersion"].as_str().unwrap_or_default(),
                ri.api_version()
            )));
        }
    }
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    match obj["metadata"]["namespace"].as_str() {
        Some(n) if !n.is_empty() && n != ns => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ))
        }
        _ => obj["metadata"]["namespace"] = json!(ns),
    }
    let name = match (
        obj["metadata"]["name"].as_str(),
        obj["metadata"]["generateName"].as_str(),
    ) {
        (Some(n), _) if !n.is_empty() => n.to_string(),
        (_, Some(g)) if !g.is_empty() => format!("{g}{}", rand_suffix(5)),
        _ => {
            return Err(ApiError::invalid(
                ri.kind,
                ri.group,
                "",
                &[(
                    "metadata.name".into(),
                    "FieldValueRequired",
                    "Required value: name or generateName is required".into(),
                )],
            ))
        }
    };
    obj["metadata"]["name"] = json!(name);
    if !is_dns_subdomain(&name) {
        return Err(ApiError::invalid(
            ri.kind,
            ri.group,
            &name,
            &[("metadata.name".into(), "FieldValueInvalid", format!("Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"))],
        ));
    }
    if let Some(m) = obj["metadata"].as_object_mut() {
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
        ] {
            m.remove(k);
        }
    }
    obj["metadata"]["uid"] = json!(uuid());
    // The API server's `dropDisabledFields` runs before validation.
    match ri.resource {
        "pods" => super::jobs::image_volumes(&mut obj["spec"], inner.image_volume),
        "jobs" => super::jobs::image_volumes(&mut obj["spec"]["template"]["spec"], inner.image_volume),
        _ => {}
    }
    match ri.resource {
        "secrets" => prepare_secret(&mut obj)?,
        "configmaps" => prepare_config_map(&mut obj)?,
        "services" => prepare_service(&mut obj)?,
        "jobs" => prepare_job(&mut obj)?,
        "pods" => {
            let errs = validate_pod_spec(&obj["spec"], "spec", false);
            if !errs.is_empty() {
                return Err(ApiError::invalid("Pod", "", &name, &errs));
            }
            super::jobs::default_pod_spec(&mut obj["spec"]);
            obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
        }
        _ => {}
    }
    let mut st = inner.lock();
    if st
        .objs
        .get(ri.resource)
        .is_some_and(|m| m.contains_key(&(ns.to_string(), name.clone())))
    {
        return Err(ApiError::already_exists(ri.resource, ri.group, &name));
    }
    if dry_run {
        return Ok(obj);
    }
    Ok(match ri.resource {
        "pods" => start_pod(inner, &mut st, obj),
        "jobs" => {
            let job = inner.insert_locked(&mut st, "jobs", obj);
            let (tx, rx) = tokio::sync::watch::channel(false);
            st.jobs.insert(key_of(&job), Arc::new(JobRt { cancel: tx }));
            tokio::spawn(run_job(inner.clone(), job.clone(), rx));
            job
        }
        r => inner.insert_locked(&mut st, info(ri.group, r).map_or("events", |i| i.resource), obj),
    })
}

/// A DNS-1035 label (Service names): lowercase alphanumerics and `-`, a letter first.
pub(crate) fn is_dns1035_label(s: &str) -> bool {
    super::jobs::is_dns_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

/// A Service as the API server validates and defaults it: a DNS-1035 name, `type`
/// `ClusterIP` (the only one the fake has), a cluster IP drawn for it unless it is headless
/// (`clusterIP: None`), ports (required unless headless) with `protocol` and `targetPort`
/// defaulted.
fn prepare_service(obj: &mut Value) -> Result<(), ApiError> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let mut errs: Vec<(String, &'static str, String)> = Vec::new();
    if !is_dns1035_label(&name) {
        errs.push((
            "metadata.name".into(),
            "FieldValueInvalid",
            format!("Invalid value: \"{name}\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"),
        ));
    }
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    let ty = spec["type"].as_str().unwrap_or("ClusterIP").to_string();
    if ty != "ClusterIP" {
        errs.push((
            "spec.type".into(),
            "FieldValueNotSupported",
            format!("Unsupported value: \"{ty}\": the fake supports \"ClusterIP\""),
        ));
    }
    let headless = spec["clusterIP"] == json!("None");
    let ports = spec["ports"].as_array().cloned().unwrap_or_default();
    if ports.is_empty() && !headless {
        errs.push(("spec.ports".into(), "FieldValueRequired", "Required value".into()));
    }
    for (i, p) in ports.iter().enumerate() {
        let port = p["port"].as_i64().unwrap_or(0);
        if !(1..=65535).contains(&port) {
            errs.push((
                format!("spec.ports[{i}].port"),
                "FieldValueInvalid",
                format!("Invalid value: {port}: must be between 1 and 65535, inclusive"),
            ));
        }
        if ports.len() > 1 && p["name"].as_str().is_none_or(str::is_empty) {
            errs.push((
                format!("spec.ports[{i}].name"),
                "FieldValueRequired",
                "Required value".into(),
            ));
        }
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid("Service", "", &name, &errs));
    }
    spec["type"] = json!("ClusterIP");
    if !headless {
        let n = super::util::rand_u64();
        spec["clusterIP"] = json!(format!("10.96.{}.{}", (n >> 8) % 256, 1 + n % 254));
    }
    spec["clusterIPs"] = json!([spec["clusterIP"].clone()]);
    for (k, v) in [
        ("sessionAffinity", json!("None")),
        ("ipFamilies", json!(["IPv4"])),
        ("ipFamilyPolicy", json!("SingleStack")),
        ("internalTrafficPolicy", json!("Cluster")),
    ] {
        if spec[k].is_null() {
            spec[k] = v;
        }
    }
    if let Some(ps) = spec["ports"].as_array_mut() {
        for p in ps {
            if p["protocol"].is_null() {
                p["protocol"] = json!("TCP");
            }
            if p["targetPort"].is_null() {
                p["targetPort"] = p["port"].clone();
            }
        }
    }
    obj["status"] = json!({"loadBalancer": {}});
    Ok(())
}

fn prepare_secret(obj: &mut Value) -> Result<(), ApiError> {
    use base64::Engine as _;
    if obj["type"].is_null() {
        obj["type"] = json!("Opaque");
    }
    if !obj["data"].is_object() {
        obj["data"] = json!({});
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    if let Some(data) = obj["data"].as_object() {
        for (k, v) in data {
            let ok = v
                .as_str()
                .is_some_and(|s| base64::engine::general_purpose::STANDARD.decode(s).is_ok());
            if !ok {
                return Err(ApiError::bad_request(format!("Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data at input byte 0 (key {k})")));
            }
        }
    }
    if let Some(sd) = obj.as_object_mut().and_then(|m| m.remove("stringData")) {
        for (k, v) in sd.as_object().cloned().unwrap_or_default() {
            let s = v.as_str().unwrap_or_default();
            obj["data"][&k] = json!(base64::engine::general_purpose::STANDARD.encode(s));
        }
    }
    for k in obj["data"]
        .as_object()
        .map(|m| m.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let ok = !k.is_empty()
            && k.len() <= 253
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
        if !ok {
            return Err(ApiError::invalid(
                "Secret",
                "",
                &name,
                &[(format!("data[{k}]"), "FieldValueInvalid", format!("Invalid value: \"{k}\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"))],
            ));
        }
    }
    Ok(())
}

/// The API server's most bytes of data in a ConfigMap or Secret (`MaxSecretSize`): the values
/// of `data` and the decoded values of `binaryData` together.
pub(crate) const MAX_CONFIG_BYTES: usize = 1 << 20;

/// A ConfigMap as the API server validates it: config keys, `binaryData` as base64, no key in
/// both `data` and `binaryData`, at most [`MAX_CONFIG_BYTES`] of data.
fn prepare_config_map(obj: &mut Value) -> Result<(), ApiError> {
    use base64::Engine as _;
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let invalid = |field: String, reason: &'static str, msg: String| {
        ApiError::invalid("ConfigMap", "", &name, &[(field, reason, msg)])
    };
    let mut total = 0usize;
    for (field, decode) in [("data", false), ("binaryData", true)] {
        let Some(map) = obj[field].as_object() else {
            continue;
        };
        for (k, v) in map {
            let ok = !k.is_empty()
                && k.len() <= 253
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
            if !ok {
                return Err(invalid(format!("{field}[{k}]"), "FieldValueInvalid", format!("Invalid value: \"{k}\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')")));
            }
            let s = v.as_str().unwrap_or_default();
            total += if decode {
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map_err(|_| {
                        ApiError::bad_request(format!("ConfigMap in version \"v1\" cannot be handled as a ConfigMap: illegal base64 data at input byte 0 (key {k})"))
                    })?
                    .len()
            } else {
                s.len()
            };
            if decode && obj["data"].get(k).is_some() {
                return Err(invalid(
                    format!("data[{k}]"),
                    "FieldValueInvalid",
                    format!("Invalid value: \"{k}\": duplicate of key present in binaryData"),
                ));
            }
        }
    }
    if total > MAX_CONFIG_BYTES {
        return Err(invalid(
            "[]".into(),
            "FieldValueTooLong",
            format!("Too long: must have at most {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    Ok(())
}

async fn item(
    cx: &Ctx<'_>,
    ri: &'static ResourceInfo,
    ns: &str,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let get = || {
        cx.inner
            .get(ri.resource, ns, name)
            .ok_or_else(|| ApiError::not_found(ri.resource, ri.group, name))
    };
    match cx.method {
        Method::GET => Ok(json_resp(200, &get()?)),
        Method::DELETE => {
            if ri.resource == "nodes" {
                return Err(method_not_allowed());
            }
            Ok(json_resp(200, &delete_one(cx, ri, ns, name)?))
        }
        Method::PUT | Method::PATCH => {
            if ri.resource == "nodes" {
                return Err(method_not_allowed());
            }
            let apply = cx.content_type.starts_with("application/apply-patch");
            if cx.method == Method::PATCH && cx.content_type.starts_with("application/json-patch") {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "the fake supports merge, strategic merge and apply patches",
                ));
            }
            let Some(old) = cx.inner.get(ri.resource, ns, name) else {
                if apply || cx.method == Method::PUT {
                    let mut body = cx.body.clone();
                    body["metadata"]["name"] = json!(name);
                    let out = create(cx.inner, ri, ns, body, cx.q.contains_key("dryRun"))?;
                    return Ok(json_resp(201, &out));
                }
                return Err(ApiError::not_found(ri.resource, ri.group, name));
            };
            let mut new = if cx.method == Method::PUT {
                let want = cx.body["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default();
                if !want.is_empty() && json!(want) != old["metadata"]["resourceVersion"] {
                    let q = if ri.group.is_empty() {
                        ri.resource.to_string()
                    } else {
                        format!("{}.{}", ri.resource, ri.group)
                    };
                    let mut e = ApiError::new(
                        409,
                        "Conflict",
                        format!("Operation cannot be fulfilled on {q} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
                    );
                    e.details = Some(details(name, ri.group, ri.resource));
                    return Err(e);
                }
                cx.body.clone()
            } else {
                let mut n = old.clone();
                merge_patch(&mut n, &cx.body);
                n
            };
            if ri.resource == "secrets" {
                prepare_secret(&mut new)?;
            }
            if ri.resource == "configmaps" {
                if old["immutable"] == json!(true)
                    && (new["data"] != old["data"] || new["binaryData"] != old["binaryData"])
                {
                    return Err(ApiError::invalid(
                        "ConfigMap",
                        "",
                        name,
                        &[(
                            "data".into(),
                            "FieldValueForbidden",
                            "Forbidden: field is immutable when `immutable` is set".into(),
                        )],
                    ));
                }
                prepare_config_map(&mut new)?;
            }
            // Identity, status and the immutable parts of pods and Jobs stay as they were.
            for k in [
                "uid",
                "creationTimestamp",
                "namespace",
                "name",
                "deletionTimestamp",
                "ownerReferences",
            ] {
                new["metadata"][k] = old["metadata"][k].clone();
            }
            if let Some(m) = new["metadata"].as_object_mut() {
                m.retain(|_, v| !v.is_null());
            }
            match ri.resource {
                "pods" => new["spec"] = old["spec"].clone(),
                "jobs" => {
                    new["spec"]["template"] = old["spec"]["template"].clone();
                    new["spec"]["selector"] = old["spec"]["selector"].clone();
                }
                _ => {}
            }
            if ri.resource == "pods" || ri.resource == "jobs" {
                new["status"] = old["status"].clone();
            }
            if cx.q.contains_key("dryRun") {
                return Ok(json_resp(200, &new));
            }
            let out = cx
                .inner
                .update(ri.resource, ns, name, |o| {
                    let rv = o["metadata"]["resourceVersion"].clone();
                    *o = new;
                    o["metadata"]["resourceVersion"] = rv;
                    o["kind"] = json!(ri.kind);
                    o["apiVersion"] = json!(ri.api_version());
                })
                .ok_or_else(|| ApiError::not_found(ri.resource, ri.group, name))?;
            Ok(json_resp(200, &out))
        }
        _ => Err(method_not_allowed()),
    }
}

fn delete_one(cx: &Ctx<'_>, ri: &'static ResourceInfo, ns: &str, name: &str) -> Result<Value, ApiError> {
    let policy = cx.body["propagationPolicy"]
        .as_str()
        .map(str::to_string)
        .or_else(|| cx.q.get("propagationPolicy").cloned())
        .or_else(|| {
            match cx.body["orphanDependents"]
                .as_bool()
                .or_else(|| cx.q.get("orphanDependents").map(String::as_str).map(parse_bool))
            {
                Some(true) => Some("Orphan".to_string()),
                Some(false) => Some("Background".to_string()),
                None => None,
            }
        });
    let grace = cx.body["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| cx.q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()));
    match ri.resource {
        "jobs" => delete_job(cx.inner, ns, name, policy.as_deref(), grace),
        "pods" => delete_pod(cx.inner, ns, name, grace),
        r => {
            let o = cx
                .inner
                .remove(info(ri.group, r).map_or("events", |i| i.resource), ns, name)
                .ok_or_else(|| ApiError::not_found(ri.resource, ri.group, name))?;
            let mut d = details(name, ri.group, ri.resource);
            d["uid"] = o["metadata"]["uid"].clone();
            Ok(
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d}),
            )
        }
    }
}

/// A watch that asked for bookmarks gets one after this long without a change.
const BOOKMARK_EVERY: Duration = Duration::from_secs(5);

fn watch(cx: &Ctx<'_>, ri: &'static ResourceInfo, ns: Option<&str>, sel: Selector) -> Response<Body> {
    let inner = cx.inner.clone();
    let ns = ns.map(str::to_string);
    let rv: Option<u64> =
        cx.q.get("resourceVersion")
            .and_then(|r| r.parse().ok())
            .filter(|r| *r > 0);
    let initial_events = query_bool(&cx.q, "sendInitialEvents");
    let bookmarks = query_bool(&cx.q, "allowWatchBookmarks");
    let timeout =
        cx.q.get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|t| *t > 0);
    let (tx, resp) = stream_resp("application/json");
    tokio::spawn(async move {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + Duration::from_secs(t));
        let mut changed = inner.changed.subscribe();
        changed.borrow_and_update();
        let line = |kind: &str, obj: &Value| {
            let mut b = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap_or_default();
            b.push(b'\n');
            Bytes::from(b)
        };
        let matches = |obj: &Value| {
            (ns.is_none() || obj["metadata"]["namespace"].as_str() == ns.as_deref()) && sel.matches(obj)
        };
        let bookmark = |rv: u64| {
            line(
                "BOOKMARK",
                &json!({"kind": ri.kind, "apiVersion": ri.api_version(), "metadata": {"resourceVersion": rv.to_string()}}),
            )
        };
        // The resourceVersion every change up to which this watch has sent
        // (or skipped as not matching): what a bookmark may say. Not the
        // store's latest: a bookmark past a change still unsent made the
        // client reopen past it, and the change was lost (one pod's end in a
        // 5,000-cell run, its cell waiting for ever).
        // (Set with each batch: a batch is read before any bookmark.)
        let mut covered: u64;
        let (mut pos, first) = {
            let st = inner.lock();
            match rv {
                // Older than the history kept (`FakeKube::compact`): `410 Gone`, as an ERROR event.
                Some(rv) if !initial_events && rv < st.compacted => {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": format!("too old resource version: {rv} ({})", st.compacted),
                        "reason": "Expired", "code": 410});
                    (usize::MAX, vec![line("ERROR", &status)])
                }
                Some(rv) if !initial_events => (st.history.partition_point(|c| c.rv <= rv), Vec::new()),
                _ => {
                    let mut out: Vec<Bytes> = list_locked(&st, ri.resource, ns.as_deref())
                        .iter()
                        .filter(|o| matches(o))
                        .map(|o| line("ADDED", o))
                        .collect();
                    if initial_events {
                        out.push(line(
                            "BOOKMARK",
                            &json!({"kind": ri.kind, "apiVersion": ri.api_version(), "metadata": {"resourceVersion": st.rv.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}),
                        ));
                    }
                    (st.history.len(), out)
                }
            }
        };
        for b in first {
            if tx.send(Ok(Frame::data(b))).await.is_err() {
                return;
            }
        }
        if pos == usize::MAX {
            return;
        }
        loop {
            let batch: Vec<Bytes> = {
                changed.borrow_and_update();
                let st = inner.lock();
                let lost = |c: &&crate::store::Change| {
                    inner.lose_pod_endings
                        && c.resource == "pods"
                        && c.kind == "MODIFIED"
                        && (matches!(c.obj["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
                            || c.obj["status"]["containerStatuses"]
                                .as_array()
                                .is_some_and(|a| a.iter().any(|s| s["state"].get("terminated").is_some())))
                };
                let out = st.history[pos..]
                    .iter()
                    .filter(|c| c.resource == ri.resource && matches(&c.obj) && !lost(c))
                    .map(|c| line(c.kind, &c.obj))
                    .collect();
                pos = st.history.len();
                covered = st.rv;
                out
            };
            for b in batch {
                if tx.send(Ok(Frame::data(b))).await.is_err() {
                    return;
                }
            }
            let until = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            // Asked for bookmarks: one after a quiet while, and one as the watch ends.
            let quiet = async {
                if bookmarks {
                    tokio::time::sleep(BOOKMARK_EVERY).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = until => {
                    if bookmarks {
                        let _ = tx.send(Ok(Frame::data(bookmark(covered)))).await;
                    }
                    return
                }
                _ = quiet => {
                    if tx.send(Ok(Frame::data(bookmark(covered)))).await.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
            }
        }
    });
    resp
}

async fn logs(cx: &Ctx<'_>, ns: &str, name: &str) -> Result<Response<Body>, ApiError> {
    let pod = cx
        .inner
        .get("pods", ns, name)
        .ok_or_else(|| ApiError::not_found("pods", "", name))?;
    let names = |k: &str| -> Vec<String> {
        super::sched::arr(&pod["spec"][k])
            .iter()
            .filter_map(|c| c["name"].as_str().map(str::to_string))
            .collect()
    };
    let (inits, mains) = (names("initContainers"), names("containers"));
    let container = match cx.q.get("container").filter(|c| !c.is_empty()) {
        Some(c) => c.clone(),
        None if mains.len() == 1 => mains[0].clone(),
        None => {
            let mut m = format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                mains.join(" ")
            );
            if !inits.is_empty() {
                m.push_str(&format!(" or one of the init containers: [{}]", inits.join(" ")));
            }
            return Err(ApiError::bad_request(m));
        }
    };
    if !mains.contains(&container) && !inits.contains(&container) {
        return Err(ApiError::bad_request(format!(
            "container {container} is not valid for pod {name}"
        )));
    }
    if query_bool(&cx.q, "previous") {
        return Err(ApiError::bad_request(format!(
            "previous terminated container \"{container}\" in pod \"{name}\" not found"
        )));
    }
    if pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty) {
        // The API server has no kubelet to ask: an empty answer.
        return Ok(text_resp(Vec::new()));
    }
    let rt = cx
        .inner
        .lock()
        .pods
        .get(&(ns.to_string(), name.to_string()))
        .cloned();
    let log = rt.as_ref().and_then(|r| r.log(&container));
    let Some(log) = log else {
        let statuses = super::sched::arr(&pod["status"]["containerStatuses"])
            .iter()
            .chain(super::sched::arr(&pod["status"]["initContainerStatuses"]))
            .find(|s| s["name"] == json!(container))
            .cloned()
            .unwrap_or(Value::Null);
        let reason = statuses["state"]["waiting"]["reason"]
            .as_str()
            .unwrap_or("ContainerCreating");
        let what = match reason {
            "ErrImagePull" | "ImagePullBackOff" => "trying and failing to pull image",
            "InvalidImageName" => "image can't be pulled",
            r => r,
        };
        return Err(ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start: {what}"
        )));
    };
    let num = |k: &str| cx.q.get(k).and_then(|v| v.parse::<u64>().ok());
    let tail = num("tailLines").map(|t| t as usize);
    let since = num("sinceSeconds")
        .map(|s| SystemTime::now() - Duration::from_secs(s))
        .or_else(|| cx.q.get("sinceTime").and_then(|t| super::util::parse_rfc3339(t)));
    let timestamps = query_bool(&cx.q, "timestamps");
    let limit = num("limitBytes").map(|l| l as usize);
    let follow = query_bool(&cx.q, "follow");
    let (from, first, done) = {
        let d = lock(&log.data);
        let from = d.start(tail, since);
        (d.bytes.len(), d.render(from, d.bytes.len(), timestamps), d.done)
    };
    if !follow || done {
        let mut b = first;
        if let Some(l) = limit {
            b.truncate(l);
        }
        return Ok(text_resp(b));
    }
    let cut = match (cx.inner.cut_logs, limit) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let (tx, resp) = stream_resp("text/plain");
    tokio::spawn(async move {
        let mut sent = 0usize;
        let mut pos = from;
        let mut chunk = first;
        let mut rx = log.tx.subscribe();
        loop {
            if !chunk.is_empty() {
                let mut end = false;
                if let Some(c) = cut {
                    if sent + chunk.len() >= c {
                        chunk.truncate(c - sent);
                        end = true;
                    }
                }
                sent += chunk.len();
                if !chunk.is_empty()
                    && tx
                        .send(Ok(Frame::data(Bytes::from(std::mem::take(&mut chunk)))))
                        .await
                        .is_err()
                {
                    return;
                }
                if end {
                    return;
                }
            }
            rx.borrow_and_update();
            let done = {
                let d = lock(&log.data);
                chunk = d.render(pos, d.bytes.len(), timestamps);
                pos = d.bytes.len();
                d.done
            };
            if !chunk.is_empty() {
                continue;
            }
            if done {
                return;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = tx.closed() => return,
            }
        }
    });
    Ok(resp)
}

/// A boolean query parameter as the API server reads it (Go's
/// `strconv.ParseBool`): `1`, `t`, `T`, `true`, `True`, `TRUE` are true;
/// Python's client writes `watch=True`.
fn parse_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "True" | "TRUE")
}

fn query_bool(q: &BTreeMap<String, String>, key: &str) -> bool {
    q.get(key).map(String::as_str).is_some_and(parse_bool)
}

#[cfg(test)]
mod ssar_tests {
    use super::*;

    /// A length-delimited protobuf field.
    fn ld(field: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(field << 3) | 2, u8::try_from(bytes.len()).unwrap()];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn a_protobuf_review_reads_as_its_resource_attributes() {
        let ra = [ld(1, b"bench"), ld(2, b"get"), ld(5, b"pods"), ld(6, b"log")].concat();
        let review = [ld(1, b""), ld(2, &ld(1, &ra))].concat();
        // runtime.Unknown: typeMeta (1), raw (2), a varint field (5) skipped.
        let unknown = [
            ld(1, &ld(1, b"authorization.k8s.io/v1")),
            ld(2, &review),
            vec![5 << 3, 1],
        ]
        .concat();
        let body = [b"k8s\0".as_slice(), &unknown].concat();
        let v = ssar_from_protobuf(&body).unwrap();
        assert_eq!(
            v,
            json!({"spec": {"resourceAttributes": {"namespace": "bench", "verb": "get", "resource": "pods", "subresource": "log"}}})
        );
        assert!(ssar_from_protobuf(b"{\"spec\": {}}").is_none());
    }
}
