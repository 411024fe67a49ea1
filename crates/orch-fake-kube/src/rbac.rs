//! RBAC as the API server's authorizer applies it, for the Roles a test ships
//! (`FakeKubeBuilder::role`): each request is a verb on a resource (and
//! subresource) in an API group, allowed when a rule of a bound Role (in the
//! namespace) or ClusterRole (anywhere, and for cluster-scoped resources) names
//! all three (`*` matches any), else `403 Forbidden` with the API server's words.
//!
//! Verbs from the request (Kubernetes docs, "Authorization: Determine the
//! request verb"): `GET` of an object `get`, of a collection `list` (`watch`
//! with `watch=true`), `POST` `create`, `PUT` `update`, `PATCH` `patch`,
//! `DELETE` of an object `delete`, of a collection `deletecollection`. The
//! message is the one of `k8s.io/apiserver`'s `forbidden` response writer:
//! `pods "p" is forbidden: User "U" cannot get resource "pods/log" in API group
//! "" in the namespace "ns"` (`... at the cluster scope` for nodes). Discovery
//! (`/api`, `/apis`, `/version`) is allowed, as `system:discovery` allows it.

use serde_json::Value;

use super::util::ApiError;

/// One rule of a Role or ClusterRole.
#[derive(Debug, Clone)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
}

impl Rule {
    fn from(v: &Value) -> Rule {
        let list = |k: &str| -> Vec<String> {
            v[k].as_array()
                .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                .unwrap_or_default()
        };
        Rule {
            groups: list("apiGroups"),
            resources: list("resources"),
            verbs: list("verbs"),
        }
    }

    fn allows(&self, verb: &str, group: &str, resource: &str) -> bool {
        let any = |l: &[String], x: &str| l.iter().any(|s| s == "*" || s == x);
        any(&self.verbs, verb) && any(&self.groups, group) && any(&self.resources, resource)
    }
}

/// The rules a file of Roles, ClusterRoles and their bindings grants one subject.
#[derive(Debug, Clone)]
pub(crate) struct Rbac {
    /// Rules of bound Roles, with the namespace of their binding.
    namespaced: Vec<(String, Rule)>,
    /// Rules of ClusterRoles bound by a ClusterRoleBinding: every request.
    cluster: Vec<Rule>,
    /// The subject, as the API server names it (`system:serviceaccount:NS:NAME`).
    pub user: String,
}

/// A request as the authorizer sees it.
pub(crate) struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    /// `pods`, or `pods/log`.
    pub resource: String,
    pub name: &'a str,
    /// `None`: cluster scope.
    pub namespace: Option<&'a str>,
}

impl Rbac {
    /// Parse YAML documents (`kind: Role`, `RoleBinding`, `ClusterRole`,
    /// `ClusterRoleBinding`; others are ignored). A Role counts when a
    /// RoleBinding names it, a ClusterRole when a ClusterRoleBinding (or a
    /// RoleBinding, then namespaced only) does.
    pub fn parse(text: &str) -> Result<Rbac, String> {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
        let docs: Vec<Value> = docs.into_iter().filter(|d| d.is_object()).collect();
        let kind = |d: &Value| d["kind"].as_str().unwrap_or_default().to_string();
        let name = |d: &Value| d["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let rules = |d: &Value| -> Vec<Rule> {
            d["rules"]
                .as_array()
                .map(|a| a.iter().map(Rule::from).collect())
                .unwrap_or_default()
        };
        let mut rbac = Rbac {
            namespaced: Vec::new(),
            cluster: Vec::new(),
            user: String::new(),
        };
        for b in docs.iter().filter(|d| kind(d).ends_with("Binding")) {
            let ref_kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
            let ref_name = b["roleRef"]["name"].as_str().unwrap_or_default();
            let Some(role) = docs.iter().find(|d| kind(d) == ref_kind && name(d) == ref_name) else {
                continue;
            };
            if kind(b) == "ClusterRoleBinding" {
                rbac.cluster.extend(rules(role));
            } else {
                // A RoleBinding grants in its own namespace only.
                let ns = b["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_string();
                rbac.namespaced
                    .extend(rules(role).into_iter().map(|r| (ns.clone(), r)));
            }
            if rbac.user.is_empty() {
                if let Some(s) = b["subjects"].as_array().and_then(|s| s.first()) {
                    let n = s["name"].as_str().unwrap_or_default();
                    rbac.user = match s["kind"].as_str() {
                        Some("ServiceAccount") => format!(
                            "system:serviceaccount:{}:{n}",
                            s["namespace"]
                                .as_str()
                                .or(b["metadata"]["namespace"].as_str())
                                .unwrap_or("default")
                        ),
                        _ => n.to_string(),
                    };
                }
            }
        }
        if rbac.namespaced.is_empty() && rbac.cluster.is_empty() {
            return Err("no Role or ClusterRole is bound by a RoleBinding or ClusterRoleBinding".into());
        }
        if rbac.user.is_empty() {
            rbac.user = "fake".into();
        }
        Ok(rbac)
    }

    /// Allowed, or the API server's `403 Forbidden`.
    pub fn authorize(&self, a: &Attributes<'_>) -> Result<(), ApiError> {
        let allowed =
            self.cluster
                .iter()
                .any(|r| r.allows(a.verb, a.group, &a.resource))
                || self.namespaced.iter().any(|(ns, r)| {
                    a.namespace == Some(ns.as_str()) && r.allows(a.verb, a.group, &a.resource)
                });
        if allowed {
            return Ok(());
        }
        let base = a.resource.split('/').next().unwrap_or_default();
        let qualified = if a.group.is_empty() {
            base.to_string()
        } else {
            format!("{base}.{}", a.group)
        };
        let scope = match a.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let why = format!(
            "User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            self.user, a.verb, a.resource, a.group
        );
        let message = if a.name.is_empty() {
            format!("{qualified} is forbidden: {why}")
        } else {
            format!("{qualified} \"{}\" is forbidden: {why}", a.name)
        };
        let mut e = ApiError::new(403, "Forbidden", message);
        e.details = Some(serde_json::json!({"name": a.name, "group": a.group, "kind": base}));
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLE: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: r, namespace: bench}
rules:
- apiGroups: [\"\"]
  resources: [pods]
  verbs: [get, list]
- apiGroups: [batch]
  resources: [\"*\"]
  verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: rb, namespace: bench}
subjects: [{kind: ServiceAccount, name: orch, namespace: bench}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}
";

    fn at<'a>(
        verb: &'a str,
        group: &'a str,
        resource: &str,
        name: &'a str,
        ns: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            group,
            resource: resource.into(),
            name,
            namespace: ns,
        }
    }

    #[test]
    fn rules_grant_verbs_on_resources_and_the_rest_is_forbidden_in_the_api_servers_words() {
        let r = Rbac::parse(ROLE).unwrap();
        assert!(r.authorize(&at("get", "", "pods", "p", Some("bench"))).is_ok());
        assert!(r
            .authorize(&at("create", "batch", "jobs", "", Some("bench")))
            .is_ok());
        let e = r
            .authorize(&at("get", "", "pods/log", "p", Some("bench")))
            .unwrap_err();
        assert_eq!((e.code, e.reason), (403, "Forbidden"));
        assert_eq!(
            e.message,
            "pods \"p\" is forbidden: User \"system:serviceaccount:bench:orch\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"bench\""
        );
        let e = r.authorize(&at("list", "", "nodes", "", None)).unwrap_err();
        assert!(e
            .message
            .ends_with("cannot list resource \"nodes\" in API group \"\" at the cluster scope"));
        assert!(e.message.starts_with("nodes is forbidden: "));
        assert!(r
            .authorize(&at("delete", "batch", "jobs", "j", Some("bench")))
            .is_err());
        assert!(
            Rbac::parse("kind: Role\nmetadata: {name: x}\nrules: []\n").is_err(),
            "an unbound Role grants nothing"
        );
    }
}
