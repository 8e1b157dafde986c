//! Routing: which resource, namespace, name and subresource a path names, the query, and the
//! verb a request counts as.

use super::*;

/// A request's query parameters, percent-decoded, each with every value it was given in order.
pub(crate) struct Query(BTreeMap<String, Vec<String>>);

impl Query {
    pub(crate) fn parse(q: Option<&str>) -> Self {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            m.entry(decode(k)).or_default().push(decode(v));
        }
        Query(m)
    }
    /// A parameter's first value, as kube-apiserver reads a single-valued option given twice
    /// (`?limit=1&limit=abc` lists one object there).
    pub(crate) fn get(&self, k: &str) -> Option<&str> {
        self.0
            .get(k)
            .and_then(|values| values.first())
            .map(String::as_str)
    }
    /// Every value of a list-valued parameter (`dryRun`), in the order given.
    pub(crate) fn all(&self, k: &str) -> &[String] {
        self.0.get(k).map(Vec::as_slice).unwrap_or_default()
    }
    pub(crate) fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
}

/// Percent- and plus-decoding of one query component (invalid escapes stay as they are).
pub(crate) fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A resolved resource path.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) rt: std::sync::Arc<ResourceType>,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

/// What a path is.
pub(crate) enum Route {
    Version,
    ApiVersions,
    ApiGroups,
    Resources(String, String),
    Object(Box<Target>),
    Metrics,
    Health,
    Faults,
    OpenApiRoot,
    OpenApiGroupVersion(String, String),
}

/// Resolves a path against the resource types; anything else is kube-apiserver's 404.
pub(crate) fn route(registry: &Registry, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(Route::Version),
        ["metrics"] => return Ok(Route::Metrics),
        ["debug", "faults"] => return Ok(Route::Faults),
        ["healthz" | "readyz" | "livez", ..] => return Ok(Route::Health),
        ["openapi", "v3"] => return Ok(Route::OpenApiRoot),
        ["openapi", "v3", "api", v] => {
            return Ok(Route::OpenApiGroupVersion(String::new(), v.to_string()));
        }
        ["openapi", "v3", "apis", g, v] => {
            return Ok(Route::OpenApiGroupVersion(g.to_string(), v.to_string()));
        }
        ["api"] => return Ok(Route::ApiVersions),
        ["apis"] => return Ok(Route::ApiGroups),
        ["api", v] => return Ok(Route::Resources(String::new(), v.to_string())),
        ["apis", g, v] => return Ok(Route::Resources(g.to_string(), v.to_string())),
        ["api", v, rest @ ..] => (String::new(), v.to_string(), rest.to_vec()),
        ["apis", g, v, rest @ ..] => (g.to_string(), v.to_string(), rest.to_vec()),
        _ => return Err(ApiError::no_route(path)),
    };
    let find = |plural: &str| {
        registry
            .find(&group, &version, plural)
            .ok_or_else(|| ApiError::no_route(path))
    };
    let target = match rest.as_slice() {
        ["namespaces", ns, plural, tail @ ..] if *plural != "status" && *plural != "finalize" => {
            let rt = find(plural)?;
            if !rt.namespaced {
                return Err(ApiError::no_route(path));
            }
            let (name, sub) = match tail {
                [] => (None, None),
                [n] => (Some(n.to_string()), None),
                [n, s] => (Some(n.to_string()), Some(s.to_string())),
                _ => return Err(ApiError::no_route(path)),
            };
            Target {
                rt,
                namespace: Some(ns.to_string()),
                name,
                subresource: sub,
            }
        }
        [plural, tail @ ..] => {
            let rt = find(plural)?;
            let (name, sub) = match tail {
                [] => (None, None),
                [n] if !rt.namespaced => (Some(n.to_string()), None),
                [n, s] if !rt.namespaced => (Some(n.to_string()), Some(s.to_string())),
                _ => return Err(ApiError::no_route(path)),
            };
            Target {
                rt,
                namespace: None,
                name,
                subresource: sub,
            }
        }
        _ => return Err(ApiError::no_route(path)),
    };
    if let Some(sub) = &target.subresource
        && !(sub == "status" && target.rt.status)
        && !(sub == "binding" && target.rt.group.is_empty() && target.rt.plural == "pods")
        && !(sub == "token" && target.rt.group.is_empty() && target.rt.plural == "serviceaccounts")
        && !(sub == "scale" && target.rt.scale.is_some())
        && !(sub == "finalize" && target.rt.group.is_empty() && target.rt.plural == "namespaces")
    {
        return Err(ApiError::no_route(path));
    }
    Ok(Route::Object(Box::new(target)))
}

/// The verb a request counts as in metrics (kube-apiserver's names).
pub(crate) fn verb_of(method: &Method, named: bool, watch: bool) -> &'static str {
    match (method.as_str(), named) {
        ("GET", true) => "GET",
        ("GET", false) if watch => "WATCH",
        ("GET", false) => "LIST",
        ("POST", _) => "CREATE",
        ("PUT", _) => "UPDATE",
        ("PATCH", _) => "PATCH",
        ("DELETE", true) => "DELETE",
        ("DELETE", false) => "DELETECOLLECTION",
        _ => "",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn describe(path: &str) -> String {
        match route(&Registry::default(), path) {
            Ok(Route::Object(t)) => format!(
                "{}/{} ns={:?} name={:?} sub={:?}",
                t.rt.group, t.rt.plural, t.namespace, t.name, t.subresource
            ),
            Ok(Route::Resources(g, v)) => format!("resources {g}/{v}"),
            Ok(Route::OpenApiGroupVersion(g, v)) => format!("openapi {g}/{v}"),
            Ok(Route::Version) => "version".into(),
            Ok(Route::ApiVersions) => "api".into(),
            Ok(Route::ApiGroups) => "apis".into(),
            Ok(Route::Metrics) => "metrics".into(),
            Ok(Route::Health) => "health".into(),
            Ok(Route::Faults) => "faults".into(),
            Ok(Route::OpenApiRoot) => "openapi".into(),
            Err(e) => format!("{} {}", e.code, e.reason),
        }
    }

    #[test]
    fn a_parameter_given_twice_reads_as_its_first_value_and_lists_keep_every_value() {
        let query = Query::parse(Some("limit=1&limit=abc&dryRun=All&dryRun=Bogus&watch"));
        assert_eq!(query.get("limit"), Some("1"));
        assert_eq!(query.all("dryRun"), ["All", "Bogus"]);
        assert_eq!(query.get("watch"), Some(""));
        assert!(query.all("fieldManager").is_empty());
        assert_eq!(query.get("fieldManager"), None);
    }

    #[test]
    fn paths_resolve_as_kube_apiserver_resolves_them() {
        let cases = [
            (
                "/api/v1/namespaces/default/persistentvolumeclaims",
                "/persistentvolumeclaims ns=Some(\"default\") name=None sub=None",
            ),
            (
                "/api/v1/namespaces/default/persistentvolumeclaims/c/status",
                "/persistentvolumeclaims ns=Some(\"default\") name=Some(\"c\") sub=Some(\"status\")",
            ),
            (
                "/api/v1/persistentvolumeclaims",
                "/persistentvolumeclaims ns=None name=None sub=None",
            ),
            (
                "/api/v1/persistentvolumes/pv1",
                "/persistentvolumes ns=None name=Some(\"pv1\") sub=None",
            ),
            (
                "/api/v1/namespaces/team",
                "/namespaces ns=None name=Some(\"team\") sub=None",
            ),
            (
                "/apis/storage.k8s.io/v1/storageclasses/fast",
                "storage.k8s.io/storageclasses ns=None name=Some(\"fast\") sub=None",
            ),
            (
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l",
                "coordination.k8s.io/leases ns=Some(\"kube-system\") name=Some(\"l\") sub=None",
            ),
            ("/apis/storage.k8s.io/v1", "resources storage.k8s.io/v1"),
            ("/openapi/v3/apis/apps/v1", "openapi apps/v1"),
            ("/readyz/ping", "health"),
            ("/api", "api"),
            ("/apis/", "apis"),
            // A namespaced resource by name without a namespace, a cluster resource in one,
            // a subresource that does not exist, an unknown resource: 404.
            ("/api/v1/persistentvolumeclaims/c", "404 NotFound"),
            (
                "/api/v1/namespaces/default/persistentvolumes/pv1",
                "404 NotFound",
            ),
            (
                "/apis/storage.k8s.io/v1/storageclasses/fast/status",
                "404 NotFound",
            ),
            ("/api/v1/namespaces/default/widgets", "404 NotFound"),
            ("/nonsense", "404 NotFound"),
        ];
        for (path, expected) in cases {
            assert_eq!(describe(path), expected, "{path}");
        }
    }

    #[test]
    fn verbs_and_queries() {
        let cases = [
            (Method::GET, true, false, "GET"),
            (Method::GET, false, false, "LIST"),
            (Method::GET, false, true, "WATCH"),
            (Method::POST, false, false, "CREATE"),
            (Method::PUT, true, false, "UPDATE"),
            (Method::PATCH, true, false, "PATCH"),
            (Method::DELETE, true, false, "DELETE"),
            (Method::DELETE, false, false, "DELETECOLLECTION"),
            (Method::OPTIONS, false, false, ""),
        ];
        for (method, named, watch, verb) in cases {
            assert_eq!(
                verb_of(&method, named, watch),
                verb,
                "{method} {named} {watch}"
            );
        }
        let q = Query::parse(Some(
            "labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&bad=%zz&empty",
        ));
        assert_eq!(q.get("labelSelector"), Some("app=web,tier in (a)"));
        assert!(q.flag("watch"));
        assert_eq!(q.get("bad"), Some("%zz"));
        assert_eq!(q.get("empty"), Some(""));
        assert!(!q.flag("empty"));
    }
}
