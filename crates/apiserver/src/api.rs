//! Request handling: routing, authorization, the verbs, and per-kind strategies.

use crate::admission;
use crate::authz::{self, Attributes, UserInfo};
use crate::discovery;
use crate::error::{ApiError, ApiResult};
use crate::patch::{self, PatchType};
use crate::pki::Ca;
use crate::registry::{self, ResourceDef, StatusStrategy};
use crate::schema;
use crate::selector::{self, FieldSelector, LabelSelector};
use crate::store::{self, ChangeType, Store, StoreError};
use crate::timeutil;
use base64::Engine;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Method, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::{Map, Value, json};
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Response body type.
pub type Body = BoxBody<Bytes, Infallible>;

/// Tunables.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Service ClusterIP range.
    pub service_cidr: ipnet::Ipv4Net,
    /// Smallest CSR `expirationSeconds` accepted (real servers: 600).
    pub min_csr_expiration_seconds: u64,
    /// Interval between watch bookmarks.
    pub bookmark_interval: Duration,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// `host:port` advertised in `/api`.
    pub server_addr: String,
}

/// Shared server state.
pub struct State {
    /// Objects.
    pub store: Store,
    /// The CA.
    pub ca: Ca,
    /// Tunables.
    pub settings: Settings,
    defs: RwLock<Arc<Vec<ResourceDef>>>,
    defs_generation: AtomicU64,
    reserved_ips: Mutex<HashSet<Ipv4Addr>>,
    /// Watches answered with an in-stream 410 Expired.
    pub expired_watches: AtomicU64,
    /// Flipped to true when the server stops (ends watches).
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").finish_non_exhaustive()
    }
}

const STANDARD_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

impl State {
    /// Build the state, seeding standard namespaces and bootstrap RBAC on first start.
    pub fn new(
        store: Store,
        ca: Ca,
        settings: Settings,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let st = Self {
            store,
            ca,
            settings,
            defs: RwLock::new(Arc::new(registry::builtin())),
            defs_generation: AtomicU64::new(1),
            reserved_ips: Mutex::new(HashSet::new()),
            expired_watches: AtomicU64::new(0),
            shutdown,
        };
        for ns in STANDARD_NAMESPACES {
            if st.store.get("/namespaces", "", ns).is_none() {
                let obj =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                let obj = fill_create_metadata(obj);
                let obj = namespace_defaults(obj);
                let _ = st.store.create("/namespaces", obj);
            }
        }
        if st
            .store
            .get(
                "rbac.authorization.k8s.io/clusterroles",
                "",
                "cluster-admin",
            )
            .is_none()
        {
            let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]});
            let _ = st.store.create(
                "rbac.authorization.k8s.io/clusterroles",
                fill_create_metadata(role),
            );
            let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:masters"}]});
            let _ = st.store.create(
                "rbac.authorization.k8s.io/clusterrolebindings",
                fill_create_metadata(binding),
            );
        }
        st.refresh_defs();
        st
    }

    /// The served kinds.
    pub fn defs(&self) -> Arc<Vec<ResourceDef>> {
        self.defs.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Rebuild the served kinds from the built-ins and the stored CRDs.
    pub fn refresh_defs(&self) {
        let mut defs = registry::builtin();
        let (crds, _) = self
            .store
            .list("apiextensions.k8s.io/customresourcedefinitions", None);
        for c in crds {
            if c["metadata"]["deletionTimestamp"].is_null() {
                defs.extend(registry::from_crd(&c));
            }
        }
        *self.defs.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(defs);
        self.defs_generation.fetch_add(1, Ordering::Relaxed);
    }

    fn find(&self, group: &str, version: &str, plural: &str) -> Option<ResourceDef> {
        self.defs()
            .iter()
            .find(|d| d.group == group && d.version == version && d.plural == plural)
            .cloned()
    }
}

// ---------------------------------------------------------------------------------------------
// responses

fn full(bytes: Vec<u8>) -> Body {
    Full::new(Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed()
}

/// A JSON response.
pub fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(full(bytes));
    *r.status_mut() = code;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// A Status error response.
pub fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.status_code(), &e.to_status())
}

// ---------------------------------------------------------------------------------------------
// request parsing

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = if b[i] == b'%' && i + 3 <= b.len() {
            std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        } else {
            None
        };
        match (b[i], hex) {
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (_, Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, None) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse a query string.
pub fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    let mut m = HashMap::new();
    for pair in q.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        m.insert(percent_decode(k), percent_decode(v));
    }
    m
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presentation {
    Full,
    Table,
    Metadata,
}

fn presentation(headers: &http::HeaderMap) -> Presentation {
    let accept = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // Take the first acceptable media type, in order.
    for part in accept.split(',') {
        let p = part.replace(' ', "");
        if p.contains("as=Table") {
            return Presentation::Table;
        }
        if p.contains("as=PartialObjectMetadata") {
            return Presentation::Metadata;
        }
        if p.starts_with("application/json") || p.starts_with("*/*") || p.is_empty() {
            return Presentation::Full;
        }
    }
    Presentation::Full
}

struct Target {
    def: ResourceDef,
    namespace: String,
    name: String,
    sub: String,
    watch_path: bool,
}

fn no_route(path: &str) -> ApiError {
    ApiError::no_route(path)
}

fn resolve(st: &State, group: &str, version: &str, rest: &[&str], path: &str) -> ApiResult<Target> {
    let mut rest = rest;
    let mut watch_path = false;
    if rest.first() == Some(&"watch") {
        watch_path = true;
        rest = &rest[1..];
    }
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !(group.is_empty()
                && (*plural == "status" || *plural == "finalize")
                && tail.is_empty()) =>
        {
            let mut v = vec![*plural];
            v.extend_from_slice(tail);
            (ns.to_string(), v)
        }
        other => (String::new(), other.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [p] => (*p, "", ""),
        [p, n] => (*p, *n, ""),
        [p, n, s] => (*p, *n, *s),
        _ => return Err(no_route(path)),
    };
    let def = st
        .find(group, version, plural)
        .ok_or_else(|| no_route(path))?;
    if !namespace.is_empty() && !def.namespaced {
        return Err(no_route(path));
    }
    match sub {
        "" => {}
        "status" if def.status != StatusStrategy::None => {}
        "approval" if def.approval => {}
        _ => return Err(no_route(path)),
    }
    if name.is_empty() && !sub.is_empty() {
        return Err(no_route(path));
    }
    Ok(Target {
        def,
        namespace,
        name: name.to_string(),
        sub: sub.to_string(),
        watch_path,
    })
}

async fn read_body(st: &State, body: hyper::body::Incoming) -> ApiResult<Bytes> {
    match http_body_util::Limited::new(body, st.settings.max_body_bytes)
        .collect()
        .await
    {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(ApiError::too_large(format!(
                    "the request body exceeds the limit of {} bytes",
                    st.settings.max_body_bytes
                )))
            } else {
                Err(ApiError::bad_request(format!("reading request body: {e}")))
            }
        }
    }
}

fn parse_object(body: &[u8], content_type: &str) -> ApiResult<Value> {
    let ct = content_type.split(';').next().unwrap_or_default().trim();
    if ct.contains("protobuf") {
        return crate::proto::decode(body).map_err(|e| match e {
            crate::proto::ProtoError::Unsupported(_) => ApiError::unsupported_media(e.to_string()),
            crate::proto::ProtoError::Malformed(_) => ApiError::bad_request(e.to_string()),
        });
    }
    let v: Value = if ct.contains("yaml") {
        patch::parse_yaml_or_json(body).map_err(|e| ApiError::bad_request(e.to_string()))?
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the object provided is unrecognized: {e}"))
        })?
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized: body must be a JSON object",
        ));
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// entry point

/// Handle one request from an authenticated (or anonymous) caller.
pub async fn handle(
    st: Arc<State>,
    user: UserInfo,
    req: http::Request<hyper::body::Incoming>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let result = route(&st, &user, req).await;
    match result {
        Ok(r) => {
            tracing::debug!(%method, %path, user = %user.username, status = r.status().as_u16(), "request");
            r
        }
        Err(e) => {
            tracing::debug!(%method, %path, user = %user.username, status = e.code, message = %e.message, "request failed");
            error_response(&e)
        }
    }
}

async fn route(
    st: &Arc<State>,
    user: &UserInfo,
    req: http::Request<hyper::body::Incoming>,
) -> ApiResult<Response<Body>> {
    let path = req.uri().path().to_string();
    let anonymous = user.groups.iter().any(|g| g == "system:unauthenticated");
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match segs.as_slice() {
        ["version"] => return Ok(json_response(StatusCode::OK, &discovery::version())),
        ["healthz"] | ["readyz"] | ["livez"] => {
            let mut r = Response::new(full(b"ok".to_vec()));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain"),
            );
            return Ok(r);
        }
        _ => {}
    }
    if anonymous {
        return Err(ApiError::unauthorized());
    }
    let impersonated = impersonate(st, user, req.headers())?;
    let user = impersonated.as_ref().unwrap_or(user);
    let defs = st.defs();
    let get = req.method() == Method::GET;
    match segs.as_slice() {
        ["api"] if get => {
            return Ok(json_response(
                StatusCode::OK,
                &discovery::api_versions(&st.settings.server_addr),
            ));
        }
        ["apis"] if get => {
            return Ok(json_response(
                StatusCode::OK,
                &discovery::api_group_list(&defs),
            ));
        }
        ["api", v] if get => {
            return discovery::resource_list(&defs, "", v)
                .map(|d| json_response(StatusCode::OK, &d))
                .ok_or_else(|| no_route(&path));
        }
        ["apis", g] if get => {
            return discovery::api_group(&defs, g)
                .map(|d| json_response(StatusCode::OK, &d))
                .ok_or_else(|| no_route(&path));
        }
        ["apis", g, v] if get => {
            return discovery::resource_list(&defs, g, v)
                .map(|d| json_response(StatusCode::OK, &d))
                .ok_or_else(|| no_route(&path));
        }
        ["openapi", "v3"] if get => {
            return Ok(json_response(
                StatusCode::OK,
                &discovery::openapi_root(&defs, st.defs_generation.load(Ordering::Relaxed)),
            ));
        }
        ["openapi", "v3", rest @ ..] if get => {
            return discovery::openapi_gv(&defs, &rest.join("/"))
                .map(|d| json_response(StatusCode::OK, &d))
                .ok_or_else(|| no_route(&path));
        }
        [
            "apis",
            "authorization.k8s.io",
            "v1",
            res @ ("selfsubjectaccessreviews" | "subjectaccessreviews"),
        ] => {
            let self_review = *res == "selfsubjectaccessreviews";
            if req.method() != Method::POST {
                return Err(ApiError::method_not_allowed(
                    "only create is supported for access reviews",
                ));
            }
            if !self_review {
                let a = Attributes {
                    verb: "create",
                    group: "authorization.k8s.io",
                    resource: "subjectaccessreviews",
                    subresource: "",
                    namespace: "",
                    name: "",
                };
                if !authz::allowed(&st.store, user, &a) {
                    return Err(ApiError::forbidden(authz::forbidden_message(user, &a)));
                }
            }
            let ct = req
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let body = read_body(st, req.into_body()).await?;
            let review = parse_object(&body, &ct)?;
            return Ok(json_response(
                StatusCode::CREATED,
                &access_review(st, user, review, self_review),
            ));
        }
        ["api", v, rest @ ..] => {
            let t = resolve(st, "", v, rest, &path)?;
            return resource_request(st, user, t, req).await;
        }
        ["apis", g, v, rest @ ..] => {
            let t = resolve(st, g, v, rest, &path)?;
            return resource_request(st, user, t, req).await;
        }
        _ => {}
    }
    Err(no_route(&path))
}

/// `Impersonate-User` / `Impersonate-Group` headers (kubectl `--as`, `--as-group`): the caller
/// needs `impersonate` on `users` / `groups`.
fn impersonate(
    st: &State,
    caller: &UserInfo,
    headers: &http::HeaderMap,
) -> ApiResult<Option<UserInfo>> {
    let Some(as_user) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        if headers.contains_key("impersonate-group") {
            return Err(ApiError::internal(
                "requested impersonation of groups without a user",
            ));
        }
        return Ok(None);
    };
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let check = |resource: &str, name: &str| {
        let a = Attributes {
            verb: "impersonate",
            group: "",
            resource,
            subresource: "",
            namespace: "",
            name,
        };
        if authz::allowed(&st.store, caller, &a) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "{resource} \"{name}\" is forbidden: User \"{}\" cannot impersonate resource \"{resource}\" in API group \"\" at the cluster scope",
                caller.username
            )))
        }
    };
    check("users", &as_user)?;
    for g in &groups {
        check("groups", g)?;
    }
    let mut groups = groups;
    if !groups.iter().any(|g| g == "system:authenticated") {
        groups.push("system:authenticated".into());
    }
    Ok(Some(UserInfo {
        username: as_user,
        groups,
    }))
}

/// Answer a (Self)SubjectAccessReview.
fn access_review(st: &State, caller: &UserInfo, mut review: Value, self_review: bool) -> Value {
    let spec = review["spec"].clone();
    let user = if self_review {
        caller.clone()
    } else {
        UserInfo {
            username: spec["user"].as_str().unwrap_or_default().to_string(),
            groups: spec["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g.as_str().map(str::to_string))
                .collect(),
        }
    };
    let allowed = if let Some(ra) = spec["resourceAttributes"].as_object() {
        let s = |k: &str| {
            ra.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (verb, group, resource, sub, ns, name) = (
            s("verb"),
            s("group"),
            s("resource"),
            s("subresource"),
            s("namespace"),
            s("name"),
        );
        let a = Attributes {
            verb: &verb,
            group: &group,
            resource: &resource,
            subresource: &sub,
            namespace: &ns,
            name: &name,
        };
        authz::allowed(&st.store, &user, &a)
    } else {
        let path = spec["nonResourceAttributes"]["path"]
            .as_str()
            .unwrap_or_default();
        user.is_master()
            || (authz::public_path(path)
                && spec["nonResourceAttributes"]["verb"].as_str() == Some("get"))
    };
    review["status"] = json!({"allowed": allowed, "reason": if allowed { "allowed by RBAC or the Node authorizer" } else { "" }});
    if let Some(m) = review.as_object_mut() {
        m.entry("apiVersion")
            .or_insert(json!("authorization.k8s.io/v1"));
    }
    review
}

fn authorize(st: &State, user: &UserInfo, verb: &str, t: &Target) -> ApiResult<()> {
    let a = Attributes {
        verb,
        group: &t.def.group,
        resource: &t.def.plural,
        subresource: &t.sub,
        namespace: &t.namespace,
        name: &t.name,
    };
    if authz::allowed(&st.store, user, &a) {
        Ok(())
    } else {
        Err(ApiError::forbidden(authz::forbidden_message(user, &a)))
    }
}

async fn resource_request(
    st: &Arc<State>,
    user: &UserInfo,
    t: Target,
    req: http::Request<hyper::body::Incoming>,
) -> ApiResult<Response<Body>> {
    let q = parse_query(req.uri().query());
    let pres = presentation(req.headers());
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let method = req.method().clone();
    let is_watch = t.watch_path || matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (method.as_str(), t.name.is_empty()) {
        ("GET", _) if is_watch => "watch",
        ("GET", false) => "get",
        ("GET", true) => "list",
        ("POST", true) => "create",
        ("PUT", false) => "update",
        ("PATCH", false) => "patch",
        ("DELETE", false) => "delete",
        ("DELETE", true) => "deletecollection",
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method})"
            )));
        }
    };
    if t.def.namespaced && t.namespace.is_empty() && !matches!(verb, "list" | "watch") {
        return Err(no_route(req.uri().path()));
    }
    authorize(st, user, verb, &t)?;
    let dry_run = q.get("dryRun").is_some_and(|v| v == "All");
    match verb {
        "get" => {
            let obj = st
                .store
                .get(&t.def.storage, &t.namespace, &t.name)
                .ok_or_else(|| not_found(&t))?;
            Ok(json_response(
                StatusCode::OK,
                &present_one(&t.def, &obj, pres),
            ))
        }
        "list" => list(st, &t, &q, pres),
        "watch" => watch(st, &t, &q, pres),
        "create" => {
            let body = read_body(st, req.into_body()).await?;
            let obj = parse_object(&body, &content_type)?;
            let (code, obj) = create(st, user, &t, obj, dry_run).await?;
            Ok(json_response(
                code,
                &present_one(&t.def, &obj, Presentation::Full),
            ))
        }
        "update" => {
            let body = read_body(st, req.into_body()).await?;
            let obj = parse_object(&body, &content_type)?;
            let obj = to_storage_form(&t.def, obj);
            let body_name = obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if !body_name.is_empty() && body_name != t.name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({})",
                    t.name
                )));
            }
            check_kind(&t.def, &obj)?;
            let client_rv = obj["metadata"]["resourceVersion"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(|s| store::parse_rv(s).unwrap_or(u64::MAX));
            let out = update(st, user, &t, dry_run, |_cur| Ok((obj.clone(), client_rv))).await?;
            Ok(json_response(
                StatusCode::OK,
                &present_one(&t.def, &out, Presentation::Full),
            ))
        }
        "patch" => {
            let ty = PatchType::from_content_type(&content_type).ok_or_else(|| {
                ApiError::unsupported_media(format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type})"))
            })?;
            let body = read_body(st, req.into_body()).await?;
            patch_request(st, user, &t, ty, &body, dry_run, &q).await
        }
        "delete" => {
            let body = read_body(st, req.into_body()).await?;
            let opts: Value = if body.is_empty() {
                json!({})
            } else {
                serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(e.to_string()))?
            };
            let dry = dry_run
                || opts["dryRun"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == "All"));
            let obj = delete(st, user, &t, &opts, dry).await?;
            Ok(json_response(
                StatusCode::OK,
                &present_one(&t.def, &obj, Presentation::Full),
            ))
        }
        _ => {
            // deletecollection
            let (items, _) = filtered_items(st, &t, &q)?;
            let mut deleted = Vec::new();
            for it in items {
                let name = it["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let ns = it["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let one = Target {
                    def: t.def.clone(),
                    namespace: ns,
                    name,
                    sub: String::new(),
                    watch_path: false,
                };
                if let Ok(o) = delete(st, user, &one, &json!({}), dry_run).await {
                    deleted.push(present(&t.def, &o));
                }
            }
            Ok(json_response(
                StatusCode::OK,
                &json!({"kind": t.def.list_kind(), "apiVersion": t.def.api_version(), "metadata": {}, "items": deleted}),
            ))
        }
    }
}

fn not_found(t: &Target) -> ApiError {
    ApiError::not_found(&t.def.plural, &t.def.group, &t.name)
}

/// Objects, their metadata, spec and status must be JSON objects (every served kind agrees), so
/// later field writes cannot hit a non-object.
fn check_shape(obj: &Value) -> ApiResult<()> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized: not a JSON object",
        ));
    }
    for k in ["metadata", "spec", "status"] {
        let v = &obj[k];
        if !(v.is_null() || v.is_object()) {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized: {k} must be an object"
            )));
        }
    }
    Ok(())
}

fn check_kind(def: &ResourceDef, obj: &Value) -> ApiResult<()> {
    check_shape(obj)?;
    if let Some(k) = obj["kind"].as_str()
        && !k.is_empty()
        && k != def.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind of the provided object ({k}) does not match the resource ({})",
            def.kind
        )));
    }
    if let Some(av) = obj["apiVersion"].as_str()
        && !av.is_empty()
        && av != def.api_version()
        && !(def.storage == "/events" && (av == "v1" || av == "events.k8s.io/v1"))
    {
        let group = av.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        if group != def.group {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                def.api_version()
            )));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// presentation

/// core/v1 Event field ↔ events.k8s.io/v1 Event field (one store serves both APIs).
const EVENT_FIELDS: [(&str, &str); 15] = [
    ("metadata", "metadata"),
    ("eventTime", "eventTime"),
    ("series", "series"),
    ("reportingComponent", "reportingController"),
    ("reportingInstance", "reportingInstance"),
    ("action", "action"),
    ("reason", "reason"),
    ("involvedObject", "regarding"),
    ("related", "related"),
    ("message", "note"),
    ("type", "type"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// Renames an Event's fields between the two APIs (`to_v1`: core/v1 → events.k8s.io/v1).
fn convert_event(o: &Value, to_v1: bool) -> Value {
    let mut m = Map::new();
    m.insert(
        "apiVersion".into(),
        json!(if to_v1 { "events.k8s.io/v1" } else { "v1" }),
    );
    m.insert("kind".into(), json!("Event"));
    for (core, v1) in EVENT_FIELDS {
        let (from, to) = if to_v1 { (core, v1) } else { (v1, core) };
        if let Some(x) = o.get(from).filter(|x| !x.is_null()) {
            m.insert(to.into(), x.clone());
        }
    }
    Value::Object(m)
}

fn event_to_v1(o: &Value) -> Value {
    convert_event(o, true)
}

fn event_from_v1(o: &Value) -> Value {
    convert_event(o, false)
}

fn to_storage_form(def: &ResourceDef, obj: Value) -> Value {
    if def.group == "events.k8s.io" && obj["apiVersion"].as_str() != Some("v1") {
        event_from_v1(&obj)
    } else {
        obj
    }
}

fn present(def: &ResourceDef, obj: &Value) -> Value {
    if def.group == "events.k8s.io" {
        return event_to_v1(obj);
    }
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.insert("apiVersion".into(), json!(def.api_version()));
        m.insert("kind".into(), json!(def.kind));
    }
    o
}

fn present_one(def: &ResourceDef, obj: &Value, pres: Presentation) -> Value {
    match pres {
        Presentation::Full => present(def, obj),
        Presentation::Metadata => {
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
        }
        Presentation::Table => discovery::table(
            def,
            &[present(def, obj)],
            json!({"resourceVersion": obj["metadata"]["resourceVersion"]}),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// list / watch

fn field_allowed(def: &ResourceDef) -> impl Fn(&str) -> bool + '_ {
    move |f: &str| {
        if f == "metadata.name" || (f == "metadata.namespace" && def.namespaced) {
            return true;
        }
        match (def.group.as_str(), def.plural.as_str()) {
            ("", "pods") => matches!(
                f,
                "spec.nodeName"
                    | "spec.restartPolicy"
                    | "spec.schedulerName"
                    | "spec.serviceAccountName"
                    | "spec.hostNetwork"
                    | "status.phase"
                    | "status.podIP"
                    | "status.nominatedNodeName"
            ),
            ("", "events") | ("events.k8s.io", "events") => {
                f.starts_with("involvedObject.")
                    || matches!(f, "reason" | "reportingComponent" | "source" | "type")
            }
            ("", "nodes") => f == "spec.unschedulable",
            ("", "namespaces") => f == "status.phase",
            ("", "secrets") => f == "type",
            ("certificates.k8s.io", _) => f == "spec.signerName",
            _ => false,
        }
    }
}

fn selectors(t: &Target, q: &HashMap<String, String>) -> ApiResult<(LabelSelector, FieldSelector)> {
    let ls = selector::parse_label_selector(
        q.get("labelSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let raw_fs = q
        .get("fieldSelector")
        .map(String::as_str)
        .unwrap_or_default();
    let raw_fs = if t.def.group == "events.k8s.io" {
        raw_fs.replace("regarding.", "involvedObject.")
    } else {
        raw_fs.to_string()
    };
    let fs = selector::parse_field_selector(&raw_fs, &field_allowed(&t.def))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((ls, fs))
}

fn ns_filter(t: &Target) -> Option<&str> {
    if t.def.namespaced && !t.namespace.is_empty() {
        Some(t.namespace.as_str())
    } else {
        None
    }
}

fn filtered_items(
    st: &State,
    t: &Target,
    q: &HashMap<String, String>,
) -> ApiResult<(Vec<Arc<Value>>, u64)> {
    let (ls, fs) = selectors(t, q)?;
    let (items, rv) = st.store.list(&t.def.storage, ns_filter(t));
    Ok((
        items
            .into_iter()
            .filter(|o| ls.matches_object(o) && fs.matches(o))
            .collect(),
        rv,
    ))
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(
        json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}\u{0}")}).to_string(),
    )
}

fn decode_continue(s: &str) -> Option<(u64, String)> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    Some((v["rv"].as_u64()?, v["start"].as_str()?.to_string()))
}

fn list(
    st: &State,
    t: &Target,
    q: &HashMap<String, String>,
    pres: Presentation,
) -> ApiResult<Response<Body>> {
    let (items, rv) = filtered_items(st, t, q)?;
    let limit: usize = match q.get("limit").filter(|s| !s.is_empty()) {
        Some(l) => l
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
        None => 0,
    };
    let mut start_after: Option<String> = None;
    let mut list_rv = rv;
    if let Some(c) = q.get("continue").filter(|s| !s.is_empty()) {
        let (crv, start) = decode_continue(c).ok_or_else(|| ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
        if crv < st.store.floor() {
            return Err(ApiError::expired(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
            ));
        }
        list_rv = crv;
        start_after = Some(start);
    }
    fn key(o: &Value) -> String {
        format!(
            "{}/{}\u{0}",
            o["metadata"]["namespace"].as_str().unwrap_or_default(),
            o["metadata"]["name"].as_str().unwrap_or_default()
        )
    }
    let mut sel: Vec<Arc<Value>> = match &start_after {
        Some(s) => items
            .into_iter()
            .filter(|o| key(o).as_str() > s.as_str())
            .collect(),
        None => items,
    };
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if limit > 0 && sel.len() > limit {
        let remaining = sel.len() - limit;
        sel.truncate(limit);
        if let Some(last) = sel.last() {
            meta["continue"] = json!(encode_continue(
                list_rv,
                last["metadata"]["namespace"].as_str().unwrap_or_default(),
                last["metadata"]["name"].as_str().unwrap_or_default()
            ));
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    let body = match pres {
        Presentation::Table => {
            let objs: Vec<Value> = sel.iter().map(|o| present(&t.def, o)).collect();
            discovery::table(&t.def, &objs, meta)
        }
        Presentation::Metadata => json!({
            "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
            "items": sel.iter().map(|o| json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]})).collect::<Vec<_>>()
        }),
        Presentation::Full => json!({
            "kind": t.def.list_kind(), "apiVersion": t.def.api_version(), "metadata": meta,
            "items": sel.iter().map(|o| present(&t.def, o)).collect::<Vec<_>>()
        }),
    };
    Ok(json_response(StatusCode::OK, &body))
}

struct WatchFilter {
    ns: Option<String>,
    name: Option<String>,
    ls: LabelSelector,
    fs: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, o: &Value) -> bool {
        self.ns
            .as_deref()
            .is_none_or(|ns| o["metadata"]["namespace"].as_str() == Some(ns))
            && self
                .name
                .as_deref()
                .is_none_or(|n| o["metadata"]["name"].as_str() == Some(n))
            && self.ls.matches_object(o)
            && self.fs.matches(o)
    }
}

fn watch_line(def: &ResourceDef, ty: &str, obj: &Value, pres: Presentation) -> Bytes {
    let object = match pres {
        Presentation::Table => discovery::table(
            def,
            &[present(def, obj)],
            json!({"resourceVersion": obj["metadata"]["resourceVersion"]}),
        ),
        other => present_one(def, obj, other),
    };
    let mut v = serde_json::to_vec(&json!({"type": ty, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn bookmark_line(def: &ResourceDef, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": meta});
    let mut v = serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn error_line(e: &ApiError) -> Bytes {
    let mut v =
        serde_json::to_vec(&json!({"type": "ERROR", "object": e.to_status()})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn stream_response(rx: futures::channel::mpsc::Receiver<Bytes>) -> Response<Body> {
    let stream = rx.map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache, private"),
    );
    r
}

fn watch(
    st: &Arc<State>,
    t: &Target,
    q: &HashMap<String, String>,
    pres: Presentation,
) -> ApiResult<Response<Body>> {
    let (ls, fs) = selectors(t, q)?;
    let filter = WatchFilter {
        ns: ns_filter(t).map(str::to_string),
        name: if t.name.is_empty() {
            None
        } else {
            Some(t.name.clone())
        },
        ls,
        fs,
    };
    let rv_param = q
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    let send_initial = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs);
    let from = match rv_param {
        "" | "0" => None,
        s => Some(store::parse_rv(s).ok_or_else(|| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: \"{s}\": must be a non-negative integer"
            ))
        })?),
    };
    let (mut tx, rx) = futures::channel::mpsc::channel::<Bytes>(256);
    let def = t.def.clone();
    let storage = def.storage.clone();
    let (initial, sub) = if from.is_none() || send_initial {
        let (items, sub) = st
            .store
            .subscribe_with_snapshot(&storage, filter.ns.as_deref());
        (items, Ok(sub))
    } else {
        (Vec::new(), st.store.subscribe(from))
    };
    let mut shutdown = st.shutdown.clone();
    let bookmark_interval = st.settings.bookmark_interval;
    let state = st.clone();
    tokio::spawn(async move {
        let mut sub = match sub {
            Ok(s) => s,
            Err(StoreError::Expired { requested, floor }) => {
                state.expired_watches.fetch_add(1, Ordering::Relaxed);
                let _ = tx
                    .send(error_line(&ApiError::expired(format!(
                        "too old resource version: {requested} ({floor})"
                    ))))
                    .await;
                return;
            }
            Err(_) => return,
        };
        let mut last_rv = sub.rv;
        for o in &initial {
            if filter.matches(o) && tx.send(watch_line(&def, "ADDED", o, pres)).await.is_err() {
                return;
            }
        }
        if send_initial && tx.send(bookmark_line(&def, last_rv, true)).await.is_err() {
            return;
        }
        let backlog = std::mem::take(&mut sub.backlog);
        for ch in backlog {
            last_rv = last_rv.max(ch.rv);
            if let Some(line) = change_line(&def, &storage, &filter, &ch, pres)
                && tx.send(line).await.is_err()
            {
                return;
            }
        }
        let deadline =
            tokio::time::Instant::now() + timeout.unwrap_or(Duration::from_secs(86400 * 365));
        let mut tick = tokio::time::interval(bookmark_interval);
        tick.tick().await;
        loop {
            tokio::select! {
                r = sub.rx.recv() => match r {
                    Ok(ch) => {
                        last_rv = last_rv.max(ch.rv);
                        if let Some(line) = change_line(&def, &storage, &filter, &ch, pres)
                            && tx.send(line).await.is_err()
                        {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::info!(lagged = n, "watcher fell behind; closing its stream");
                        return;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick() => {
                    if tx.is_closed() {
                        return;
                    }
                    if bookmarks && tx.send(bookmark_line(&def, last_rv, false)).await.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return,
                _ = shutdown.changed() => return,
            }
        }
    });
    Ok(stream_response(rx))
}

fn change_line(
    def: &ResourceDef,
    storage: &str,
    f: &WatchFilter,
    ch: &store::Change,
    pres: Presentation,
) -> Option<Bytes> {
    if ch.storage != storage {
        return None;
    }
    let new_match = f.matches(&ch.obj);
    let old_match = ch.old.as_ref().is_some_and(|o| f.matches(o));
    let ty = match ch.kind {
        ChangeType::Added if new_match => "ADDED",
        ChangeType::Deleted if old_match || new_match => "DELETED",
        ChangeType::Modified if new_match && old_match => "MODIFIED",
        ChangeType::Modified if new_match => "ADDED",
        ChangeType::Modified if old_match => "DELETED",
        _ => return None,
    };
    Some(watch_line(def, ty, &ch.obj, pres))
}

// ---------------------------------------------------------------------------------------------
// writes

fn random_suffix() -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let id = uuid::Uuid::new_v4();
    id.as_bytes()
        .iter()
        .take(5)
        .map(|b| ALPHA[(*b as usize) % ALPHA.len()] as char)
        .collect()
}

fn fill_create_metadata(mut obj: Value) -> Value {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        m.insert("creationTimestamp".into(), json!(timeutil::now_rfc3339()));
        m.remove("resourceVersion");
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        m.remove("managedFields");
        m.remove("selfLink");
    }
    if obj.get("spec").is_some()
        && let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut)
    {
        m.insert("generation".into(), json!(1));
    }
    obj
}

fn namespace_defaults(mut obj: Value) -> Value {
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        let labels = m.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
    }
    obj["spec"] = json!({"finalizers": ["kubernetes"]});
    obj["status"] = json!({"phase": "Active"});
    obj
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        })
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

fn validate_meta(def: &ResourceDef, obj: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let path_segment_kinds = def.group == "rbac.authorization.k8s.io"
        || def.kind == "CertificateSigningRequest"
        || def.storage == "/events";
    let ok = if path_segment_kinds {
        !name.is_empty()
            && name != "."
            && name != ".."
            && !name.contains('/')
            && !name.contains('%')
    } else if matches!(def.kind.as_str(), "Namespace" | "Service") && def.group.is_empty() {
        is_dns_label(name)
    } else {
        is_dns_subdomain(name)
    };
    if !ok {
        let what = if matches!(def.kind.as_str(), "Namespace" | "Service") && def.group.is_empty() {
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
        } else {
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        };
        errs.push((
            "metadata.name".into(),
            format!("Invalid value: \"{name}\": {what}"),
        ));
    }
    if let Some(l) = obj["metadata"]["labels"].as_object() {
        for (k, v) in l {
            if !selector::valid_label_key(k) {
                errs.push(("metadata.labels".into(), format!("Invalid value: \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")));
            }
            match v.as_str() {
                Some(s) if selector::valid_label_value(s) => {}
                _ => errs.push(("metadata.labels".into(), format!("Invalid value: {v}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"))),
            }
        }
    } else if !obj["metadata"]["labels"].is_null() {
        errs.push((
            "metadata.labels".into(),
            "Invalid value: must be a map of strings".into(),
        ));
    }
    if let Some(a) = obj["metadata"]["annotations"].as_object() {
        for (k, v) in a {
            if !selector::valid_label_key(k) {
                errs.push(("metadata.annotations".into(), format!("Invalid value: \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.'")));
            }
            if !v.is_string() {
                errs.push((
                    "metadata.annotations".into(),
                    format!("Invalid value: {v}: annotation values must be strings"),
                ));
            }
        }
    } else if !obj["metadata"]["annotations"].is_null() {
        errs.push((
            "metadata.annotations".into(),
            "Invalid value: must be a map of strings".into(),
        ));
    }
    errs
}

fn invalid(def: &ResourceDef, obj: &Value, causes: Vec<(String, String)>) -> ApiError {
    ApiError::invalid(
        &def.kind,
        &def.group,
        obj["metadata"]["name"].as_str().unwrap_or_default(),
        causes,
    )
}

/// Kind-specific validation shared by create and update; may rewrite the object (pruning).
fn validate_object(
    st: &State,
    def: &ResourceDef,
    obj: &mut Value,
    old: Option<&Value>,
) -> ApiResult<()> {
    let mut causes = validate_meta(def, obj);
    if let Some(crd) = &def.crd
        && let Some(schema) = &crd.schema
    {
        causes.extend(schema::validate_object(schema, obj, old));
    }
    match (def.group.as_str(), def.kind.as_str()) {
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            causes.extend(validate_crd(st, obj))
        }
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => {
            causes.extend(admission::validate_configuration(obj))
        }
        ("certificates.k8s.io", _) => causes.extend(validate_csr(st, obj)),
        ("", "Service") => {}
        ("rbac.authorization.k8s.io", k)
            if k.ends_with("Binding")
                && obj["roleRef"]["name"].as_str().is_none_or(str::is_empty) =>
        {
            causes.push(("roleRef.name".into(), "Required value".into()));
        }
        _ => {}
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(invalid(def, obj, causes))
    }
}

fn validate_crd(st: &State, obj: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let spec = &obj["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let plural = spec["names"]["plural"].as_str().unwrap_or_default();
    if group.is_empty() || !group.contains('.') {
        errs.push((
            "spec.group".into(),
            format!("Invalid value: \"{group}\": should be a domain with at least one dot"),
        ));
    }
    if plural.is_empty() {
        errs.push(("spec.names.plural".into(), "Required value".into()));
    }
    if spec["names"]["kind"].as_str().is_none_or(str::is_empty) {
        errs.push(("spec.names.kind".into(), "Required value".into()));
    }
    if !matches!(spec["scope"].as_str(), Some("Namespaced" | "Cluster")) {
        errs.push((
            "spec.scope".into(),
            "Unsupported value: must be Namespaced or Cluster".into(),
        ));
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    if name != format!("{plural}.{group}") {
        errs.push((
            "metadata.name".into(),
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions
        .iter()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .count()
        != 1
    {
        errs.push((
            "spec.versions".into(),
            "Invalid value: must have exactly one version marked as storage version".into(),
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        if v["schema"]["openAPIV3Schema"].is_null() {
            errs.push((
                format!("spec.versions[{i}].schema.openAPIV3Schema"),
                "Required value: schemas are required".into(),
            ));
        }
    }
    // A built-in kind may not be shadowed.
    if st
        .defs()
        .iter()
        .any(|d| d.crd.is_none() && d.group == group && d.plural == plural)
    {
        errs.push((
            "spec.group".into(),
            format!("Invalid value: \"{group}\": conflicts with a built-in API"),
        ));
    }
    errs
}

fn csr_request_pem(obj: &Value) -> Result<String, String> {
    let b64 = obj["spec"]["request"].as_str().ok_or("Required value")?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("Invalid value: not base64: {e}"))?;
    String::from_utf8(raw)
        .map_err(|_| "Invalid value: PEM block type must be CERTIFICATE REQUEST".to_string())
}

fn validate_csr(st: &State, obj: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    match csr_request_pem(obj)
        .and_then(|p| crate::pki::csr_subject(&p).map_err(|e| format!("Invalid value: {e}")))
    {
        Ok(_) => {}
        Err(e) => errs.push(("spec.request".into(), e)),
    }
    if obj["spec"]["signerName"].as_str().is_none_or(str::is_empty) {
        errs.push(("spec.signerName".into(), "Required value".into()));
    }
    if obj["spec"]["usages"]
        .as_array()
        .is_none_or(|a| a.is_empty())
    {
        errs.push(("spec.usages".into(), "Required value".into()));
    }
    if let Some(e) = obj["spec"]["expirationSeconds"].as_i64()
        && e < st.settings.min_csr_expiration_seconds as i64
    {
        errs.push((
            "spec.expirationSeconds".into(),
            format!(
                "Invalid value: {e}: may not specify a duration less than {} seconds",
                st.settings.min_csr_expiration_seconds
            ),
        ));
    }
    let conds = obj["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let has = |t: &str| conds.iter().any(|c| c["type"] == t);
    if has("Approved") && has("Denied") {
        errs.push((
            "status.conditions".into(),
            "Invalid value: Approved and Denied conditions are mutually exclusive".into(),
        ));
    }
    for c in &conds {
        if !matches!(c["type"].as_str(), Some("Approved" | "Denied" | "Failed")) {
            errs.push((
                "status.conditions[].type".into(),
                format!("Unsupported value: {}", c["type"]),
            ));
        }
        if c["status"].as_str() != Some("True")
            && matches!(c["type"].as_str(), Some("Approved" | "Denied"))
        {
            errs.push((
                "status.conditions[].status".into(),
                "Unsupported value: must be \"True\"".into(),
            ));
        }
    }
    errs
}

fn allocate_cluster_ip(st: &State) -> ApiResult<String> {
    let (svcs, _) = st.store.list("/services", None);
    let mut used: HashSet<Ipv4Addr> = svcs
        .iter()
        .filter_map(|s| s["spec"]["clusterIP"].as_str()?.parse().ok())
        .collect();
    let mut reserved = st.reserved_ips.lock().unwrap_or_else(|p| p.into_inner());
    used.extend(reserved.iter().copied());
    for ip in st.settings.service_cidr.hosts().skip(9) {
        if !used.contains(&ip) {
            reserved.insert(ip);
            return Ok(ip.to_string());
        }
    }
    Err(ApiError::internal(
        "failed to allocate a serviceIP: range is full",
    ))
}

fn prepare_create(
    st: &State,
    user: &UserInfo,
    def: &ResourceDef,
    mut obj: Value,
) -> ApiResult<Value> {
    obj = fill_create_metadata(obj);
    if def.status != StatusStrategy::None
        && def.is_custom()
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
    match (def.group.as_str(), def.kind.as_str()) {
        ("", "Namespace") => obj = namespace_defaults(obj),
        ("", "Pod") => {
            obj["status"] = json!({"phase": "Pending"});
        }
        ("", "Service") => {
            if obj["spec"].is_null() {
                obj["spec"] = json!({});
            }
            let ty = obj["spec"]["type"]
                .as_str()
                .unwrap_or("ClusterIP")
                .to_string();
            obj["spec"]["type"] = json!(ty);
            if obj["spec"]["sessionAffinity"].is_null() {
                obj["spec"]["sessionAffinity"] = json!("None");
            }
            if ty != "ExternalName" {
                let ip = match obj["spec"]["clusterIP"].as_str().filter(|s| !s.is_empty()) {
                    Some("None") => "None".to_string(),
                    Some(ip) => {
                        let parsed: Ipv4Addr = ip.parse().map_err(|_| {
                            invalid(
                                def,
                                &obj,
                                vec![(
                                    "spec.clusterIPs".into(),
                                    format!("Invalid value: \"{ip}\": must be a valid IP address"),
                                )],
                            )
                        })?;
                        let (svcs, _) = st.store.list("/services", None);
                        if svcs
                            .iter()
                            .any(|s| s["spec"]["clusterIP"].as_str() == Some(ip))
                        {
                            return Err(invalid(
                                def,
                                &obj,
                                vec![(
                                    "spec.clusterIPs".into(),
                                    format!(
                                        "Invalid value: [\"{ip}\"]: failed to allocate IP {ip}: provided IP is already allocated"
                                    ),
                                )],
                            ));
                        }
                        st.reserved_ips
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(parsed);
                        ip.to_string()
                    }
                    None => allocate_cluster_ip(st)?,
                };
                obj["spec"]["clusterIP"] = json!(ip);
                obj["spec"]["clusterIPs"] = json!([ip]);
                if ip != "None" {
                    obj["spec"]["ipFamilies"] = json!(["IPv4"]);
                    obj["spec"]["ipFamilyPolicy"] = json!("SingleStack");
                }
            }
            obj["status"] = json!({"loadBalancer": {}});
        }
        ("certificates.k8s.io", _) => {
            obj["spec"]["username"] = json!(user.username);
            obj["spec"]["groups"] = json!(user.groups);
            obj["spec"]["uid"] = json!("");
            if let Some(s) = obj["spec"].as_object_mut() {
                s.remove("extra");
                s.remove("uid");
            }
            obj["status"] = json!({});
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            obj["status"] = json!({
                "acceptedNames": obj["spec"]["names"],
                "storedVersions": obj["spec"]["versions"].as_array().into_iter().flatten().filter(|v| v["storage"].as_bool() == Some(true)).map(|v| v["name"].clone()).collect::<Vec<_>>(),
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": timeutil::now_rfc3339()},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": timeutil::now_rfc3339()}
                ]
            });
        }
        ("", "Event") if obj["firstTimestamp"].is_null() && obj["eventTime"].is_null() => {
            obj["firstTimestamp"] = json!(timeutil::now_rfc3339());
            obj["lastTimestamp"] = obj["firstTimestamp"].clone();
        }
        _ => {}
    }
    Ok(obj)
}

async fn admit(
    st: &State,
    user: &UserInfo,
    t: &Target,
    op: &str,
    obj: Option<&Value>,
    old: Option<&Value>,
    dry_run: bool,
) -> ApiResult<()> {
    if t.sub == "approval" {
        let signer = old
            .and_then(|o| o["spec"]["signerName"].as_str())
            .unwrap_or_default();
        if !approval_allowed(st, user, signer) {
            return Err(ApiError::forbidden(format!(
                "certificatesigningrequests.certificates.k8s.io \"{}\" is forbidden: user not permitted to approve requests with signerName \"{signer}\"",
                t.name
            )));
        }
    }
    let obj_p = obj.map(|o| present(&t.def, o));
    let old_p = old.map(|o| present(&t.def, o));
    let req = admission::Request {
        operation: op,
        def: &t.def,
        subresource: &t.sub,
        namespace: &t.namespace,
        name: &t.name,
        object: obj_p.as_ref(),
        old_object: old_p.as_ref(),
        user,
        dry_run,
    };
    admission::node_restriction(&req)?;
    admission::run_webhooks(&st.store, &req).await
}

async fn create(
    st: &Arc<State>,
    user: &UserInfo,
    t: &Target,
    obj: Value,
    dry_run: bool,
) -> ApiResult<(StatusCode, Value)> {
    let mut obj = to_storage_form(&t.def, obj);
    check_kind(&t.def, &obj)?;
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    if t.def.namespaced {
        match obj["metadata"]["namespace"].as_str() {
            Some(ns) if !ns.is_empty() && ns != t.namespace => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => obj["metadata"]["namespace"] = json!(t.namespace),
        }
        if st.store.get("/namespaces", "", &t.namespace).is_none() {
            return Err(ApiError::not_found("namespaces", "", &t.namespace));
        }
    } else if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    if obj["metadata"]["name"].as_str().is_none_or(str::is_empty) {
        match obj["metadata"]["generateName"]
            .as_str()
            .filter(|s| !s.is_empty())
        {
            Some(prefix) => obj["metadata"]["name"] = json!(format!("{prefix}{}", random_suffix())),
            None => {
                return Err(invalid(
                    &t.def,
                    &obj,
                    vec![(
                        "metadata.name".into(),
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            }
        }
    }
    if let Some(m) = obj.as_object_mut() {
        m.insert(
            "apiVersion".into(),
            json!(if t.def.storage == "/events" {
                "v1".to_string()
            } else {
                t.def.api_version()
            }),
        );
        m.insert("kind".into(), json!(t.def.kind));
    }
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let t = Target {
        def: t.def.clone(),
        namespace: t.namespace.clone(),
        name: name.clone(),
        sub: String::new(),
        watch_path: false,
    };
    let mut obj = prepare_create(st, user, &t.def, obj)?;
    validate_object(st, &t.def, &mut obj, None)?;
    if st.store.get(&t.def.storage, &t.namespace, &name).is_some() {
        return Err(ApiError::already_exists(&t.def.plural, &t.def.group, &name));
    }
    admit(st, user, &t, "CREATE", Some(&obj), None, dry_run).await?;
    if dry_run {
        return Ok((StatusCode::CREATED, obj));
    }
    let created = st.store.create(&t.def.storage, obj).map_err(|e| match e {
        StoreError::AlreadyExists => ApiError::already_exists(&t.def.plural, &t.def.group, &name),
        other => ApiError::internal(other.to_string()),
    })?;
    after_commit(st, &t.def, None, &created).await;
    Ok((StatusCode::CREATED, (*created).clone()))
}

/// Apply the subresource strategy and keep immutable metadata.
fn finish_update(def: &ResourceDef, sub: &str, cur: &Value, cand: Value) -> ApiResult<Value> {
    let mut new = match (sub, def.status) {
        ("status", StatusStrategy::MetadataAndStatus) => {
            let mut n = cand;
            n["spec"] = cur["spec"].clone();
            if cur.get("spec").is_none()
                && let Some(m) = n.as_object_mut()
            {
                m.remove("spec");
            }
            n
        }
        ("status", _) => {
            let mut n = cur.clone();
            n["status"] = cand.get("status").cloned().unwrap_or(Value::Null);
            if n["status"].is_null()
                && let Some(m) = n.as_object_mut()
            {
                m.remove("status");
            }
            n
        }
        ("approval", _) => {
            let mut n = cur.clone();
            if n["status"].is_null() {
                n["status"] = json!({});
            }
            n["status"]["conditions"] = cand["status"]["conditions"].clone();
            n
        }
        (_, StatusStrategy::None) => cand,
        (_, _) => {
            let mut n = cand;
            match cur.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(m) = n.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            if def.kind == "CertificateSigningRequest" {
                n["spec"] = cur["spec"].clone();
            }
            n
        }
    };
    if !new.is_object() {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized: not a JSON object",
        ));
    }
    if !new["metadata"].is_object() {
        new["metadata"] = json!({});
    }
    for k in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match cur["metadata"].get(k) {
            Some(v) => new["metadata"][k] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(k);
                }
            }
        }
    }
    if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("managedFields");
        m.remove("selfLink");
        m.insert(
            "resourceVersion".into(),
            cur["metadata"]["resourceVersion"].clone(),
        );
    }
    if let Some(m) = new.as_object_mut() {
        m.insert("apiVersion".into(), cur["apiVersion"].clone());
        m.insert("kind".into(), cur["kind"].clone());
    }
    if new.get("spec") != cur.get("spec") && cur["metadata"].get("generation").is_some() {
        let g = cur["metadata"]["generation"].as_i64().unwrap_or(1);
        new["metadata"]["generation"] = json!(g + 1);
    }
    Ok(new)
}

async fn update<F>(
    st: &Arc<State>,
    user: &UserInfo,
    t: &Target,
    dry_run: bool,
    compute: F,
) -> ApiResult<Value>
where
    F: Fn(&Value) -> ApiResult<(Value, Option<u64>)>,
{
    for _ in 0..16 {
        let cur = st
            .store
            .get(&t.def.storage, &t.namespace, &t.name)
            .ok_or_else(|| not_found(t))?;
        let cur_rv = store::rv_of(&cur);
        let (cand, client_rv) = compute(&cur)?;
        check_shape(&cand)?;
        if client_rv.is_some_and(|rv| rv != cur_rv) {
            return Err(ApiError::conflict(&t.def.plural, &t.def.group, &t.name));
        }
        let mut new = finish_update(&t.def, &t.sub, &cur, cand)?;
        validate_object(st, &t.def, &mut new, Some(&cur))?;
        if t.def.group.is_empty()
            && t.def.kind == "Service"
            && new["spec"]["clusterIP"] != cur["spec"]["clusterIP"]
            && !cur["spec"]["clusterIP"].is_null()
        {
            return Err(invalid(
                &t.def,
                &new,
                vec![(
                    "spec.clusterIPs[0]".into(),
                    "Invalid value: field is immutable".into(),
                )],
            ));
        }
        if new == *cur {
            return Ok((*cur).clone());
        }
        admit(st, user, t, "UPDATE", Some(&new), Some(&cur), dry_run).await?;
        if dry_run {
            return Ok(new);
        }
        let finalize = !new["metadata"]["deletionTimestamp"].is_null()
            && new["metadata"]["finalizers"]
                .as_array()
                .is_none_or(|f| f.is_empty());
        match st.store.update(&t.def.storage, cur_rv, new) {
            Ok(o) => {
                if finalize {
                    let _ = st.store.delete(
                        &t.def.storage,
                        &t.namespace,
                        &t.name,
                        Some(store::rv_of(&o)),
                    );
                    after_delete(st, &t.def, &o);
                }
                after_commit(st, &t.def, Some(&cur), &o).await;
                return Ok((*o).clone());
            }
            Err(StoreError::Conflict) if client_rv.is_none() => continue,
            Err(StoreError::Conflict) => {
                return Err(ApiError::conflict(&t.def.plural, &t.def.group, &t.name));
            }
            Err(StoreError::NotFound) => return Err(not_found(t)),
            Err(e) => return Err(ApiError::internal(e.to_string())),
        }
    }
    Err(ApiError::conflict(&t.def.plural, &t.def.group, &t.name))
}

async fn patch_request(
    st: &Arc<State>,
    user: &UserInfo,
    t: &Target,
    ty: PatchType,
    body: &[u8],
    dry_run: bool,
    q: &HashMap<String, String>,
) -> ApiResult<Response<Body>> {
    if ty == PatchType::Apply
        && t.sub.is_empty()
        && st
            .store
            .get(&t.def.storage, &t.namespace, &t.name)
            .is_none()
    {
        // Server-side apply of a missing object creates it.
        let obj =
            patch::parse_yaml_or_json(body).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let mut obj = obj;
        check_shape(&obj)?;
        if obj["metadata"]["name"].is_null() {
            obj["metadata"]["name"] = json!(t.name);
        }
        let (_, created) = create(st, user, t, obj, dry_run).await?;
        return Ok(json_response(
            StatusCode::CREATED,
            &present(&t.def, &created),
        ));
    }
    if ty == PatchType::Apply && q.get("fieldManager").is_none_or(|f| f.is_empty()) {
        return Err(ApiError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    let custom = t.def.is_custom();
    let is_events_v1 = t.def.group == "events.k8s.io";
    let def = t.def.clone();
    let out = update(st, user, t, dry_run, |cur| {
        let base = if is_events_v1 {
            present(&def, cur)
        } else {
            cur.clone()
        };
        let patched = patch::apply(ty, &base, body, custom).map_err(|e| match e {
            patch::PatchError::Malformed(m) => ApiError::bad_request(m),
            patch::PatchError::Failed(m) => ApiError::custom(422, "Invalid", m),
        })?;
        let patched = if is_events_v1 {
            event_from_v1(&patched)
        } else {
            patched
        };
        // A patch that sets another resourceVersion is a failed precondition.
        let rv = patched["metadata"]["resourceVersion"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(|s| store::parse_rv(s).unwrap_or(u64::MAX));
        if rv.is_some_and(|r| r != store::rv_of(cur)) {
            return Err(ApiError::conflict(
                &def.plural,
                &def.group,
                cur["metadata"]["name"].as_str().unwrap_or_default(),
            ));
        }
        Ok((patched, None))
    })
    .await?;
    Ok(json_response(StatusCode::OK, &present(&t.def, &out)))
}

async fn delete(
    st: &Arc<State>,
    user: &UserInfo,
    t: &Target,
    opts: &Value,
    dry_run: bool,
) -> ApiResult<Value> {
    let cur = st
        .store
        .get(&t.def.storage, &t.namespace, &t.name)
        .ok_or_else(|| not_found(t))?;
    if let Some(rv) = opts["preconditions"]["resourceVersion"].as_str()
        && store::parse_rv(rv) != Some(store::rv_of(&cur))
    {
        return Err(ApiError::conflict(&t.def.plural, &t.def.group, &t.name));
    }
    if let Some(uid) = opts["preconditions"]["uid"].as_str()
        && cur["metadata"]["uid"].as_str() != Some(uid)
    {
        return Err(ApiError::conflict(&t.def.plural, &t.def.group, &t.name));
    }
    admit(st, user, t, "DELETE", None, Some(&cur), dry_run).await?;
    if dry_run {
        return Ok((*cur).clone());
    }
    let has_finalizers = cur["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    let is_ns = t.def.group.is_empty() && t.def.kind == "Namespace";
    if has_finalizers && !is_ns {
        if !cur["metadata"]["deletionTimestamp"].is_null() {
            return Ok((*cur).clone());
        }
        let mut new = (*cur).clone();
        new["metadata"]["deletionTimestamp"] = json!(timeutil::now_rfc3339());
        new["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        return match st.store.update(&t.def.storage, store::rv_of(&cur), new) {
            Ok(o) => Ok((*o).clone()),
            Err(_) => Err(ApiError::conflict(&t.def.plural, &t.def.group, &t.name)),
        };
    }
    let gone = st
        .store
        .delete(&t.def.storage, &t.namespace, &t.name, None)
        .map_err(|_| not_found(t))?;
    after_delete(st, &t.def, &gone);
    Ok((*gone).clone())
}

fn after_delete(st: &State, def: &ResourceDef, obj: &Value) {
    match (def.group.as_str(), def.kind.as_str()) {
        ("", "Namespace") => {
            let ns = obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let mut storages: Vec<String> = st
                .defs()
                .iter()
                .filter(|d| d.namespaced)
                .map(|d| d.storage.clone())
                .collect();
            storages.sort();
            storages.dedup();
            for s in storages {
                let (items, _) = st.store.list(&s, Some(&ns));
                for it in items {
                    let _ = st.store.delete(
                        &s,
                        &ns,
                        it["metadata"]["name"].as_str().unwrap_or_default(),
                        None,
                    );
                }
            }
        }
        ("", "Service") => {
            if let Some(ip) = obj["spec"]["clusterIP"]
                .as_str()
                .and_then(|s| s.parse::<Ipv4Addr>().ok())
            {
                st.reserved_ips
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&ip);
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            let storage = format!(
                "{}/{}",
                obj["spec"]["group"].as_str().unwrap_or_default(),
                obj["spec"]["names"]["plural"].as_str().unwrap_or_default()
            );
            let (items, _) = st.store.list(&storage, None);
            for it in items {
                let _ = st.store.delete(
                    &storage,
                    it["metadata"]["namespace"].as_str().unwrap_or_default(),
                    it["metadata"]["name"].as_str().unwrap_or_default(),
                    None,
                );
            }
            st.refresh_defs();
        }
        _ => {}
    }
}

async fn after_commit(st: &Arc<State>, def: &ResourceDef, old: Option<&Value>, new: &Value) {
    match (def.group.as_str(), def.kind.as_str()) {
        ("apiextensions.k8s.io", "CustomResourceDefinition") => st.refresh_defs(),
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            let approved = |o: &Value| {
                o["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Approved" && c["status"] == "True")
                })
            };
            let was = old.is_some_and(approved);
            if approved(new) && !was && new["status"]["certificate"].is_null() {
                sign_csr(st, new);
            }
        }
        _ => {}
    }
}

/// The kube-apiserver-client signer: sign an approved CSR with the sandbox CA.
fn sign_csr(st: &State, csr: &Value) {
    let signer = csr["spec"]["signerName"].as_str().unwrap_or_default();
    if !matches!(
        signer,
        "kubernetes.io/kube-apiserver-client" | "kubernetes.io/kube-apiserver-client-kubelet"
    ) {
        return;
    }
    let name = csr["metadata"]["name"].as_str().unwrap_or_default();
    let lifetime = csr["spec"]["expirationSeconds"]
        .as_i64()
        .unwrap_or(365 * 86400)
        .max(1);
    let result = csr_request_pem(csr)
        .map_err(|e| e.to_string())
        .and_then(|p| {
            st.ca
                .sign_client_csr(&p, time::Duration::seconds(lifetime))
                .map_err(|e| e.to_string())
        });
    for _ in 0..8 {
        let Some(cur) = st
            .store
            .get("certificates.k8s.io/certificatesigningrequests", "", name)
        else {
            return;
        };
        let mut new = (*cur).clone();
        match &result {
            Ok(pem) => {
                new["status"]["certificate"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(pem))
            }
            Err(e) => {
                let conds = new["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let mut conds = conds;
                conds.push(json!({"type": "Failed", "status": "True", "reason": "SignerValidationFailure", "message": e, "lastUpdateTime": timeutil::now_rfc3339(), "lastTransitionTime": timeutil::now_rfc3339()}));
                new["status"]["conditions"] = json!(conds);
            }
        }
        if st
            .store
            .update(
                "certificates.k8s.io/certificatesigningrequests",
                store::rv_of(&cur),
                new,
            )
            .is_ok()
        {
            return;
        }
    }
}

/// Checks the approval subresource needs beyond RBAC on `certificatesigningrequests/approval`.
pub fn approval_allowed(st: &State, user: &UserInfo, signer: &str) -> bool {
    let domain_wildcard = signer
        .split_once('/')
        .map(|(d, _)| format!("{d}/*"))
        .unwrap_or_default();
    [signer, domain_wildcard.as_str()].iter().any(|name| {
        authz::allowed(
            &st.store,
            user,
            &Attributes {
                verb: "approve",
                group: "certificates.k8s.io",
                resource: "signers",
                subresource: "",
                namespace: "",
                name,
            },
        )
    })
}

/// Periodic clean-up: approved/denied CSRs after an hour, pending ones after a day, Events after an hour.
pub fn garbage_collect(st: &State) {
    let now = time::OffsetDateTime::now_utc();
    let age = |o: &Value| {
        o["metadata"]["creationTimestamp"]
            .as_str()
            .and_then(timeutil::parse_rfc3339)
            .map(|t| (now - t).whole_seconds())
            .unwrap_or(0)
    };
    let (csrs, _) = st
        .store
        .list("certificates.k8s.io/certificatesigningrequests", None);
    for c in csrs {
        let decided = c["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| !cs.is_empty());
        let ttl = if decided { 3600 } else { 86400 };
        if age(&c) > ttl {
            let _ = st.store.delete(
                "certificates.k8s.io/certificatesigningrequests",
                "",
                c["metadata"]["name"].as_str().unwrap_or_default(),
                None,
            );
        }
    }
    let (events, _) = st.store.list("/events", None);
    for e in events {
        if age(&e) > 3600 {
            let _ = st.store.delete(
                "/events",
                e["metadata"]["namespace"].as_str().unwrap_or_default(),
                e["metadata"]["name"].as_str().unwrap_or_default(),
                None,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = parse_query(Some(
            "labelSelector=a%3Db%2Cc+in+%28x%29&watch=1&bad=%zz&tail=%4",
        ));
        assert_eq!(q["labelSelector"], "a=b,c in (x)");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["bad"], "%zz");
        assert_eq!(q["tail"], "%4");
    }

    #[test]
    fn garbage_collection_expires_decided_csrs_and_old_events() {
        let dir = tempfile::tempdir().expect("tmp");
        let ca = Ca::load_or_create(dir.path()).expect("ca");
        let (_tx, rx) = tokio::sync::watch::channel(false);
        let settings = Settings {
            service_cidr: "10.96.0.0/16".parse().expect("cidr"),
            min_csr_expiration_seconds: 600,
            bookmark_interval: Duration::from_secs(5),
            max_body_bytes: 1 << 20,
            server_addr: "127.0.0.1:1".into(),
        };
        let st = State::new(Store::open(None, 100).expect("store"), ca, settings, rx);
        let old = "2020-01-01T00:00:00Z";
        let now = timeutil::now_rfc3339();
        let csr = |name: &str, ts: &str, decided: bool| {
            let conds = if decided {
                json!([{"type": "Approved", "status": "True"}])
            } else {
                json!([])
            };
            json!({"metadata": {"name": name, "creationTimestamp": ts}, "status": {"conditions": conds}})
        };
        let s = "certificates.k8s.io/certificatesigningrequests";
        st.store
            .create(s, csr("old-approved", old, true))
            .expect("csr");
        st.store
            .create(s, csr("old-pending", old, false))
            .expect("csr");
        st.store
            .create(s, csr("new-approved", &now, true))
            .expect("csr");
        st.store.create("/events", json!({"metadata": {"name": "e1", "namespace": "default", "creationTimestamp": old}})).expect("ev");
        st.store.create("/events", json!({"metadata": {"name": "e2", "namespace": "default", "creationTimestamp": now}})).expect("ev");
        garbage_collect(&st);
        let names = |storage: &str| -> Vec<String> {
            st.store
                .list(storage, None)
                .0
                .iter()
                .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
                .collect()
        };
        assert_eq!(names(s), vec!["new-approved".to_string()]);
        assert_eq!(names("/events"), vec!["e2".to_string()]);
    }

    #[test]
    fn continue_tokens() {
        let c = encode_continue(42, "ns", "n");
        assert_eq!(decode_continue(&c), Some((42, "ns/n\u{0}".to_string())));
        assert_eq!(decode_continue("garbage!"), None);
    }
}
